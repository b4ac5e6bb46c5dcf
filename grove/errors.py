"""Grove's error tree across the layers; the command line reports any of these without a trace.

::

    ledger.errors.LedgerError         the event ledger, admission and the attempt lifecycle
    storage.errors.StorageError       object storage: keys, codec, integrity, availability
    capture.errors.CaptureError       normalization, rendering, splice, engines
    training.errors.TrainingError     selection, forest, rows, batches, loss, checkpoints
    grove.config.ConfigurationError   a configuration refused whole, every problem listed
    grove.errors.JobError             a job cannot run: model, harness, task file, run, export

Each layer owns its root so that ``ledger`` and ``storage`` stay independent of each other and of
everything above them; this module is the one place that names them all.
"""

from __future__ import annotations

from capture.errors import CaptureError
from grove.config import ConfigurationError
from ledger.errors import LedgerError
from storage.errors import StorageError
from training.errors import TrainingError

__all__ = ["GROVE_ERRORS", "JobError"]


class JobError(Exception):
    """A command of the application cannot do its job: a model that does not load, a harness
    that fails, a malformed task file, an unknown run, an export refused."""


GROVE_ERRORS: tuple[type[Exception], ...] = (
    LedgerError,
    StorageError,
    CaptureError,
    TrainingError,
    ConfigurationError,
    JobError,
)
