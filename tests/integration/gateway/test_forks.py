"""Forks through the gateway: an attempt opened from a committed call of another attempt.

The source attempt plays two calls and commits them; a fork opened from its first call continues
that call's conversation, exactly (docs/fork.md). Capture runs on every ledger database and blob
backend; the refusals, which write nothing, on SQLite and local blobs.
"""

from __future__ import annotations

from typing import Any

import pytest

from grove.capture.capabilities import SOURCE_TOKEN_HEADER
from grove.capture.gateway import CALL_ID_HEADER, CAPTURE_KEY_HEADER
from grove.ledger.attempt import AttemptError
from grove.ledger.event_replay import CheckOutcome, verify_admissions
from grove.ledger.events import CallIntended
from grove.training.finalization import decide

from .conftest import MODEL, Gateway
from .test_completions import USER, ask, observe, reply


def _source(gateway: Gateway) -> tuple[list[dict[str, Any]], str, str]:
    """Open ``src`` and play two calls: (the conversation up to call 1's answer, call 1, 2)."""
    gateway.open("src")
    client = gateway.client("src")
    first, first_headers = ask(client, [USER], extra_headers={CALL_ID_HEADER: "c1"})
    history = [USER, reply(first)]
    ask(client, [*history, observe("apples=3")], extra_headers={CALL_ID_HEADER: "c2"})
    return history, first_headers["x-grove-call-id"], "c2"


def _fork(gateway: Gateway, key: str, source: str, call_id: str, **headers: str) -> Any:
    """Open ``key`` as a fork of call ``call_id`` of ``source``, with the source's token (when
    this gateway's clients opened it) unless ``headers`` say otherwise."""
    body = {
        "capture_key": key,
        "rollout_id": f"r-{key}",
        "prompt_group": "g-fork",
        "rollout_index": 0,
        "fork_from": {"capture_key": source, "call_id": call_id},
    }
    assert gateway.tokens is not None
    token = gateway.tokens.by_key.get(source)
    sent = {SOURCE_TOKEN_HEADER: token} if token is not None else {}
    return gateway.http.post("/v1/attempts", json=body, headers={**sent, **headers})


def _chain(gateway: Gateway, capture_key: str, call_id: str) -> tuple[int, ...]:
    views = gateway.service.views
    return views.chain_tokens(views.view(capture_key), call_id)


def test_opening_a_fork_records_its_source_call_and_answers_its_answer(gateway: Gateway):
    history, c1, _ = _source(gateway)
    answer = _fork(gateway, "fork-1", "src", c1)
    assert answer.status_code == 200, answer.text
    source = gateway.state("src").calls[c1].committed
    opened = gateway.state("fork-1").opened
    assert opened is not None and opened.fork_from is not None
    assert (opened.fork_from.source_capture_key, opened.fork_from.source_call_id) == ("src", c1)
    assert opened.fork_from.source_chain_digest == source.chain_digest
    assert opened.fork_from.source_cum_len == source.cum_len
    text = history[1]["content"]
    assert answer.json()["fork_from"] == {
        "source_capture_key": "src",
        "source_call_id": c1,
        "source_cum_len": source.cum_len,
        "answer": text,
        "messages": [USER, {"role": "assistant", "content": text}],
        "input": [
            USER,
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text}],
            },
        ],
        "messages_api": {
            "system": None,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": USER["content"]}]},
                {"role": "assistant", "content": [{"type": "text", "text": text}]},
            ],
        },
    }
    assert gateway.status("fork-1")["fork_from"] == answer.json()["fork_from"]


def test_a_forks_call_that_extends_the_source_continues_it_on_the_source_chain(gateway: Gateway):
    history, c1, _ = _source(gateway)
    _fork(gateway, "fork-1", "src", c1)
    _, headers = ask(gateway.client("fork-1"), [*history, observe("apples=4")])
    call = gateway.state("fork-1").calls[headers["x-grove-call-id"]]
    source = gateway.state("src").calls[c1].committed
    assert (headers["x-grove-decision"], headers["x-grove-parent-call-id"]) == (
        "continuation",
        c1,
    )
    assert (call.intended.source_capture_key, call.committed.source_capture_key) == ("src", "src")
    assert call.committed.prev_len == source.cum_len
    # the fork's chain is the source chain's stored tokens, then its own delta
    fork_chain = _chain(gateway, "fork-1", call.call_id)
    assert fork_chain[: source.cum_len] == _chain(gateway, "src", c1)
    assert len(fork_chain) == call.committed.cum_len
    fork_status = gateway.status("fork-1")["calls"][0]
    assert (fork_status["parent_call_id"], fork_status["source_capture_key"]) == (c1, "src")


