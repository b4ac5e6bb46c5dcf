"""Grove's error tree, across the layers; the command line reports any of these without a trace.

::

    ledger.errors.LedgerError       the event ledger (see ledger/errors.py for its tree)
    storage.errors.StorageError     object storage (see storage/errors.py)

Each layer owns its root so that ``ledger`` and ``storage`` stay independent of each other and of
everything above them; this module is the one place that names them all.
"""

from __future__ import annotations

from ledger.errors import LedgerError

__all__ = ["GROVE_ERRORS"]

GROVE_ERRORS: tuple[type[Exception], ...] = (LedgerError,)
