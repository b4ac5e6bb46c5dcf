"""The splice's divergence diagnostic and strict mode (capture/splice.py, capture/divergence.py).

Each test roots a candidate through the real boundary check with the embedded tokenizer and a
template that cannot extend the parent's tokens, then reads what the plan records.
"""

from __future__ import annotations

import pytest

from grove.capture.divergence import Cause
from grove.capture.embedded import CHATML_TEMPLATE, REASONING_STRIPPING_TEMPLATE, build_tokenizer
from grove.capture.errors import UnexplainedRootError
from grove.capture.fixed_options import FIXED_OPTIONS_KEY
from grove.capture.render import Renderer, RenderOptions, normalize_messages
from grove.capture.splice import RawOutput, plan_call
from grove.ledger.admission import DecisionKind, RootReason
from tests.fixtures.templates import TURN_MARKING_TEMPLATE, turn_mark

from .test_splice import (
    FOLLOW_UP,
    SYSTEM,
    TASK,
    Parent,
    answered_root,
    chain_of,
    committed_root,
    plan_next,
)


@pytest.fixture(scope="module")
def turn_marking_renderer() -> Renderer:
    """A renderer whose system prompt counts the conversation's answers."""
    return Renderer(build_tokenizer(template=TURN_MARKING_TEMPLATE))


def plan_strict(renderer: Renderer, options: RenderOptions, parent: Parent, *, strict: bool):
    """``plan_call`` for the request that echoes the parent's output and asks a follow-up."""
    request = normalize_messages([*parent.request, parent.output, FOLLOW_UP])
    chains = {"c1": parent.chain}
    return plan_call(renderer, request, options, parent.index, chains.__getitem__, strict=strict)


def test_stripped_reasoning_is_diagnosed_at_the_parents_output_message(
    stripping_renderer: Renderer, options: RenderOptions
) -> None:
    output = {"role": "assistant", "reasoning_content": "look outside", "content": "Sunny."}
    parent = answered_root(stripping_renderer, options, "<think>look outside</think>Sunny.", output)
    _, plan = plan_next(stripping_renderer, options, parent, FOLLOW_UP)
    assert plan.decision.reason is RootReason.TEMPLATE_NOT_APPEND_COMPATIBLE
    divergence = plan.divergence
    assert divergence is not None
    assert (divergence.message_index, divergence.cause) == (2, Cause.STRIPPED_REASONING)
    prefix = stripping_renderer.render(
        normalize_messages([*parent.request]).messages, options, add_generation_prompt=True
    )
    assert divergence.char_offset == len(prefix)  # right after "<|im_start|>assistant\n"
    assert divergence.parent.texts[divergence.parent.offset - divergence.parent.start] == "<think>"
    request = divergence.request
    assert "".join(request.texts[request.offset - request.start :]).startswith("Sunny.")


def test_stripped_reasoning_after_a_long_history_is_diagnosed_at_the_last_output(
    stripping_renderer: Renderer, options: RenderOptions
) -> None:
    turns = [
        message
        for i in range(10)
        for message in (
            {"role": "user", "content": f"Question {i}?"},
            {"role": "assistant", "content": f"Answer {i}."},
        )
    ]
    output = {"role": "assistant", "reasoning_content": "look outside", "content": "Sunny."}
    parent = committed_root(
        stripping_renderer,
        options,
        generated=stripping_renderer.encode("<think>look outside</think>Sunny.<|im_end|>"),
        output=output,
        request=(SYSTEM, *turns, TASK),
    )
    _, plan = plan_next(stripping_renderer, options, parent, FOLLOW_UP)
    assert plan.divergence is not None
    assert (plan.divergence.message_index, plan.divergence.cause) == (
        22,  # system, ten questions and answers, the task, then the parent's output
        Cause.STRIPPED_REASONING,
    )


def test_a_changed_system_prompt_is_diagnosed_at_message_zero(
    turn_marking_renderer: Renderer, options: RenderOptions
) -> None:
    parent = answered_root(turn_marking_renderer, options, "Sunny.")
    _, plan = plan_next(turn_marking_renderer, options, parent, FOLLOW_UP)
    assert plan.decision.reason is RootReason.RENDERED_HISTORY_DIFFERS
    divergence = plan.divergence
    assert divergence is not None
    assert (divergence.message_index, divergence.cause) == (0, Cause.CHANGED_CONTENT)
    assert divergence.char_offset == len(f"<|im_start|>system\n{SYSTEM['content']}")
    # the parent side is the parent chain's exact tokens, around the token offset
    window = divergence.parent
    assert window.token_ids == parent.chain[window.start : window.offset + 16]
    assert window.texts[window.offset - window.start] == "<|im_end|>"
    request = divergence.request
    after = "".join(request.texts[request.offset - request.start :])
    assert after.startswith(turn_mark(1))