def test_a_forks_call_that_does_not_extend_the_source_is_a_new_root(local_gateway: Gateway):
    gateway = local_gateway
    _, c1, _ = _source(gateway)
    _fork(gateway, "fork-1", "src", c1)
    other = {"role": "user", "content": "Name a colour."}
    _, headers = ask(gateway.client("fork-1"), [other])
    call = gateway.state("fork-1").calls[headers["x-grove-call-id"]]
    assert (headers["x-grove-decision"], headers["x-grove-root-reason"]) == (
        "root",
        "history_rewritten",
    )
    assert (call.parent_call_id, call.intended.source_capture_key) == (None, None)


def test_a_fork_of_a_fork_continues_the_chain_through_both_sources(local_gateway: Gateway):
    gateway = local_gateway
    history, c1, _ = _source(gateway)
    _fork(gateway, "fork-1", "src", c1)
    forked, headers = ask(
        gateway.client("fork-1"),
        [*history, observe("apples=4")],
        extra_headers={CALL_ID_HEADER: "f1"},
    )
    history_2 = [*history, observe("apples=4"), reply(forked)]
    assert _fork(gateway, "fork-2", "fork-1", "f1").status_code == 200
    _, headers = ask(gateway.client("fork-2"), [*history_2, observe("apples=5")])
    call = gateway.state("fork-2").calls[headers["x-grove-call-id"]]
    assert (call.parent_call_id, call.intended.source_capture_key) == ("f1", "fork-1")
    f1 = gateway.state("fork-1").calls["f1"].committed
    assert call.committed.prev_len == f1.cum_len
    chain = _chain(gateway, "fork-2", call.call_id)
    assert chain[: f1.cum_len] == _chain(gateway, "fork-1", "f1")
    assert chain[: len(_chain(gateway, "src", c1))] == _chain(gateway, "src", c1)


def test_a_fork_of_an_unknown_call_is_refused_and_writes_nothing(local_gateway: Gateway):
    gateway = local_gateway
    _source(gateway)
    before = gateway.written()
    answer = _fork(gateway, "fork-1", "src", "no-such-call")
    assert answer.status_code == 409
    assert "call 'no-such-call' of attempt 'src' is unknown" in answer.json()["error"]["message"]
    assert gateway.written() == before


def test_a_fork_of_an_unopened_attempt_is_refused_as_a_wrong_token_and_writes_nothing(
    local_gateway: Gateway,
):
    gateway = local_gateway
    before = gateway.written()
    answer = _fork(gateway, "fork-1", "nowhere", "c1", **{SOURCE_TOKEN_HEADER: "t" * 43})
    assert (answer.status_code, answer.json()["error"]["code"]) == (403, "invalid_source_token")
    assert gateway.written() == before


def test_a_fork_without_its_sources_token_is_refused_401_and_writes_nothing(
    local_gateway: Gateway,
):
    gateway = local_gateway
    _, c1, _ = _source(gateway)
    before = gateway.written()
    answer = _fork(gateway, "fork-1", "src", c1, **{SOURCE_TOKEN_HEADER: ""})
    assert (answer.status_code, answer.json()["error"]["code"]) == (401, "missing_source_token")
    assert SOURCE_TOKEN_HEADER in answer.json()["error"]["message"]
    assert gateway.written() == before


def test_a_fork_with_another_attempts_token_is_refused_403_and_writes_nothing(
    local_gateway: Gateway,
):
    gateway = local_gateway
    _, c1, _ = _source(gateway)
    gateway.open("other")
    before = gateway.written()
    wrong = {SOURCE_TOKEN_HEADER: gateway.token("other")}
    answer = _fork(gateway, "fork-1", "src", c1, **wrong)
    assert (answer.status_code, answer.json()["error"]["code"]) == (403, "invalid_source_token")
    assert gateway.written() == before


def test_a_fork_of_a_rejected_call_is_refused_and_writes_nothing(local_gateway: Gateway):
    gateway = local_gateway
    _, c1, _ = _source(gateway)
    assert gateway.http.post(f"/v1/attempts/src/calls/{c1}/reject").status_code == 200
    before = gateway.written()
    answer = _fork(gateway, "fork-1", "src", c1)
    assert answer.status_code == 409
    assert (
        f"call {c1!r} of attempt 'src' is failed (rejected_by_harness)"
        in answer.json()["error"]["message"]
    )
    assert gateway.written() == before


