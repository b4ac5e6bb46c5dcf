"""``fork_source``, pure: a call whose chain lost a blob to the source's cleanup is never forked.

The source ``src`` holds ``c1`` and its continuation ``c2``, settled; an ``attempt.cleaned`` of
it names the keys its cleanup removed (docs/fork.md, "Cleanup").
"""

from __future__ import annotations

import pytest

from grove.capture.forks import fork_source
from grove.ledger.attempt import AttemptError, AttemptState, fold_attempt
from grove.ledger.events import AdmissionsClosed, AttemptCleaned, AttemptSettled
from tests.integration.ledger.scenario import committed, intended, opened


def _source(*cleaned: str) -> AttemptState:
    return fold_attempt(
        "src",
        [
            opened("src"),
            intended("c1"),
            committed("src", "c1"),
            intended("c2", parent="c1"),
            committed("src", "c2", parent="c1", prev=8),
            AdmissionsClosed(),
            AttemptSettled(pending_call_ids=(), timed_out=False),
            *([AttemptCleaned(keys=cleaned)] if cleaned else []),
        ],
    )


def test_a_fork_of_a_call_whose_own_blob_was_cleaned_is_refused():
    with pytest.raises(AttemptError, match="cleanup removed 1 of them from attempt 'src'") as error:
        fork_source("fork-1", _source("staging/src/c1"), "c1")
    assert (error.value.capture_key, error.value.call_id) == ("fork-1", "c1")
    assert "call 'c1' of attempt 'src' can no longer be forked" in str(error.value)


def test_a_fork_of_a_call_whose_ancestors_blob_was_cleaned_is_refused_naming_it():
    with pytest.raises(AttemptError, match=r"\(first: call 'c1'\) .* call 'c2' of attempt 'src'"):
        fork_source("fork-1", _source("staging/src/c1"), "c2")


def test_a_cleaned_blob_outside_the_chain_does_not_refuse_the_fork():
    fork = fork_source("fork-1", _source("staging/src/c2"), "c1")
    assert [call.blob_key for call in fork.chain] == ["staging/src/c1"]
