"""The boundary check and exact-token splice (capture/splice.py), with the embedded tokenizer."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from grove.capture.errors import SpliceError
from grove.capture.render import (
    NormalizedRequest,
    Renderer,
    RenderOptions,
    admission_items,
    normalize_messages,
    replay_summary,
)
from grove.capture.splice import PromptPlan, RawOutput, plan_call
from grove.ledger.admission import (
    AdmissionIndex,
    AmbiguousParentError,
    CallStatus,
    DecisionKind,
    Equivalence,
    RootReason,
)

Message = Mapping[str, Any]
SYSTEM = {"role": "system", "content": "You are terse."}
TASK = {"role": "user", "content": "What is the weather?"}
FOLLOW_UP = {"role": "user", "content": "And tomorrow?"}
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
TOOL_RESULT = {"role": "tool", "tool_call_id": "c1", "content": "sunny"}


@dataclass(frozen=True)
class Parent:
    """A committed root call: its request, exact tokens (prompt + generated) and output message."""

    request: tuple[Message, ...]
    chain: tuple[int, ...]
    output: Message
    index: AdmissionIndex


def committed_root(
    renderer: Renderer,
    options: RenderOptions,
    *,
    generated: Sequence[int],
    output: Message,
    request: Sequence[Message] = (SYSTEM, TASK),
) -> Parent:
    """A root call c1 of ``request`` that generated ``generated`` and answered ``output``."""
    prompt = renderer.encode(renderer.render(normalize_messages(request).messages, options))
    items = admission_items(normalize_messages([*request, output]))
    summary = replay_summary(items, renderer.options_digest(options))
    index = AdmissionIndex([summary.candidate("c1", CallStatus.COMMITTED)])
    return Parent(tuple(request), (*prompt, *generated), output, index)


def plan_next(
    renderer: Renderer, options: RenderOptions, parent: Parent, *observations: Message
) -> tuple[NormalizedRequest, PromptPlan]:
    """Admit and plan the request that echoes the parent's history and adds ``observations``."""
    request = normalize_messages([*parent.request, parent.output, *observations])
    return request, plan_call(renderer, request, options, parent.index, chain_of(parent))


def chain_of(parent: Parent) -> Callable[[str], tuple[int, ...]]:
    """``plan_call``'s ``parent_tokens`` for a ledger whose only call is ``parent``."""
    return {"c1": parent.chain}.__getitem__


def answered_root(
    renderer: Renderer, options: RenderOptions, text: str, output: Message | None = None
) -> Parent:
    """A root call c1 that generated ``text`` and stopped at end of turn; by default the harness
    received ``text`` as the assistant message's content."""
    generated = [*renderer.encode(text), renderer.tokenizer.eos_token_id]
    output = output or {"role": "assistant", "content": text}
    return committed_root(renderer, options, generated=generated, output=output)


def test_root_prompt_is_the_tokenized_rendering_of_the_request(
    renderer: Renderer, options: RenderOptions
) -> None:
    request = normalize_messages([SYSTEM, TASK])
    plan = plan_call(renderer, request, options, AdmissionIndex(), lambda call_id: ())
    assert plan.prompt_token_ids == tuple(
        renderer.encode(renderer.render(request.messages, options))
    )
    assert (plan.prev_len, plan.delta_token_ids, plan.decision.reason) == (
        0,
        plan.prompt_token_ids,
        RootReason.FIRST_CALL,
    )


def test_continuation_prompt_is_the_parent_chain_plus_the_tokenized_suffix(
    renderer: Renderer, options: RenderOptions
) -> None:
    parent = answered_root(renderer, options, "Sunny.")
    request, plan = plan_next(renderer, options, parent, FOLLOW_UP)
    assert (plan.decision.kind, plan.decision.parent_call_id) == (DecisionKind.CONTINUATION, "c1")
    assert plan.prompt_token_ids[: plan.prev_len] == parent.chain
    assert plan.prev_len == len(parent.chain)
    assert plan.delta_token_ids == tuple(
        renderer.encode("\n<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n")
    )
    assert renderer.decode(plan.prompt_token_ids) == renderer.render(request.messages, options)


def test_generation_that_retokenizes_differently_is_spliced_with_its_exact_tokens(
    renderer: Renderer, options: RenderOptions
) -> None:
    # "weather" spelled one byte-level token per character: a valid generation whose text the
    # tokenizer would encode with fewer, merged tokens.
    spelled = renderer.tokenizer.convert_tokens_to_ids(list("weather"))
    assert renderer.encode("weather") != spelled
    generated = [*spelled, renderer.tokenizer.eos_token_id]
    parent = committed_root(
        renderer, options, generated=generated, output={"role": "assistant", "content": "weather"}
    )
    _, plan = plan_next(renderer, options, parent, FOLLOW_UP)
    assert plan.decision.kind is DecisionKind.CONTINUATION
    assert plan.prompt_token_ids[: plan.prev_len] == parent.chain
    assert plan.prompt_token_ids[plan.prev_len - len(generated) : plan.prev_len] == tuple(generated)