def test_an_attempt_forking_itself_is_refused_and_writes_nothing(local_gateway: Gateway):
    gateway = local_gateway
    _, c1, _ = _source(gateway)
    before = gateway.written()
    answer = _fork(gateway, "src", "src", c1)
    assert answer.status_code == 409
    assert "an attempt cannot fork itself" in answer.json()["error"]["message"]
    assert gateway.written() == before


def test_a_forks_call_reusing_the_source_call_id_is_refused_and_writes_nothing(
    local_gateway: Gateway,
):
    gateway = local_gateway
    history, c1, _ = _source(gateway)
    _fork(gateway, "fork-1", "src", c1)
    before = gateway.written()
    answer = gateway.http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [*history, observe("apples=4")], "max_tokens": 4},
        headers={CAPTURE_KEY_HEADER: "fork-1", CALL_ID_HEADER: c1},
    )
    assert answer.status_code == 409, answer.text
    assert "must differ from its source call's" in answer.json()["error"]["message"]
    assert gateway.written() == before


def _rows(gateway: Gateway, capture_key: str) -> Any:
    return decide(
        gateway.state(capture_key),
        gateway.service.blobs,
        forest_training=True,
        max_row_tokens=None,
    )


def test_a_forks_row_carries_the_source_chain_as_context_and_trains_its_own_tokens(
    gateway: Gateway,
):
    history, c1, _ = _source(gateway)
    _fork(gateway, "fork-1", "src", c1)
    asked = [*history, observe("apples=4")]
    forked, _ = ask(gateway.client("fork-1"), asked, extra_headers={CALL_ID_HEADER: "f1"})
    answer = gateway.http.post(
        "/v1/attempts/fork-1/result",
        json={"reward": 1.0, "model_calls": ["f1"], "terminal_response_id": forked.id},
    )
    assert answer.status_code == 200, answer.text
    decision = _rows(gateway, "fork-1")
    assert decision.forest.masked_reason is None
    (row,) = decision.rows
    source = _chain(gateway, "src", c1)
    f1 = gateway.state("fork-1").calls["f1"].committed
    generated, logprobs = gateway.generated("fork-1", "f1")
    own = len(_chain(gateway, "fork-1", "f1")) - len(source)
    # worked out: the row is the source chain (context), the observation, then f1's generation
    assert row.token_ids.tolist() == list(_chain(gateway, "fork-1", "f1"))
    assert row.token_ids.tolist()[: len(source)] == list(source)
    assert row.loss_mask.tolist() == [False] * (len(source) + own - len(generated)) + [True] * len(
        generated
    )
    assert row.generation_logprobs.tolist()[-len(generated) :] == logprobs
    assert row.generation_logprobs.tolist()[: -len(generated)] == [0.0] * (
        len(source) + own - len(generated)
    )
    assert row.call_ids == ("src/c1", "f1")
    assert row.owned_call_ids == ("f1",)
    assert f1.prev_len == len(source)


def test_a_forks_returned_history_selects_its_own_calls_after_the_source_answers(
    local_gateway: Gateway,
):
    gateway = local_gateway
    history, c1, _ = _source(gateway)
    _fork(gateway, "fork-1", "src", c1)
    asked = [*history, observe("apples=4")]
    forked, _ = ask(gateway.client("fork-1"), asked, extra_headers={CALL_ID_HEADER: "f1"})
    answer = gateway.http.post(
        "/v1/attempts/fork-1/result", json={"reward": 0.5, "output": [*asked, reply(forked)]}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["selection"]["call_ids"] == ["f1"]  # the source answers are context
    (row,) = _rows(gateway, "fork-1").rows
    assert row.call_ids == (f"src/{c1}", "f1")
    assert row.owned_call_ids == ("f1",)
    assert row.token_ids.tolist() == list(_chain(gateway, "fork-1", "f1"))


def test_a_call_id_with_a_slash_is_refused_so_no_call_takes_a_source_calls_name(
    local_gateway: Gateway,
):
    gateway = local_gateway
    history, c1, _ = _source(gateway)
    _fork(gateway, "fork-1", "src", c1)
    before = gateway.written()
    answer = gateway.http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [*history, observe("apples=4")], "max_tokens": 4},
        headers={CAPTURE_KEY_HEADER: "fork-1", CALL_ID_HEADER: "src/c9"},
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_key"
    assert gateway.written() == before


