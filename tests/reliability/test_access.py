"""Access: history cannot be changed, and one attempt cannot reach into another's calls.

Specified elsewhere and not repeated here:

- UPDATE, DELETE (both databases) and TRUNCATE (PostgreSQL) on the event table are refused by
  the database, and the SELECT+INSERT application role cannot change history:
  ``tests/integration/ledger/test_append_only.py``;
- with an auth token, the gateway refuses requests without it and writes nothing:
  ``tests/integration/gateway/test_auth.py``.
"""

from __future__ import annotations

import pytest

from capture.lifecycle import CaptureService, ModelCall
from ledger.attempt import AttemptError

from .rollouts import OPTIONS, SAMPLING, play


def test_an_intent_naming_another_attempts_call_as_parent_is_refused(capture: CaptureService):
    play(capture, "att-a", group="g0", index=0, turns=1, select=False)
    capture.open_attempt("att-b", rollout_id="g0-r1", prompt_group="g0", rollout_index=1)
    foreign = capture.log.load("att-a").calls["t0"].intended
    before = capture.log.store.count()
    with pytest.raises(AttemptError, match="parent t0 is not a committed call of this attempt"):
        capture.log.intend(
            "att-b", foreign.model_copy(update={"call_id": "t1", "parent_call_id": "t0"})
        )
    assert capture.log.store.count() == before


def test_a_request_carrying_another_attempts_call_never_continues_it(capture: CaptureService):
    a = play(capture, "att-a", group="g0", index=0, turns=1, select=False)
    capture.open_attempt("att-b", rollout_id="g0-r1", prompt_group="g0", rollout_index=1)
    task = a.result["output"][0]
    capture.generate("att-b", ModelCall([task], OPTIONS, SAMPLING, "b0"))  # b's own history
    # b sends a's call (its request and answer) followed by an observation.
    answer = {"role": "assistant", "content": a.result["output"][1]["content"]}
    carried = [task, answer, {"role": "user", "content": "Go on."}]
    outcome = capture.generate("att-b", ModelCall(carried, OPTIONS, SAMPLING, "b1"))
    assert (outcome.decision.kind.value, outcome.decision.parent_call_id) == ("root", None)
    assert "t0" not in outcome.decision.matched_call_ids
    assert capture.log.load("att-b").calls["b1"].parent_call_id is None
    same = capture.generate("att-a", ModelCall(carried, OPTIONS, SAMPLING, "t1"))
    assert same.decision.parent_call_id == "t0"  # in its own attempt the request continues it
