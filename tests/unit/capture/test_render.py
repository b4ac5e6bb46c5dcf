"""Chat-template rendering, render-option digests, replay summaries and the tool-content proof."""

from __future__ import annotations

import dataclasses

import pytest

from grove.capture.embedded import CHATML_TEMPLATE, build_tokenizer
from grove.capture.errors import RenderError
from grove.capture.render import (
    NORMALIZATION_VERSION,
    Renderer,
    RenderOptions,
    ReplaySummary,
    admission_items,
    normalize_messages,
    render_options_digest,
    replay_summary,
)
from grove.ledger.admission import PREFIX_DIGEST_SEED, CallStatus, extend_prefix_digest

TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_render_applies_the_chatml_template_with_a_generation_prompt(
    renderer: Renderer, options: RenderOptions
) -> None:
    request = normalize_messages(
        [{"role": "system", "content": "terse"}, {"role": "user", "content": "2+2?"}]
    )
    assert renderer.render(request.messages, options) == (
        "<|im_start|>system\nterse<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_render_without_generation_prompt_ends_after_the_last_message(
    renderer: Renderer, options: RenderOptions
) -> None:
    messages = normalize_messages(
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    ).messages
    assert renderer.render(messages, options, add_generation_prompt=False) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    )


def test_render_passes_tools_to_the_template(renderer: Renderer, options: RenderOptions) -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    text = renderer.render(
        [{"role": "user", "content": "hi"}], dataclasses.replace(options, tools=(tool,))
    )
    assert text.startswith('<|im_start|>system\n# Tools\n{"type": "function", "function": {"name"')


def test_a_failing_template_raises_render_error(renderer: Renderer, options: RenderOptions) -> None:
    broken = dataclasses.replace(options, chat_template="{{ raise_exception('no tools here') }}")
    with pytest.raises(RenderError, match=r"grove/embedded-tiny.*failed to render.*no tools here"):
        renderer.render([{"role": "user", "content": "hi"}], broken)


def test_encode_and_decode_round_trip_text_exactly(renderer: Renderer) -> None:
    text = "<|im_start|>user\n  wörld 🙂\t<think>x</think><|im_end|>\n"
    assert renderer.decode(renderer.encode(text)) == text


def test_options_digest_is_stable_for_equal_options(
    renderer: Renderer, options: RenderOptions
) -> None:
    assert renderer.options_digest(options) == renderer.options_digest(
        RenderOptions(model=options.model, template_kwargs={})
    )


@pytest.mark.parametrize(
    "change",
    [
        {"model": "other"},
        {"chat_template": CHATML_TEMPLATE + " "},
        {"template_kwargs": {"enable_thinking": False}},
        {"tools": ({"type": "function", "function": {"name": "f"}},)},
        {"tool_choice": "required"},
        {"add_generation_prompt": False},
        {"add_special_tokens": True},
        {"reasoning_effort": "low"},
        {"processor_kwargs": {"max_pixels": 1024}},
    ],
    ids=lambda change: next(iter(change)),
)
def test_options_digest_changes_with_every_option(
    renderer: Renderer, options: RenderOptions, change: dict[str, object]
) -> None:
    changed = dataclasses.replace(options, **change)
    assert renderer.options_digest(changed) != renderer.options_digest(options)


def test_options_digest_uses_the_tokenizer_template_when_options_name_none(
    renderer: Renderer, options: RenderOptions
) -> None:
    explicit = dataclasses.replace(options, chat_template=CHATML_TEMPLATE)
    assert renderer.options_digest(options) == render_options_digest(explicit, CHATML_TEMPLATE)


def test_options_that_are_not_json_raise_render_error(
    renderer: Renderer, options: RenderOptions
) -> None:
    odd = dataclasses.replace(options, template_kwargs={"when": object()})
    with pytest.raises(RenderError, match="render options must be JSON values"):
        renderer.options_digest(odd)


def test_replay_summary_chains_item_digests() -> None:
    items = admission_items(
        normalize_messages(
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        )
    )
    summary = replay_summary(items, "opts")
    expected = extend_prefix_digest(
        extend_prefix_digest(PREFIX_DIGEST_SEED, items[0].digest), items[1].digest
    )
    assert summary == ReplaySummary(
        normalization_version=NORMALIZATION_VERSION,
        item_count=2,
        source_digest=expected,
        canonical_source_digest=expected,
        render_options_digest="opts",
    )


def test_extending_a_request_summary_by_its_output_equals_the_whole_summary() -> None:
    request = admission_items(normalize_messages([{"role": "user", "content": "a"}]))
    output = admission_items(normalize_messages([{"role": "assistant", "content": "b"}]))
    assert replay_summary(request, "o").extended(output) == replay_summary(request + output, "o")


def test_replay_summary_payload_round_trips() -> None:
    items = admission_items(normalize_messages([{"role": "user", "content": "a"}]))
    summary = replay_summary(items, "o")
    assert ReplaySummary.model_validate(summary.model_dump()) == summary


def test_summary_candidate_carries_digests_status_and_response_ids() -> None:
    items = admission_items(normalize_messages([{"role": "user", "content": "a"}]))
    summary = replay_summary(items, "o")
    call = summary.candidate("c1", CallStatus.COMMITTED, frozenset({"resp_1"}))
    assert (call.call_id, call.status, call.source_digest, call.render_options_digest) == (
        "c1",
        CallStatus.COMMITTED,
        summary.source_digest,
        "o",
    )
    assert call.response_ids == frozenset({"resp_1"})


def tool_turn(content: str | None) -> tuple[dict[str, object], ...]:
    """Normalized messages around an assistant tool call whose content is ``content``."""
    return normalize_messages(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": content, "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ]
    ).messages


def test_chatml_renders_null_and_empty_tool_content_identically(
    renderer: Renderer, options: RenderOptions
) -> None:
    assert renderer.tool_content_forms_render_identically(tool_turn(""), options) is True


def test_a_template_that_marks_defined_content_renders_the_forms_differently(
    strict_content_renderer: Renderer, options: RenderOptions
) -> None:
    assert (
        strict_content_renderer.tool_content_forms_render_identically(tool_turn(None), options)
        is False
    )


def test_tool_content_proof_is_vacuous_without_tool_call_messages(
    strict_content_renderer: Renderer, options: RenderOptions
) -> None:
    messages = normalize_messages([{"role": "user", "content": "go"}]).messages
    assert strict_content_renderer.tool_content_forms_render_identically(messages, options) is True


def test_a_tokenizer_without_a_template_and_options_without_one_raise_render_error(
    options: RenderOptions,
) -> None:
    bare = Renderer(build_tokenizer(template=""))
    with pytest.raises(RenderError, match="no chat template"):
        bare.render([{"role": "user", "content": "hi"}], options)