def test_a_fork_of_a_forks_row_carries_both_sources_as_context(local_gateway: Gateway):
    gateway = local_gateway
    history, c1, _ = _source(gateway)
    _fork(gateway, "fork-1", "src", c1)
    asked = [*history, observe("apples=4")]
    forked, _ = ask(gateway.client("fork-1"), asked, extra_headers={CALL_ID_HEADER: "f1"})
    _fork(gateway, "fork-2", "fork-1", "f1")
    asked_2 = [*asked, reply(forked), observe("apples=5")]
    last, _ = ask(gateway.client("fork-2"), asked_2, extra_headers={CALL_ID_HEADER: "f2"})
    answer = gateway.http.post(
        "/v1/attempts/fork-2/result", json={"reward": 1.0, "output": [*asked_2, reply(last)]}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["selection"]["call_ids"] == ["f2"]
    (row,) = _rows(gateway, "fork-2").rows
    assert row.call_ids == (f"src/{c1}", "fork-1/f1", "f2")
    assert row.owned_call_ids == ("f2",)
    assert row.token_ids.tolist() == list(_chain(gateway, "fork-2", "f2"))
    generated, logprobs = gateway.generated("fork-2", "f2")
    context = len(_chain(gateway, "fork-2", "f2")) - len(generated)
    assert row.loss_mask.tolist() == [False] * context + [True] * len(generated)
    assert row.generation_logprobs.tolist()[context:] == logprobs


def _intent_with_parent(gateway: Gateway, source: str | None, parent: str) -> CallIntended:
    """An intent of call ``x1`` of ``fork-1`` continuing ``parent`` of ``source``, built from
    the fork source's recorded summary."""
    opened = gateway.state("fork-1").opened
    assert opened is not None and opened.fork_from is not None
    return CallIntended(
        call_id="x1",
        decision="continuation",
        parent_call_id=parent,
        source_capture_key=source,
        replay_summary=opened.fork_from.source_replay_summary,
        prompt_tokens=opened.fork_from.source_cum_len + 1,
    )


def test_the_ledger_refuses_a_parent_in_an_attempt_that_is_not_the_fork_source(
    local_gateway: Gateway,
):
    gateway = local_gateway
    _, c1, _ = _source(gateway)
    gateway.open("other")
    _fork(gateway, "fork-1", "src", c1)
    before = gateway.written()
    with pytest.raises(AttemptError, match="must be the attempt's fork source: got c1 of other"):
        gateway.service.log.intend("fork-1", _intent_with_parent(gateway, "other", c1))
    with pytest.raises(AttemptError, match="got c2 of src, the fork source is c1 of src"):
        gateway.service.log.intend("fork-1", _intent_with_parent(gateway, "src", "c2"))
    assert gateway.written() == before


def test_the_ledger_refuses_a_parent_in_another_attempt_of_an_attempt_that_forks_nothing(
    local_gateway: Gateway,
):
    gateway = local_gateway
    _, c1, _ = _source(gateway)
    _fork(gateway, "fork-1", "src", c1)
    gateway.open("plain")
    intended = _intent_with_parent(gateway, "src", c1)
    before = gateway.written()
    with pytest.raises(AttemptError, match="the fork source is none"):
        gateway.service.log.intend("plain", intended)
    assert gateway.written() == before


def test_replay_re_runs_a_forks_continuation_of_its_source_alike(local_gateway: Gateway):
    gateway = local_gateway
    history, c1, _ = _source(gateway)
    _fork(gateway, "fork-1", "src", c1)
    _, headers = ask(gateway.client("fork-1"), [*history, observe("apples=4")])
    assert headers["x-grove-decision"] == "continuation"

    events = gateway.service.log.store.read_stream("fork-1")
    checks = verify_admissions("fork-1", events)

    assert [(c.subject, c.outcome) for c in checks] == [
        (headers["x-grove-call-id"], CheckOutcome.SAME)
    ]


def test_opening_a_fork_again_from_the_same_call_is_idempotent(local_gateway: Gateway):
    gateway = local_gateway
    _, c1, _ = _source(gateway)
    first = _fork(gateway, "fork-1", "src", c1)
    events = gateway.written()

    again = _fork(gateway, "fork-1", "src", c1)

    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert gateway.written() == events


def test_opening_a_fork_again_from_another_call_is_a_conflict_naming_fork_from(
    local_gateway: Gateway,
):
    gateway = local_gateway
    _, c1, c2 = _source(gateway)
    _fork(gateway, "fork-1", "src", c1)
    events = gateway.written()

    again = _fork(gateway, "fork-1", "src", c2)

    assert again.status_code == 409
    error = again.json()["error"]
    assert error["code"] == "conflicting_event"
    assert f"fork_from: got 'src/{c2}', recorded 'src/{c1}'" in error["message"]
    assert gateway.written() == events
