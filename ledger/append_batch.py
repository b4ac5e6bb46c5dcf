"""One append's events, and their rows prepared as a backend writes them.

An append names its events up front (their ids, types and order) but validates and serialises
them only when the backend asks for their rows (``AppendBatch.rows``), a part at a time. A backend
that streams its insert (``COPY`` on PostgreSQL, ``ledger/postgres.py``) prepares each part while
the server writes the one before; the others ask for every row at once. Each part is validated as
it will be stored before any of it is sent, so a model built with ``model_construct`` cannot slip
past, and an invalid event fails the append before its transaction commits: nothing is written.
Every error of validation comes before any other error of the append (``ledger/store.py``).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from grove.ledger.errors import EventIdConflict, InvalidEventPayload
from grove.ledger.events import Event, event_class, validate_payload

__all__ = ["AppendBatch", "AppendedRow", "Landed", "Meanwhile", "new_event_id"]


def new_event_id() -> str:
    """A fresh event id: 128 random bits as 32 hex digits (a fifth of ``uuid4().hex``'s cost,
    which a batched append pays per event)."""
    return os.urandom(16).hex()


class AppendedRow(NamedTuple):
    """An event ready to append: its id, the event, and its payload as compact JSON text."""

    event_id: str
    event: Event
    payload: str


@functools.cache
def _batch_validator(cls: type[Event]) -> TypeAdapter[list[Event]]:
    return TypeAdapter(list[cls])  # type: ignore[valid-type]


def _validate_json(cls: type[Event], payloads: Sequence[str]) -> None:
    """Validate payload JSON texts against ``cls`` (one call for a whole part; a failure is
    reported for the first invalid payload, with the field-level detail)."""
    try:
        if len(payloads) == 1:
            cls.model_validate_json(payloads[0])
        else:
            _batch_validator(cls).validate_json("[" + ",".join(payloads) + "]")
        return
    except ValidationError:
        pass
    for payload in payloads:
        try:
            cls.model_validate_json(payload)
        except ValidationError as error:
            validate_payload(cls.type, json.loads(payload))  # raises with the field-level detail
            raise InvalidEventPayload(cls.type, cls.schema_version, str(error)) from None


def _payload_json(event: Event) -> str:
    """``event``'s payload as JSON text; a value JSON cannot hold (a lone UTF-16 surrogate in a
    string) is an invalid payload, refused like any other."""
    try:
        return event.model_dump_json()
    except PydanticSerializationError as error:
        raise InvalidEventPayload(event.type, event.schema_version, str(error)) from None


def _prepared(ids: Sequence[str], events: Sequence[Event]) -> list[AppendedRow]:
    """The rows of ``events``, validated: one validation call per event type."""
    payloads = [_payload_json(event) for event in events]
    by_type: dict[str, list[str]] = {}
    for event, payload in zip(events, payloads, strict=True):
        by_type.setdefault(event.type, []).append(payload)
    for event_type, texts in by_type.items():
        _validate_json(event_class(event_type), texts)
    return list(map(AppendedRow, ids, events, payloads))


class AppendBatch:
    """The events of one append to ``stream_id``, in order, with their ids (fresh ones drawn at
    once for events given without one); their rows are prepared on request and kept."""

    def __init__(self, stream_id: str, items: Sequence[Event | tuple[Event, str]]) -> None:
        fresh = os.urandom(16 * len(items)).hex()
        self.stream_id = stream_id
        self.events: list[Event] = []
        self.event_ids: list[str] = []
        for i, item in enumerate(items):
            event, event_id = item if isinstance(item, tuple) else (item, None)
            if not isinstance(event, Event):
                raise TypeError(f"expected a ledger event model, got {type(event).__name__}")
            self.events.append(event)
            self.event_ids.append(fresh[32 * i : 32 * i + 32] if event_id is None else event_id)
        self._rows: list[AppendedRow] = []

    def __len__(self) -> int:
        return len(self.events)

    def rows(self, start: int = 0, stop: int | None = None) -> list[AppendedRow]:
        """The rows of events ``start`` to ``stop`` (all by default), validated; raises
        ``InvalidEventPayload`` for the first invalid one among those not prepared yet."""
        stop = len(self.events) if stop is None else stop
        done = len(self._rows)
        if stop > done:
            self._rows += _prepared(self.event_ids[done:stop], self.events[done:stop])
        return self._rows[start:stop]

    def check_ids(self) -> None:
        """Raise ``EventIdConflict`` when an id appears twice (after validating every event:
        an invalid event is reported first)."""
        if len(set(self.event_ids)) != len(self.event_ids):
            self.rows()
            twice = next(i for i in self.event_ids if self.event_ids.count(i) > 1)
            raise EventIdConflict(twice, "event in the same append (an id appears twice)")


class Landed(NamedTuple):
    """Where one appended event landed."""

    position: int
    event_id: str
    stream_version: int


Meanwhile = Callable[[Sequence[Landed]], object]
"""Work with no statements that the store gives a ``COPY`` append to do while the server
writes the rows (the inline fold's staging, ``ledger/inline_fold.py``)."""