def test_truncated_generation_is_closed_by_the_suffix(
    renderer: Renderer, options: RenderOptions
) -> None:
    parent = committed_root(
        renderer,
        options,
        generated=renderer.encode("Sunny and"),
        output={"role": "assistant", "content": "Sunny and"},
    )
    request, plan = plan_next(renderer, options, parent, FOLLOW_UP)
    assert plan.decision.kind is DecisionKind.CONTINUATION
    assert renderer.decode(plan.delta_token_ids).startswith("<|im_end|>\n<|im_start|>user\n")
    assert renderer.decode(plan.prompt_token_ids) == renderer.render(request.messages, options)


def test_template_that_strips_earlier_reasoning_roots_a_user_turn_as_not_append_compatible(
    stripping_renderer: Renderer, options: RenderOptions
) -> None:
    renderer = stripping_renderer
    output = {"role": "assistant", "reasoning_content": "look outside", "content": "Sunny."}
    parent = answered_root(renderer, options, "<think>look outside</think>Sunny.", output)
    request, plan = plan_next(renderer, options, parent, FOLLOW_UP)
    assert (plan.decision.kind, plan.decision.reason, plan.decision.candidate_call_id) == (
        DecisionKind.ROOT,
        RootReason.TEMPLATE_NOT_APPEND_COMPATIBLE,
        "c1",
    )
    assert plan.decision.parent_call_id is None
    assert plan.prev_len == 0
    assert plan.prompt_token_ids == tuple(
        renderer.encode(renderer.render(request.messages, options))
    )


def test_template_that_strips_earlier_reasoning_still_appends_tool_results(
    stripping_renderer: Renderer, options: RenderOptions
) -> None:
    renderer = stripping_renderer
    text = '<think>check</think><tool_call>{"arguments": {}, "name": "weather"}</tool_call>'
    output = {"role": "assistant", "reasoning_content": "check", "tool_calls": [TOOL_CALL]}
    parent = answered_root(renderer, options, text, output)
    request, plan = plan_next(renderer, options, parent, TOOL_RESULT)
    assert (plan.decision.kind, plan.decision.parent_call_id) == (DecisionKind.CONTINUATION, "c1")
    assert renderer.decode(plan.prompt_token_ids) == renderer.render(request.messages, options)


def test_output_that_does_not_reproduce_the_generated_text_roots_as_rendered_history_differs(
    renderer: Renderer, options: RenderOptions
) -> None:
    parent = answered_root(
        renderer, options, "  Sunny. ", {"role": "assistant", "content": "Sunny."}
    )
    _, plan = plan_next(renderer, options, parent, FOLLOW_UP)
    assert (plan.decision.kind, plan.decision.reason, plan.decision.candidate_call_id) == (
        DecisionKind.ROOT,
        RootReason.RENDERED_HISTORY_DIFFERS,
        "c1",
    )


def test_a_parsed_output_continues_from_its_exact_text_where_the_template_renders_it_otherwise(
    renderer: Renderer, options: RenderOptions
) -> None:
    # Written name first with a space; the template renders the parsed call arguments first.
    text = '<think>check</think><tool_call> {"name": "weather", "arguments": {}}</tool_call>'
    output = {"role": "assistant", "reasoning_content": "check", "tool_calls": [TOOL_CALL]}
    parent = answered_root(renderer, options, text, output)
    request = normalize_messages([*parent.request, parent.output, TOOL_RESULT])
    rendered = plan_call(renderer, request, options, parent.index, chain_of(parent))
    assert rendered.decision.reason is RootReason.RENDERED_HISTORY_DIFFERS
    raw = {"c1": [RawOutput(2, text)]}.__getitem__
    exact = plan_call(renderer, request, options, parent.index, chain_of(parent), raw)
    assert (exact.decision.kind, exact.prev_len) == (DecisionKind.CONTINUATION, len(parent.chain))
    assert exact.prompt_token_ids[: exact.prev_len] == parent.chain
    assert renderer.decode(exact.delta_token_ids) == (
        "\n<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n"
    )