def test_output_whitespace_a_trimming_template_drops_is_changed_content_at_the_output(
    options: RenderOptions,
) -> None:
    # Like Llama 3's template, which writes every message's content trimmed.
    trimming = CHATML_TEMPLATE.replace("{{- message.content }}", "{{- message.content | trim }}")
    renderer = Renderer(build_tokenizer(template=trimming))
    parent = answered_root(renderer, options, "  Sunny. ")
    request = normalize_messages([*parent.request, parent.output, FOLLOW_UP])
    raw = {"c1": [RawOutput(2, "  Sunny. ")]}.__getitem__
    plan = plan_call(renderer, request, options, parent.index, chain_of(parent), raw)
    assert plan.decision.reason is RootReason.RENDERED_HISTORY_DIFFERS
    assert plan.divergence is not None
    assert (plan.divergence.message_index, plan.divergence.cause) == (2, Cause.CHANGED_CONTENT)
    window = plan.divergence.parent
    assert window.texts[window.offset - window.start].startswith(" ")


def test_a_continuation_and_an_explained_root_carry_no_divergence(
    renderer: Renderer, options: RenderOptions
) -> None:
    parent = answered_root(renderer, options, "Sunny.")
    _, continued = plan_next(renderer, options, parent, FOLLOW_UP)
    assert (continued.decision.kind, continued.divergence) == (DecisionKind.CONTINUATION, None)
    rewritten = plan_call(
        renderer,
        normalize_messages([SYSTEM, FOLLOW_UP]),
        options,
        parent.index,
        chain_of(parent),
    )
    assert (rewritten.decision.reason, rewritten.divergence) == (
        RootReason.HISTORY_REWRITTEN,
        None,
    )


def test_the_admission_record_carries_the_divergence_and_the_fixed_options(
    turn_marking_renderer: Renderer, options: RenderOptions
) -> None:
    parent = answered_root(turn_marking_renderer, options, "Sunny.")
    plan = plan_strict(turn_marking_renderer, options, parent, strict=False)
    record = plan.admission_record()
    assert plan.divergence is not None
    assert record["divergence"] == plan.divergence.as_payload()
    assert record[FIXED_OPTIONS_KEY]["model"] == options.model
    assert {k: v for k, v in record.items() if k not in ("divergence", FIXED_OPTIONS_KEY)} == (
        plan.decision.as_payload()
    )


def test_strict_planning_refuses_an_unexplained_root_with_its_divergence(
    turn_marking_renderer: Renderer, options: RenderOptions
) -> None:
    parent = answered_root(turn_marking_renderer, options, "Sunny.")
    with pytest.raises(UnexplainedRootError) as refused:
        plan_strict(turn_marking_renderer, options, parent, strict=True)
    error = refused.value
    assert (error.reason, error.candidate_call_id) == ("rendered_history_differs", "c1")
    assert error.divergence.message_index == 0
    assert "continues call c1" in str(error)
    assert "diverged at message 0" in str(error)
    assert "likely cause: changed content" in str(error)


def test_strict_planning_admits_continuations_and_explained_roots(
    renderer: Renderer, options: RenderOptions
) -> None:
    parent = answered_root(renderer, options, "Sunny.")
    continued = plan_strict(renderer, options, parent, strict=True)
    assert continued.decision.kind is DecisionKind.CONTINUATION
    rewritten = plan_call(
        renderer,
        normalize_messages([SYSTEM, TASK, FOLLOW_UP]),
        options,
        parent.index,
        {"c1": parent.chain}.__getitem__,
        strict=True,
    )
    assert rewritten.decision.reason is RootReason.HISTORY_REWRITTEN


def test_a_template_that_strips_reasoning_is_refused_in_strict_mode(options: RenderOptions):
    renderer = Renderer(build_tokenizer(template=REASONING_STRIPPING_TEMPLATE))
    output = {"role": "assistant", "reasoning_content": "look outside", "content": "Sunny."}
    parent = answered_root(renderer, options, "<think>look outside</think>Sunny.", output)
    with pytest.raises(UnexplainedRootError, match="likely cause: stripped reasoning"):
        plan_strict(renderer, options, parent, strict=True)
