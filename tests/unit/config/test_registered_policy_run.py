"""``grove train`` registers its ``token_capture.selection_policy`` in its own gateway, so the
attempts it opens may name a custom policy (docs/gateway.md, "Attempts")."""

from __future__ import annotations

from pathlib import Path

from tests.unit.config.runs import train

CUSTOM = "tests.unit.trainer.selection_policies:select_all"


def test_a_custom_selection_policy_selects_the_calls_of_a_training_run(tmp_path: Path) -> None:
    # two calls, the harness returns only the first: select_all still selects both
    run = train(
        tmp_path,
        {
            "token_capture": {"forest_training": True, "selection_policy": CUSTOM},
            "harness": {"options": {"calls": 2, "returned": 1}},
        },
        steps=1,
    )

    state = run.attempt("keys-s0-g0-r0")
    assert state.opened is not None and state.selection is not None
    assert (state.opened.selection_policy, state.selection.policy) == (CUSTOM, CUSTOM)
    assert state.selection.call_ids == ("c0", "c1")
