"""An agent's attempt as the ledger recorded it, and the result its harness posts.

``open_attempt`` opens a fresh attempt on the gateway; ``Played`` is what a test module's agent
run leaves behind: the calls as ``GET /v1/attempts/{key}`` lists them, the ``call.committed``
events of the attempt's stream, the selection the posted result recorded, and what
``grove replay --verify`` finds when it re-runs every recorded decision
(``grove.tools.replay.replay`` with the blob store, as the command calls it).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from grove.ledger.events import CallCommitted
from grove.tools.replay import replay
from tests.integration.gateway.support import Gateway

_numbers = itertools.count()


def open_attempt(gateway: Gateway, name: str) -> str:
    """Open a new attempt named after ``name`` (unique in the process) and return its key."""
    key = f"{name}-{next(_numbers)}"
    gateway.open(key)
    return key


@dataclass(frozen=True)
class Link:
    """How admission placed one call: ``decision`` (``root`` or ``continuation``), the parent of a
    continuation, the reason of a root."""

    decision: str
    parent_call_id: str | None
    root_reason: str | None


@dataclass(frozen=True)
class Played:
    """One attempt after its harness posted the result (``finish``)."""

    capture_key: str
    call_ids: list[str]
    """Every call, in intent order (``GET /v1/attempts/{key}``)."""
    statuses: list[str]
    links: list[Link]
    committed: list[str]
    """The call id of each ``call.committed`` event in the stream, in order."""
    selection: list[str]
    """The selection recorded from the posted result."""
    replay_checks: list[tuple[str, str, str]]
    """``grove replay --verify``: (decision, subject, outcome) of each recorded decision it re-ran
    (outcome ``same``, ``differs`` or ``skipped``)."""


def finish(gateway: Gateway, capture_key: str, result: dict[str, Any]) -> Played:
    """Post the harness's result and read back everything the ledger recorded for the attempt."""
    answer = gateway.http.post(f"/v1/attempts/{capture_key}/result", json=result)
    assert answer.status_code == 200, answer.text
    calls = gateway.status(capture_key)["calls"]
    store = gateway.service.log.store
    checks = replay(store, capture_key, blobs=gateway.service.blobs).checks
    assert checks is not None
    return Played(
        capture_key=capture_key,
        call_ids=[c["call_id"] for c in calls],
        statuses=[c["status"] for c in calls],
        links=[Link(c["decision"], c["parent_call_id"], c["root_reason"]) for c in calls],
        committed=[
            stored.decode().call_id
            for stored in store.read_stream(capture_key)
            if stored.event_type == CallCommitted.type
        ],
        selection=list(answer.json()["selection"]["call_ids"]),
        replay_checks=[(c.decision, c.subject, c.outcome.value) for c in checks],
    )


def verified(played: Played) -> list[tuple[str, str, str]]:
    """The checks of an attempt whose every decision re-runs alike: each call's admission, then
    the selection; nothing was finalized or published, so nothing more."""
    return [
        *(("admission", call_id, "same") for call_id in played.call_ids),
        ("selection", played.capture_key, "same"),
    ]


def chain(call_ids: list[str]) -> list[Link]:
    """The links of calls that each continue the one before: a root, then continuations."""
    return [
        Link("root", None, "first_call"),
        *(Link("continuation", parent, None) for parent in call_ids[:-1]),
    ]
