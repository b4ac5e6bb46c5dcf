"""The main job, ``grove train CONFIG.yaml``, and its parts.

Where the training loop is: ``job.py`` runs it (``_Loop.run``: each step's rollouts, played by an
in-process harness or awaited from external agents, then the optimizer step, the new weights
published to the engine, the metrics logged); ``training_run.py`` is one step
(``TrainingRun.train``: kept groups, advantages, the step on every data-parallel rank, the
checkpoint); the step's arithmetic is the library's ``grove.training.trainer.Trainer.train_step``.
The rest: each step's batch (``step_batches.py``, ``rollouts.py``), harnesses and tasks,
``preflight.py``, progress, the metrics log and the run's files, ``distributed.py`` (torchrun).
"""
