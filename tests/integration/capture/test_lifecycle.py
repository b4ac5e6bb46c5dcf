"""The capture write path over real ledgers (SQLite, PostgreSQL) and blob stores (local, S3)."""

from __future__ import annotations

import pytest

from grove.capture.engine import Generation, SamplingParams
from grove.capture.errors import EngineError
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.ledger.admission import DecisionKind
from grove.ledger.attempt import AttemptError, CallStatus
from grove.storage import BlobRef, row_chain_digests, staging_key

from .conftest import OPTIONS

SAMPLING = SamplingParams(max_tokens=6)


def ask(service: CaptureService, messages: list[dict], call_id: str | None = None):
    return service.generate("att-1", ModelCall(messages, OPTIONS, SAMPLING, call_id=call_id))


def chat(service: CaptureService, turns: int, start: list[dict] | None = None):
    """Run ``turns`` calls, each answering the previous one with a tool observation."""
    messages = start or [{"role": "user", "content": "Count the apples."}]
    outcomes = []
    for turn in range(turns):
        outcome = ask(service, messages, call_id=f"c{len(outcomes) + 1}")
        outcomes.append(outcome)
        messages = [*messages, outcome.message, {"role": "tool", "content": f"apples={turn}"}]
    return outcomes, messages


def stored_tokens(service: CaptureService, call_id: str) -> list[int]:
    committed = service.log.load("att-1").calls[call_id].committed
    delta = service.blobs.get_delta(
        BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
    )
    return delta.prompt_delta.tolist() + delta.generated.tolist()


def test_twenty_chained_calls_store_deltas_that_concatenate_to_the_last_context(service):
    outcomes, _ = chat(service, 20)
    assert [o.decision.kind for o in outcomes[1:]] == [DecisionKind.CONTINUATION] * 19
    chain = [t for o in outcomes for t in stored_tokens(service, o.call_id)]
    last = outcomes[-1]
    assert chain == service.engine.prompts[-1] + list(last.generation.token_ids)
    committed = service.log.load("att-1").calls["c20"].committed
    assert committed.cum_len == len(chain)
    assert committed.prev_len + committed.delta_len == committed.cum_len


def test_a_rewrite_after_call_ten_starts_a_new_root(service):
    chat(service, 10)
    compacted = [{"role": "user", "content": "Summary: ten apples counted. Continue."}]
    rewritten = ask(service, compacted, call_id="c11")
    assert rewritten.decision.kind is DecisionKind.ROOT
    assert rewritten.decision.reason.value == "history_rewritten"
    assert service.log.load("att-1").calls["c11"].parent_call_id is None


def test_generated_tokens_are_reused_exactly_even_when_they_retokenize_differently(service):
    outcomes, _ = chat(service, 6)
    renderer = service.renderer
    differs = [
        o
        for o in outcomes
        if renderer.encode(renderer.decode(o.generation.token_ids)) != list(o.generation.token_ids)
    ]
    assert differs, "the random model should produce at least one non-canonical tokenization"
    for index, outcome in enumerate(outcomes):
        # Each call's prompt starts with the exact stored tokens of its whole chain so far.
        chain = [t for o in outcomes[:index] for t in stored_tokens(service, o.call_id)]
        assert outcome.decision.parent_call_id == (outcomes[index - 1].call_id if index else None)
        assert service.engine.prompts[index][: len(chain)] == chain


def test_measure_returns_the_prompt_length_and_writes_nothing(service):
    _, messages = chat(service, 2)
    events_before = service.log.store.count()
    blobs_before = service.blobs.list_keys()
    measured = service.measure("att-1", ModelCall(messages, OPTIONS, SAMPLING))
    assert measured.decision.kind is DecisionKind.CONTINUATION
    assert measured.decision.parent_call_id == "c2"
    done = ask(service, messages, call_id="c3")
    assert measured.prompt_tokens == done.prompt_tokens
    assert service.log.store.count() == events_before + 2  # only c3's intent and commit
    assert len(service.blobs.list_keys()) == len(blobs_before) + 1


def test_a_rejected_response_stays_a_sibling_of_its_retry(service):
    _, messages = chat(service, 1)
    request = [*messages[:-1], {"role": "tool", "content": "apples=0"}]
    rejected = ask(service, request, call_id="c2")
    service.fail("att-1", "c2", "rejected_by_harness")
    retry = ask(service, request, call_id="c3")
    assert rejected.decision.parent_call_id == retry.decision.parent_call_id == "c1"
    after_retry = [*request, retry.message, {"role": "user", "content": "go on"}]
    assert ask(service, after_retry, call_id="c4").decision.parent_call_id == "c3"


class _BrokenEngine:
    def check(self, prompt_token_ids, sampling) -> None:
        return None

    def generate(self, prompt_token_ids, sampling) -> Generation:
        raise EngineError("the engine fell over")


def test_an_engine_error_is_recorded_as_a_failed_call_and_reraised(service):
    service.engine = _BrokenEngine()
    with pytest.raises(EngineError, match="fell over"):
        ask(service, [{"role": "user", "content": "hi"}], call_id="c1")
    call = service.log.load("att-1").calls["c1"]
    assert (call.status, call.failure.reason) == (CallStatus.FAILED, "engine_error")
    assert "fell over" in call.failure.detail


def test_a_storage_error_is_recorded_as_a_failed_call(service):
    service.blobs.put(staging_key("att-1", "c1"), b"something else already here")
    with pytest.raises(Exception, match="staging/att-1/c1"):
        ask(service, [{"role": "user", "content": "hi"}], call_id="c1")
    call = service.log.load("att-1").calls["c1"]
    assert (call.status, call.failure.reason) == (CallStatus.FAILED, "storage_error")


def test_calls_after_the_harness_returned_are_refused(service):
    chat(service, 1)
    service.close("att-1")
    with pytest.raises(AttemptError, match="admissions are closed"):
        ask(service, [{"role": "user", "content": "late"}], call_id="c9")


def test_committed_chain_digests_match_the_tokens_of_the_chain(service):
    outcomes, _ = chat(service, 4)
    calls = service.log.load("att-1").calls
    tokens = [t for o in outcomes for t in stored_tokens(service, o.call_id)]
    lengths = [
        (calls[o.call_id].committed.prompt_delta_len, calls[o.call_id].committed.generated_len)
        for o in outcomes
    ]
    recorded = [calls[o.call_id].committed.chain_digest for o in outcomes]
    assert row_chain_digests(tokens, lengths) == recorded
