"""The root of Grove's error tree, at the bottom of the dependency graph.

Every layer's errors descend from :class:`GroveError`, so ``except GroveError`` catches anything
Grove raises on purpose, and only that. The root lives in this package of its own, which imports
nothing, because the layers cannot share any other home: ``ledger`` and ``storage`` import
neither each other nor anything above them, and ``grove`` (the application) imports them all.
``grove.errors`` re-exports the root for the application and its users.
"""

from __future__ import annotations

__all__ = ["GroveError"]


class GroveError(Exception):
    """Root of every error Grove raises; each layer owns the branch below its own root.

    ::

        GroveError
        ├── grove.ledger.errors.LedgerError        the ledger, admission, the attempt lifecycle
        ├── grove.storage.errors.StorageError      object storage: keys, codec, integrity
        ├── grove.capture.errors.CaptureError      normalization, rendering, splice, engines
        │   └── EngineError                        (grove.capture.vllm: the vLLM server's)
        ├── grove.training.errors.TrainingError    selection, forest, rows, batches, checkpoints
        ├── grove.config.ConfigurationError        a configuration refused, every problem listed
        ├── grove.errors.JobError                  a job cannot run: model, harness, run, export
        └── grove.client.GroveClientError          the gateway refused a request (4xx, or 5xx:
                                                   GatewayServerError)

    Each root's module draws its own branch. The command line prints any of them as one line
    and exits with the status ``grove.errors.exit_status`` gives it; the gateway answers each
    with the HTTP status of ``grove.capture.wire.ERROR_STATUS``.
    """
