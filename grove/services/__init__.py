"""The long-running services beside a training run: ``grove serve``, the capture gateway
(``serve.py``), and ``grove project``, one projector shard (``project.py``)."""
