"""What the capture keys change in a ``grove train`` run: ``token_capture.strict``.

The run's model is the embedded one with a chat template that writes `` (turn N)`` after the
first message of a conversation with N answers (``tests/fixtures/templates.py``), so a call that
continues an answer cannot reuse its exact tokens: an unexplained root. The harness
(``tests/unit/config/conversation_harness.py``) holds a three-call conversation per rollout and
records which call, if any, the gateway refused. ``tests/unit/config/test_key_effects.py`` maps
the key to its test.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.fixtures.templates import save_turn_marking_model
from tests.unit.config.runs import train

HARNESS = "tests.unit.config.conversation_harness:converse"


def test_token_capture_strict_refuses_the_calls_the_template_cannot_continue(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = save_turn_marking_model(tmp_path / "turn-marking")
    conversation = {
        "model": {"path": str(model)},
        "harness": {"target": HARNESS, "options": {"calls": 3}},
        "token_capture": {"forest_training": True},  # a rollout of several roots trains
    }

    with caplog.at_level(logging.WARNING, logger="grove.train.roots"):
        lenient = train(tmp_path / "lenient", conversation)
    strict = train(tmp_path / "strict", conversation, {"token_capture": {"strict": True}})

    # off: every call answered; calls 2 and 3 of each rollout are unexplained roots, so 4 of
    # each step's 6 calls: more than half, and the run warns
    assert [(p["answered"], p["refused"]) for p in lenient.played()] == [(3, None)] * 4
    assert [m["roots/unexplained"] for m in lenient.metrics()] == [4.0, 4.0]
    assert [m["roots/rendered_history_differs"] for m in lenient.metrics()] == [4.0, 4.0]
    assert [r.getMessage()[:53] for r in caplog.records] == [
        "step 0: 4 of its 6 calls are unexplained roots (rende",
        "step 1: 4 of its 6 calls are unexplained roots (rende",
    ]
    # on: the second call of each rollout is refused, and nothing is recorded for it
    refusal = {"status": 409, "code": "unexplained_root"}
    assert [(p["answered"], p["refused"]) for p in strict.played()] == [(1, refusal)] * 4
    assert [m["roots/unexplained"] for m in strict.metrics()] == [0.0, 0.0]
    assert list(strict.attempt("keys-s0-g0-r0").calls) == ["c0"]
