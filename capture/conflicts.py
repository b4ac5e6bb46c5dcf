"""What differs between a recorded event and a request that would record it again.

Opening an attempt and posting its result are idempotent: the same fields again are accepted, other
fields are refused (409, ``docs/gateway.md``). These pure functions name the fields that differ,
got versus recorded, so the refusal says what to change instead of naming an event id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from grove.ledger.events import AttemptOpened, RolloutSelected

__all__ = ["OPENED_FIELDS", "opened_differences", "selection_differences"]

OPENED_FIELDS: Final = (
    "rollout_id",
    "prompt_group",
    "rollout_index",
    "policy_version",
    "forest_mode",
    "selection_policy",
    "seed",
)
"""The fields of ``POST /v1/attempts`` that ``attempt.opened`` records (those a request or an
event lacks are not compared)."""


def opened_differences(recorded: AttemptOpened, fields: Mapping[str, Any]) -> str:
    """The opening ``fields`` that differ from the recorded ``attempt.opened`` ("" if none);
    ``fork_from`` (``{"capture_key", "call_id"}`` or None) is compared with the recorded source."""
    found = [
        (name, fields[name], getattr(recorded, name, None))
        for name in OPENED_FIELDS
        if name in fields and fields[name] != getattr(recorded, name, None)
    ]
    if "fork_from" in fields:
        asked = fields["fork_from"]
        got = None if asked is None else f"{asked['capture_key']}/{asked['call_id']}"
        source = recorded.fork_from
        had = None if source is None else f"{source.source_capture_key}/{source.source_call_id}"
        if got != had:
            found.append(("fork_from", got, had))
    return _describe(found)


def selection_differences(recorded: RolloutSelected, candidate: RolloutSelected) -> str:
    """How the selection a new result makes differs from the recorded one ("" if it does not):
    its policy, calls, terminal response or reward, else the result keys whose values differ."""
    found = [
        (name, getattr(candidate, name), getattr(recorded, name))
        for name in ("reward", "call_ids", "terminal_response_id", "policy")
        if getattr(candidate, name) != getattr(recorded, name)
    ]
    if not found and candidate.result != recorded.result:
        got, had = candidate.result or {}, recorded.result or {}
        keys = sorted(k for k in got.keys() | had.keys() if got.get(k) != had.get(k))
        return f"the result's {', '.join(repr(k) for k in keys)} differ from the recorded result"
    return _describe(found)


def _describe(differences: Any) -> str:
    return "; ".join(f"{name}: got {got!r}, recorded {had!r}" for name, got, had in differences)
