"""Upcasters: read old payload versions as the current model, never rewriting stored events.

An upcaster turns the JSON payload of ``(event type, version v)`` into version ``v + 1``; reading
applies them in a chain up to the catalog's current version. Registering one is the only way to
bump an event's ``schema_version`` (``test_upcasting.py`` checks every gap is covered).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from grove.ledger.errors import InvalidEventPayload
from grove.ledger.events import Event, event_class, validate_payload

__all__ = ["UPCASTERS", "Upcaster", "decode_as", "decode_payload", "upcast", "upcaster"]

Payload = dict[str, Any]
Upcaster = Callable[[Payload], Payload]

UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def upcaster(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register ``fn`` as the upcaster of ``event_type`` from ``from_version`` to the next."""

    def register(fn: Upcaster) -> Upcaster:
        key = (event_type, from_version)
        if key in UPCASTERS:
            raise RuntimeError(f"upcaster for {event_type} v{from_version} registered twice")
        UPCASTERS[key] = fn
        return fn

    return register


def upcast(event_type: str, schema_version: int, payload: Payload) -> Payload:
    """The payload carried from ``schema_version`` to the catalog's current version."""
    current = event_class(event_type).schema_version
    if schema_version > current:
        raise InvalidEventPayload(
            event_type,
            schema_version,
            f"written by a newer Grove (this one reads up to version {current}); upgrade Grove",
        )
    version = schema_version
    while version < current:
        step = UPCASTERS.get((event_type, version))
        if step is None:
            raise InvalidEventPayload(
                event_type, version, f"no upcaster from version {version} to {version + 1}"
            )
        payload = step(dict(payload))
        version += 1
    return payload


def decode_payload(event_type: str, schema_version: int, payload: Payload) -> Event:
    """The stored payload as the current event model."""
    return validate_payload(event_type, upcast(event_type, schema_version, payload))


E = TypeVar("E", bound=Event)


def decode_as(kind: type[E], event_type: str, schema_version: int, payload: Payload) -> E:
    """The stored payload as the event model ``kind``; ``InvalidEventPayload`` when the stored
    event is of another type (a reader that filtered by type and got something else)."""
    event = decode_payload(event_type, schema_version, payload)
    if not isinstance(event, kind):
        raise InvalidEventPayload(
            event_type, schema_version, f"expected a {kind.__name__} event here"
        )
    return event


@upcaster("attempt.opened", from_version=1)
def _attempt_opened_v1(payload: Payload) -> Payload:
    # Version 1 predates forest training: its attempts ran without forest mode, and their
    # selection was the harness's returned history (the only policy then).
    payload.setdefault("forest_mode", False)
    payload.setdefault("selection_policy", "returned_history")
    return payload
