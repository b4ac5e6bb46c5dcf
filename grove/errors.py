"""Grove's error tree across the layers, and how the command line reports each error.

::

    grove_errors.GroveError                 the one root (``except GroveError`` catches them all)
    ├── grove.ledger.errors.LedgerError           the event ledger, admission, the attempt lifecycle
    │   └── grove.ledger.database.UnsupportedDatabaseURL, DatabaseError (unknown database errors)
    ├── grove.storage.errors.StorageError         object storage: keys, codec, integrity
    ├── grove.capture.errors.CaptureError         normalization, rendering, splice, engines
    ├── grove.training.errors.TrainingError       selection, forest, rows, batches, checkpoints
    │   └── grove.training.selection.SelectionPolicyFailed   a selection policy that raised
    ├── grove.config.ConfigurationError     a configuration refused whole, every problem listed
    ├── grove.errors.JobError               a job cannot run: model, harness, task file, run, export
    └── grove.client.GroveClientError       the gateway refused a request of grove.client (4xx)
        └── GatewayServerError              the gateway failed on its side (5xx)

Each layer owns its branch, so that ``ledger`` and ``storage`` stay independent of each other and
of everything above them; the root sits below them all in ``grove_errors``, which imports
nothing. This module is the one place that names every branch.

The command line prints any of them as one ``error: …`` line, without a trace, and exits with
:func:`exit_status`: 75 (``EX_TEMPFAIL`` of ``sysexits.h``) when a service Grove needs did not
answer or failed on its side — the ledger database, the blob store, the inference server, the
gateway (a 5xx) — so the same command may succeed later unchanged; 2 for a usage error (an
unknown option, a missing argument, a database URL Grove does not support, an empty
``GROVE_AUTH_TOKEN``); 1 for every other error, which needs a change (input, configuration,
data) before running again. ``grove serve`` stopped by SIGTERM exits 143 (docs/reliability.md,
"Errors and exit statuses").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from grove.capture.errors import CaptureError
from grove.config import ConfigurationError
from grove.ledger.errors import LedgerError
from grove.storage.errors import StorageError
from grove.training.errors import TrainingError
from grove_errors import GroveError

__all__ = [
    "EXIT_ERROR",
    "EXIT_STATUS",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "GROVE_ERRORS",
    "GroveError",
    "JobError",
    "exit_status",
]


class JobError(GroveError):
    """A command of the application cannot do its job: a model that does not load, a harness
    that fails, a malformed task file, an unknown run, an export refused."""


GROVE_ERRORS: tuple[type[GroveError], ...] = (
    LedgerError,
    StorageError,
    CaptureError,
    TrainingError,
    ConfigurationError,
    JobError,
)
"""The roots of the branches, one per layer (every one a ``GroveError``)."""

EXIT_ERROR: Final = 1
"""The exit status of a Grove error that needs a change before the command can succeed."""

EXIT_UNAVAILABLE: Final = 75
"""The exit status when a service did not answer: try the same command again later."""

EXIT_USAGE: Final = 2
"""The exit status of a usage error: the command line names something Grove does not take."""

EXIT_STATUS: Final[Mapping[str, int]] = {
    "grove_errors.GroveError": EXIT_ERROR,
    "grove.ledger.errors.DatabaseUnavailable": EXIT_UNAVAILABLE,
    "grove.storage.errors.StorageUnavailableError": EXIT_UNAVAILABLE,
    "grove.capture.vllm.EngineUnavailableError": EXIT_UNAVAILABLE,
    "grove.client.GatewayServerError": EXIT_UNAVAILABLE,
    "grove.ledger.database.UnsupportedDatabaseURL": EXIT_USAGE,
}
"""Exit statuses by error class (``module.Class``; a class not listed takes its closest listed
base's). Named rather than imported, so that the command line starts without loading the
engines: an error of a module that was never imported cannot be raised."""


def exit_status(error: GroveError) -> int:
    """The command line's exit status for ``error``: its closest class in :data:`EXIT_STATUS`."""
    for cls in type(error).__mro__:
        status = EXIT_STATUS.get(f"{cls.__module__}.{cls.__qualname__}")
        if status is not None:
            return status
    raise TypeError(f"{type(error).__name__} is not a GroveError; only Grove's errors have one")
