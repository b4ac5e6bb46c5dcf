"""The main job, ``grove train CONFIG.yaml`` (``grove/train/job.py``), and its parts: the training
run (``training_run.py``), each step's batch (``step_batches.py``, ``rollouts.py``), in-process
harnesses and tasks, progress, the metrics log and the run's files."""
