"""Leases on named pieces of work, held in PostgreSQL as session-level advisory locks.

A lease on a name (a prompt group) is ``pg_try_advisory_lock`` on a 64-bit key drawn from the
name's SHA-256, taken on one connection that the holder keeps open for as long as it works: the
server grants each key to one session at a time, the holder gives it back with
``pg_advisory_unlock``, and when the holder dies — SIGKILL included — its connection closes and
the server releases every lease it held, so another holder takes the work over without waiting
for a timeout. Nothing is written: a lease leaves no row behind and needs no migration.

The lease connection names its holder in ``application_name`` (``Leases.holder``), so an
operator sees who holds what::

    SELECT a.application_name, l.classid, l.objid
    FROM pg_locks l JOIN pg_stat_activity a USING (pid)
    WHERE l.locktype = 'advisory';

``lease_key(name)`` is the lock's key; PostgreSQL shows a 64-bit key as ``classid`` (its high 32
bits) and ``objid`` (its low 32 bits). Two names share a key with a probability of about
``2**-64`` per pair; a collision only makes the two names' work wait for one holder.

SQLite has no such locks (and one writer): ``Leases.open`` refuses it with ``LeaseError``.
"""

from __future__ import annotations

import hashlib
from typing import Final

from sqlalchemy import BigInteger, Connection, Engine, bindparam, func, select, text

from grove.ledger.database import dialect_of, translate_errors
from grove.ledger.errors import LedgerError

__all__ = ["LEASE_NAMESPACE", "LeaseError", "Leases", "lease_key"]

LEASE_NAMESPACE: Final = "grove-lease"
"""Prefix hashed with every name, so Grove's keys stay apart from other advisory-lock users'."""


class LeaseError(LedgerError):
    """A lease cannot be held here (not PostgreSQL), or its connection was lost."""

    def __init__(self, holder: str, rule: str) -> None:
        self.holder = holder
        super().__init__(f"{rule} (lease holder {holder!r})")


def lease_key(name: str) -> int:
    """The advisory-lock key of ``name``: the first 8 bytes of SHA-256 of the namespaced name,
    as a signed 64-bit integer (PostgreSQL's ``bigint``)."""
    digest = hashlib.sha256(f"{LEASE_NAMESPACE}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


_KEY = bindparam("key", type_=BigInteger)
_TAKE = select(func.pg_try_advisory_lock(_KEY))
_GIVE_BACK = select(func.pg_advisory_unlock(_KEY))


class Leases:
    """The leases one holder takes on one dedicated connection (not shared between threads)."""

    def __init__(self, connection: Connection, holder: str, url: str) -> None:
        self._conn = connection
        self.holder = holder
        self._url = url
        self._held: set[str] = set()

    @classmethod
    def open(cls, engine: Engine, holder: str) -> Leases:
        """A lease connection on ``engine``'s PostgreSQL, named ``holder`` (its
        ``application_name``); ``LeaseError`` on any other database."""
        url = engine.url.render_as_string(hide_password=True)
        if dialect_of(engine) != "postgresql":
            raise LeaseError(
                holder,
                f"leases are PostgreSQL advisory locks; the ledger at {url} is not PostgreSQL: "
                "run projector shards on a PostgreSQL ledger, or one projector on SQLite",
            )
        with translate_errors(url):
            connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            connection.execute(
                text("SELECT set_config('application_name', :name, false)"),
                {"name": holder[:63]},
            )
        return cls(connection, holder, url)

    @property
    def held(self) -> frozenset[str]:
        """The names this holder leases now."""
        return frozenset(self._held)

    def take(self, name: str) -> bool:
        """Lease ``name`` unless another session holds it; True when this holder holds it now."""
        if name in self._held:
            return True
        with translate_errors(self._url):
            taken = bool(self._conn.execute(_TAKE, {"key": lease_key(name)}).scalar_one())
        if taken:
            self._held.add(name)
        return taken

    def give_back(self, name: str) -> None:
        """Release the lease on ``name`` (a name not held is ignored)."""
        if name not in self._held:
            return
        with translate_errors(self._url):
            released = self._conn.execute(_GIVE_BACK, {"key": lease_key(name)}).scalar_one()
        self._held.discard(name)
        if not released:
            raise LeaseError(
                self.holder,
                f"the lease on {name!r} was no longer held by this session (its connection was "
                "lost and the server released it): another holder may have taken its work over",
            )

    def close(self) -> None:
        """Release every lease by closing the connection."""
        self._held.clear()
        self._conn.close()
