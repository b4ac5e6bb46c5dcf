"""A training step's root metrics (grove/train/roots.py): roots by reason, unexplained roots, and
the warning when more than half of the step's calls are unexplained roots."""

from __future__ import annotations

from grove.ledger.attempt import AttemptState
from grove.train.roots import UNEXPLAINED_ROOTS, RootCounts, count_roots
from tests.fixtures.attempts import attempt_state, intended


def attempt(key: str, *reasons: str | None) -> AttemptState:
    """An attempt whose calls, in order, are roots with ``reasons`` (None: a continuation)."""
    return attempt_state(key, *(intended(f"c{i}", reason) for i, reason in enumerate(reasons)))


def test_roots_are_counted_by_their_recorded_reason():
    counts = count_roots(
        [
            attempt("a", "first_call", None, "history_rewritten"),
            attempt("b", "first_call", "rendered_history_differs"),
        ]
    )
    assert counts.calls == 5
    assert counts.by_reason == {
        "first_call": 2,
        "history_rewritten": 1,
        "rendered_history_differs": 1,
    }


def test_a_divergence_root_after_the_first_call_is_unexplained():
    counts = count_roots(
        [
            attempt("a", "first_call", "template_not_append_compatible", None),
            attempt("b", "first_call", "rendered_history_differs"),
        ]
    )
    assert counts.unexplained == 2


def test_rewrites_and_other_explained_roots_are_not_unexplained():
    counts = count_roots(
        [attempt("a", "first_call", "history_rewritten", "render_options_changed", "parent_failed")]
    )
    assert counts.unexplained == 0


def test_a_divergence_reason_on_an_attempts_first_call_is_not_counted_unexplained():
    # An attempt written straight to the ledger may start with any reason; the first call
    # continues nothing, so it never counts.
    assert count_roots([attempt("a", "rendered_history_differs", None)]).unexplained == 0


def test_metrics_name_each_reason_that_occurred_and_always_the_unexplained_count():
    counts = count_roots([attempt("a", "first_call", None)])
    assert counts.metrics() == {"roots/first_call": 1.0, UNEXPLAINED_ROOTS: 0.0}


def test_the_run_warns_when_more_than_half_of_a_steps_calls_are_unexplained_roots():
    assert RootCounts(calls=4, by_reason={}, unexplained=2).warning(3) is None
    message = RootCounts(calls=5, by_reason={}, unexplained=3).warning(3)
    assert message is not None
    assert message.startswith("step 3: 3 of its 5 calls are unexplained roots")
    assert "grove lineage" in message and "token_capture.strict" in message
