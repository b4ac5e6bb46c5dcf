"""The warm start's corpus: seeded conversations of the lookup agent, rendered as the gateway
renders them, with the loss on exactly the assistant's tokens."""

from __future__ import annotations

import json

import pytest

from grove.capture.embedded import build_tokenizer
from grove.capture.toolcalls import parse_output
from grove.demo.agent_corpus import (
    COLOURS,
    GIVE_UP,
    SUMMARY_REQUEST,
    CorpusSpec,
    answer,
    conversations,
    lookup_call,
    lookup_result,
    notes_prompt,
    question,
    summary,
    tokenize_conversation,
)

SPEC = CorpusSpec(conversations=64)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_the_same_seed_draws_the_same_conversations_and_another_seed_others() -> None:
    assert conversations(SPEC) == conversations(SPEC)
    assert conversations(SPEC) != conversations(CorpusSpec(conversations=64, seed=1))


def test_each_round_asks_looks_up_reads_the_result_and_answers_from_it() -> None:
    for messages in conversations(SPEC):
        asks = [i for i, m in enumerate(messages) if m["role"] == "tool"]
        assert 1 <= len(asks) <= SPEC.max_rounds
        for index in asks:
            ask, call, result, reply = messages[index - 2 : index + 2]
            item = call["tool_calls"][0]["function"]["arguments"]["item"]
            colour = result["content"].removeprefix(f"{item}: ")
            assert ask["content"].endswith(question(item))
            assert call == lookup_call(item, result["tool_call_id"])
            assert result["content"] == lookup_result(item, colour)
            assert colour in COLOURS
            assert reply == {"role": "assistant", "content": answer(item, colour)}


def test_a_summary_repeats_every_fact_of_its_context_notes_first() -> None:
    summarized = [m for m in conversations(SPEC) if m[-2]["content"] == SUMMARY_REQUEST]
    assert 0 < len(summarized) < SPEC.conversations
    for messages in summarized:
        first = messages[0]["content"]
        notes = first.removeprefix("Notes: ").split("\n")[0] if first.startswith("Notes:") else ""
        answers = " ".join(m["content"] for m in messages[3:-2:4])
        assert messages[-1]["content"] == f"{notes} {answers}".strip()


def test_some_contexts_start_from_notes_as_a_compacted_context_does() -> None:
    noted = [m for m in conversations(SPEC) if m[0]["content"].startswith("Notes: ")]
    assert 0 < len(noted) < SPEC.conversations
    for messages in noted:
        item = messages[1]["tool_calls"][0]["function"]["arguments"]["item"]
        notes = messages[0]["content"].removeprefix("Notes: ").split("\n")[0]
        assert messages[0]["content"] == notes_prompt(notes, item)
        assert notes.startswith("The ") and notes.endswith(".")
        assert item not in notes.split()  # the notes hold facts of earlier rounds


def test_a_context_from_notes_gives_up_on_every_round_when_its_fraction_is_one() -> None:
    spec = CorpusSpec(conversations=64, noted_give_up_fraction=1.0)
    drawn = conversations(spec)
    noted = [m for m in drawn if m[0]["content"].startswith("Notes: ")]
    assert 0 < len(noted) < spec.conversations
    for messages in noted:
        rounds = messages[:-2] if messages[-2]["content"] == SUMMARY_REQUEST else messages
        assert [m["role"] for m in rounds] == ["user", "assistant"] * (len(rounds) // 2)
        assert all(m == {"role": "assistant", "content": GIVE_UP} for m in rounds[1::2])
    fresh = [i for i, m in enumerate(drawn) if not m[0]["content"].startswith("Notes: ")]
    default = conversations(CorpusSpec(conversations=64))
    assert fresh and all(drawn[i] == default[i] for i in fresh)  # fresh contexts are unchanged


def test_a_summary_is_the_answers_again() -> None:
    assert summary([("owl", "red"), ("sea", "blue")]) == "The owl is red. The sea is blue."


def test_the_loss_covers_each_assistant_turn_and_its_end_of_turn_token_only(tokenizer) -> None:
    messages = conversations(SPEC)[0]
    example = tokenize_conversation(tokenizer, messages)

    assert len(example.token_ids) == len(example.loss_mask)
    trained = tokenizer.decode(
        [t for t, on in zip(example.token_ids, example.loss_mask, strict=True) if on]
    )
    turns = [
        ("<think>" + m["reasoning_content"] + "</think>" if "reasoning_content" in m else "")
        + (m.get("content") or "")
        + "".join(
            "<tool_call>" + json.dumps(c["function"], sort_keys=True) + "</tool_call>"
            for c in m.get("tool_calls", ())
        )
        + "<|im_end|>"
        for m in messages
        if m["role"] == "assistant"
    ]
    assert trained == "".join(turns)


def test_every_trained_tool_call_parses_as_the_gateway_parses_a_generation(tokenizer) -> None:
    for messages in conversations(CorpusSpec(conversations=8)):
        example = tokenize_conversation(tokenizer, messages)
        turns, turn = [], []
        for token, on in zip(example.token_ids, example.loss_mask, strict=True):
            if on:
                turn.append(token)
            if on and token == tokenizer.eos_token_id:
                turns.append(tokenizer.decode(turn[:-1]))
                turn = []
        calls = [m for m in messages if m["role"] == "assistant" and "tool_calls" in m]
        parsed = [parse_output(text, tool_calls=True) for text in turns]
        looked_up = [p for p in parsed if p.tool_calls]
        assert len(looked_up) == len(calls)
        for got, call in zip(looked_up, calls, strict=True):
            function = call["tool_calls"][0]["function"]
            assert got.reasoning == call["reasoning_content"]
            assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == [
                (function["name"], function["arguments"])
            ]