def test_an_output_equal_to_its_exact_text_renders_the_prefix_once(
    renderer: Renderer, options: RenderOptions
) -> None:
    parent = answered_root(renderer, options, "Sunny.")
    request = normalize_messages([*parent.request, parent.output, FOLLOW_UP])
    raw = {"c1": [RawOutput(2, "Sunny.")]}.__getitem__
    with_raw = plan_call(renderer, request, options, parent.index, chain_of(parent), raw)
    assert with_raw == plan_call(renderer, request, options, parent.index, chain_of(parent))


def test_continuation_without_parent_tokens_raises_splice_error(
    renderer: Renderer, options: RenderOptions
) -> None:
    parent = answered_root(renderer, options, "Sunny.")
    request = normalize_messages([*parent.request, parent.output, FOLLOW_UP])
    with pytest.raises(SpliceError, match=r"parent call c1.*needs its parent chain's exact tokens"):
        plan_call(renderer, request, options, parent.index, lambda call_id: ())


def tool_call_root(renderer: Renderer, options: RenderOptions) -> Parent:
    """A root call c1 that called the weather tool; the harness got content null."""
    text = '<tool_call>{"arguments": {}, "name": "weather"}</tool_call>'
    output = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}
    return answered_root(renderer, options, text, output)


def plan_echo(
    renderer: Renderer, options: RenderOptions, parent: Parent, *observations: Message
) -> PromptPlan:
    """``plan_call`` for the request that echoes the parent's tool call with content ``""``."""
    echoed = {**parent.output, "content": ""}
    request = normalize_messages([*parent.request, echoed, *observations])
    return plan_call(renderer, request, options, parent.index, {"c1": parent.chain}.__getitem__)


def test_plan_call_uses_tool_content_equivalence_when_the_template_renders_both_forms_alike(
    renderer: Renderer, options: RenderOptions
) -> None:
    parent = tool_call_root(renderer, options)
    plan = plan_echo(renderer, options, parent, TOOL_RESULT)
    assert (plan.decision.kind, plan.decision.parent_call_id) == (DecisionKind.CONTINUATION, "c1")
    assert plan.decision.equivalences == (Equivalence.TOOL_CONTENT_NULL_EMPTY,)
    assert plan.prompt_token_ids[: plan.prev_len] == parent.chain


def test_plan_call_refuses_tool_content_equivalence_when_the_template_tells_the_forms_apart(
    strict_content_renderer: Renderer, options: RenderOptions
) -> None:
    parent = tool_call_root(strict_content_renderer, options)
    plan = plan_echo(strict_content_renderer, options, parent, TOOL_RESULT)
    assert (plan.decision.kind, plan.decision.reason) == (
        DecisionKind.ROOT,
        RootReason.TOOL_CONTENT_NOT_EQUIVALENT,
    )
    assert (plan.decision.equivalences, plan.prev_len) == ((), 0)


def test_plan_call_asks_only_for_the_chosen_parents_tokens(
    renderer: Renderer, options: RenderOptions
) -> None:
    parent = answered_root(renderer, options, "Sunny.")
    asked: list[str] = []

    def parent_tokens(call_id: str) -> tuple[int, ...]:
        asked.append(call_id)
        return parent.chain

    request = normalize_messages([*parent.request, parent.output, FOLLOW_UP])
    plan = plan_call(renderer, request, options, parent.index, parent_tokens)
    assert (asked, plan.prev_len) == (["c1"], len(parent.chain))
    first = plan_call(
        renderer, normalize_messages([SYSTEM, FOLLOW_UP]), options, parent.index, parent_tokens
    )
    assert (asked, first.decision.reason) == (["c1"], RootReason.HISTORY_REWRITTEN)


def test_plan_call_carries_the_request_replay_summary(
    renderer: Renderer, options: RenderOptions
) -> None:
    request = normalize_messages([SYSTEM, TASK])
    plan = plan_call(renderer, request, options, AdmissionIndex(), lambda call_id: ())
    assert plan.request_summary == replay_summary(
        admission_items(request), renderer.options_digest(options)
    )


def test_plan_call_raises_admission_errors_before_planning(
    renderer: Renderer, options: RenderOptions
) -> None:
    parent = answered_root(renderer, options, "Sunny.")
    twin = replay_summary(
        admission_items(normalize_messages([*parent.request, parent.output])),
        renderer.options_digest(options),
    ).candidate("c2", CallStatus.COMMITTED)
    parent.index.add(twin)
    request = normalize_messages([*parent.request, parent.output, FOLLOW_UP])
    with pytest.raises(AmbiguousParentError, match="calls c1, c2"):
        plan_call(renderer, request, options, parent.index, {"c1": parent.chain}.__getitem__)
