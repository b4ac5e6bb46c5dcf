"""The ledger's errors, one tree, translated from database errors in one place (``database.py``).

::

    LedgerError
    ├── EventValidationError          a payload or type the catalog does not accept
    │   ├── UnknownEventType
    │   └── InvalidEventPayload
    ├── StreamIdError                 a stream id outside the documented alphabet
    ├── WrongExpectedVersion          optimistic concurrency: the stream moved on
    ├── EventIdConflict               an event id reused with a different payload
    ├── ImportConflict                a bulk import colliding with recorded events
    ├── AppendOnlyViolation           UPDATE, DELETE or TRUNCATE on the event table
    ├── SchemaNotReady                the database has no (or an old) ledger schema
    │   └── SchemaOutOfDate           checked on open: absent, behind or ahead of this Grove
    ├── PrivilegeRefused              the database role lacks a privilege (docs/ledger.md)
    ├── DatabaseUnavailable           the database cannot be reached
    ├── AttemptError                  an attempt lifecycle rule (``attempt.py``)
    └── AdmissionError                a request that cannot be admitted (``admission.py``)
        ├── EmptyRequestError
        ├── AssistantPrefillError
        ├── EmptySuffixError
        └── AmbiguousParentError

Every message states the rule, then the identifiers and got-versus-expected values, which are also
kept as attributes.
"""

from __future__ import annotations

from grove_errors import GroveError

__all__ = [
    "AppendOnlyViolation",
    "DatabaseUnavailable",
    "EventIdConflict",
    "EventValidationError",
    "ImportConflict",
    "InvalidEventPayload",
    "LedgerError",
    "PrivilegeRefused",
    "SchemaNotReady",
    "SchemaOutOfDate",
    "StreamIdError",
    "UnknownEventType",
    "WrongExpectedVersion",
]


class LedgerError(GroveError):
    """Root of every error the ledger raises; a branch of Grove's one tree (``GroveError``)."""


class EventValidationError(LedgerError, ValueError):
    """An event the catalog does not accept; nothing was written."""


class UnknownEventType(EventValidationError):
    """The event type is not in the catalog."""

    def __init__(self, event_type: str, known: list[str]) -> None:
        self.event_type = event_type
        super().__init__(
            f"Unknown event type: {event_type!r} is not in the catalog "
            f"(known types: {', '.join(sorted(known))}); see docs/events.md"
        )


class InvalidEventPayload(EventValidationError):
    """The payload does not validate against its event model."""

    def __init__(self, event_type: str, schema_version: int, detail: str) -> None:
        self.event_type = event_type
        self.schema_version = schema_version
        self.detail = detail
        super().__init__(
            f"Invalid payload for event {event_type!r} (schema version {schema_version}): {detail}"
        )


class StreamIdError(LedgerError, ValueError):
    """A stream id outside the documented alphabet."""

    def __init__(self, stream_id: object, rule: str) -> None:
        self.stream_id = stream_id
        super().__init__(f"Invalid stream id {stream_id!r}: {rule}")


class WrongExpectedVersion(LedgerError):
    """Optimistic concurrency: the stream's version is not the one the writer expected."""

    def __init__(self, stream_id: str, expected: int, actual: int) -> None:
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"Wrong expected version: {expected} (Stream: {stream_id}, Stream Version: {actual}); "
            "re-read the stream and decide again"
        )


class EventIdConflict(LedgerError):
    """An event id that already exists with a different stream, type or payload."""

    def __init__(self, event_id: str, detail: str) -> None:
        self.event_id = event_id
        super().__init__(
            f"Event id {event_id} is already recorded with a different {detail}; an event id is "
            "an idempotency key and may only be retried with the identical event"
        )


class ImportConflict(LedgerError):
    """A bulk import whose event ids or stream versions are already recorded; nothing imported."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            "Import refused: an imported event's id or (stream, version) is already recorded, "
            f"so nothing was imported ({detail}); import into a fresh ledger or drop those rows"
        )


class AppendOnlyViolation(LedgerError):
    """The database refused to change recorded history."""

    def __init__(self, operation: str, detail: str = "") -> None:
        self.operation = operation
        super().__init__(
            f"The event ledger is append-only: {operation} refused"
            + (f" ({detail})" if detail else "")
        )


class SchemaNotReady(LedgerError):
    """The database lacks the ledger schema; run ``grove db upgrade``."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        super().__init__(
            f"The ledger schema is missing or out of date at {url}: {detail}. "
            "Run `grove db upgrade` (or `alembic upgrade head`)."
        )


class SchemaOutOfDate(SchemaNotReady):
    """The ledger schema is absent, behind or ahead of the revision this Grove needs; nothing was
    changed. Serving, training and the debugging tools never change a schema: the owner upgrades
    it (``grove db upgrade``)."""

    def __init__(self, url: str, current: str | None, head: str, *, known: bool = True) -> None:
        self.url = url
        self.current = current
        self.head = head
        upgrade = (
            f"run `grove db upgrade --database-url {url}` as the schema's owner, then start again"
        )
        if current is None:
            message = f"There is no ledger schema at {url} (this Grove needs revision {head}): "
            message += upgrade
        elif known:
            message = (
                f"The ledger schema at {url} is at revision {current}; this Grove needs {head}. "
                f"Grove changes a schema only when told to: {upgrade}"
            )
        else:
            message = (
                f"The ledger schema at {url} is at revision {current}, which this Grove does not "
                f"know (its newest is {head}): a newer Grove upgraded it; upgrade Grove"
            )
        LedgerError.__init__(self, message)


class PrivilegeRefused(LedgerError):
    """The database refused a statement for lack of a privilege: the role Grove connects as was
    not granted what the application role needs (docs/ledger.md, "Roles")."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        super().__init__(
            f"The ledger database at {url} refused a statement for lack of privilege ({detail}): "
            'grant the role the application privileges of docs/ledger.md, "Roles", or run '
            "schema changes (grove db upgrade) as the schema's owner"
        )


class DatabaseUnavailable(LedgerError):
    """The database cannot be reached or opened."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        super().__init__(f"Cannot reach the ledger database at {url}: {detail}")
