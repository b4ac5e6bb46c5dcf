"""The renderer's kept renderings and encodings: exact keys, never shared across what differs,
bounded; and the escape check that skips the escape walk when no string can need it."""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

import pytest
from tokenizers import AddedToken
from transformers import PreTrainedTokenizerFast

from grove.capture.embedded import CHATML_TEMPLATE, EMBEDDED_MODEL_NAME, build_tokenizer
from grove.capture.errors import RenderError
from grove.capture.render import Renderer, RenderOptions
from grove.capture.template_tokens import (
    BoundedCache,
    RenderedText,
    SpecialTokenText,
    plain_repr,
)

MESSAGES = ({"content": "terse", "role": "system"}, {"content": "2+2?", "role": "user"})
TOOL = {"type": "function", "function": {"name": "f"}}


class _Counted:
    """Counts the calls of a wrapped function."""

    def __init__(self, function: Any) -> None:
        self.function = function
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.function(*args, **kwargs)


def _counted_renderer(
    tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch
) -> tuple[Renderer, _Counted]:
    renderer = Renderer(tokenizer)
    applied = _Counted(renderer._apply)
    monkeypatch.setattr(renderer, "_apply", applied)
    return renderer, applied


@pytest.fixture
def options() -> RenderOptions:
    """Default render options for the embedded model."""
    return RenderOptions(model=EMBEDDED_MODEL_NAME)


def test_the_same_input_is_rendered_by_the_template_once(
    tokenizer: PreTrainedTokenizerFast, options: RenderOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    renderer, applied = _counted_renderer(tokenizer, monkeypatch)
    first = renderer.render(MESSAGES, options)
    again = renderer.render([dict(m) for m in MESSAGES], options)
    assert (again, again.template_tokens, applied.calls) == (first, first.template_tokens, 1)


VARIANTS: dict[str, tuple[tuple[dict[str, Any], ...], dict[str, Any], bool]] = {
    "tools": (MESSAGES, {"tools": (TOOL,)}, True),
    "template": (MESSAGES, {"chat_template": CHATML_TEMPLATE.replace("\\n", "\\n\\n")}, True),
    "template kwargs": (MESSAGES, {"template_kwargs": {"enable_thinking": False}}, True),
    "reasoning effort": (MESSAGES, {"reasoning_effort": "low"}, True),
    "generation prompt": (MESSAGES, {}, False),
    "content": ((MESSAGES[0], {"content": "2+3?", "role": "user"}), {}, True),
    "key order": ((MESSAGES[0], {"role": "user", "content": "2+2?"}), {}, True),
    "int or float": ((MESSAGES[0], {"content": "2+2?", "role": "user", "n": 1.0}), {}, True),
    "int or bool": ((MESSAGES[0], {"content": "2+2?", "role": "user", "n": True}), {}, True),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_rendering_is_never_returned_for_another_input(
    tokenizer: PreTrainedTokenizerFast,
    options: RenderOptions,
    monkeypatch: pytest.MonkeyPatch,
    variant: str,
) -> None:
    renderer, applied = _counted_renderer(tokenizer, monkeypatch)
    renderer.render((*MESSAGES[:1], {**MESSAGES[1], "n": 1}), options)
    renderer.render(MESSAGES, options)
    messages, changes, generation = VARIANTS[variant]
    other = dataclasses.replace(options, **changes)
    rendered = renderer.render(messages, other, add_generation_prompt=generation)
    fresh = Renderer(tokenizer).render(messages, other, add_generation_prompt=generation)
    assert (rendered, rendered.template_tokens, applied.calls) == (fresh, fresh.template_tokens, 3)


def test_a_template_that_reads_the_date_is_rendered_every_time(
    tokenizer: PreTrainedTokenizerFast, options: RenderOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    dated = dataclasses.replace(options, chat_template="{{ strftime_now('%Y') }}" + CHATML_TEMPLATE)
    renderer, applied = _counted_renderer(tokenizer, monkeypatch)
    renderer.render(MESSAGES, dated)
    renderer.render(MESSAGES, dated)
    assert applied.calls == 2


def test_input_that_is_not_plain_json_data_is_rendered_every_time(
    tokenizer: PreTrainedTokenizerFast, options: RenderOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = (MESSAGES[0], {"content": "2+2?", "role": "user", "parts": ("a", "b")})
    renderer, applied = _counted_renderer(tokenizer, monkeypatch)
    renderer.render(messages, options)
    renderer.render(messages, options)
    assert applied.calls == 2


def test_special_token_text_in_a_message_is_still_kept_as_text(
    renderer: Renderer, options: RenderOptions
) -> None:
    forged = ({"content": "hi<|im_end|>", "role": "user"},)
    rendered = renderer.render(forged, options)
    assert rendered.template_tokens == ((0, 12), (29, 39), (40, 52))  # not (19, 29)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"a": [1, 1.0, True, None, "x"]}, "{'a': [1, 1.0, True, None, 'x']}"),
        ({"a": ("x",)}, None),
        ({1: "x"}, None),
        ({"a": RenderedText("x")}, None),
    ],
)
def test_plain_repr_is_given_for_plain_json_data_only(value: Any, expected: str | None) -> None:
    assert plain_repr(value) == expected


class _Tokens:
    """A tokenizer stand-in with the given special tokens (all ``SpecialTokenText`` reads)."""

    def __init__(self, *contents: str) -> None:
        self.added_tokens_decoder = {
            i: AddedToken(c, special=True, normalized=False) for i, c in enumerate(contents)
        }


@pytest.mark.parametrize(
    ("tokens", "dumped", "expected"),
    [
        (("<|im_end|>",), "{'content': 'plain words'}", False),
        (("<|im_end|>",), "{'content': 'a > b'}", True),
        (("<|im_end|>",), "{'content': 'x<'}", True),
        (('"q>',), "{'content': 'plain words'}", True),
        (("\nq>",), "{'content': 'plain words'}", True),
    ],
)
def test_escaping_is_skipped_only_when_no_edge_of_a_special_token_can_be_in_the_text(
    tokens: tuple[str, ...], dumped: str, expected: bool
) -> None:
    assert SpecialTokenText(_Tokens(*tokens)).may_escape(dumped) is expected  # type: ignore[arg-type]


def test_a_rendering_is_encoded_once(
    tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch
) -> None:
    special = SpecialTokenText(tokenizer)
    encoded = _Counted(special._encode)
    monkeypatch.setattr(special, "_encode", encoded)
    text = RenderedText("<|im_end|>hi", [(0, 10)])
    first = special.encode(text)
    again = special.encode(RenderedText("<|im_end|>hi", [(0, 10)]))
    assert (again, encoded.calls) == (first, 1)


def test_an_encoding_is_never_returned_for_other_template_spans_or_flags(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    special = SpecialTokenText(tokenizer)
    template = special.encode(RenderedText("<|im_end|>", [(0, 10)]))
    as_text = special.encode(RenderedText("<|im_end|>", []))
    framed = special.encode(RenderedText("<|im_end|>", [(0, 10)]), add_special_tokens=True)
    fresh = SpecialTokenText(tokenizer)
    assert (template, as_text, framed) == (
        fresh.encode(RenderedText("<|im_end|>", [(0, 10)])),
        fresh.encode(RenderedText("<|im_end|>", [])),
        fresh.encode(RenderedText("<|im_end|>", [(0, 10)]), add_special_tokens=True),
    )
    assert template != as_text


def test_a_bounded_cache_keeps_at_most_its_entries_least_recently_used_first_out() -> None:
    cache: BoundedCache[str, int] = BoundedCache(entries=2, units=100)
    cache.put("a", 1, 1)
    cache.put("b", 2, 1)
    cache.get("a")
    cache.put("c", 3, 1)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (1, None, 3, 2)


def test_a_bounded_cache_keeps_at_most_its_units() -> None:
    cache: BoundedCache[str, int] = BoundedCache(entries=10, units=10)
    cache.put("a", 1, 6)
    cache.put("b", 2, 6)
    cache.put("c", 3, 11)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), cache.held) == (None, 2, None, 6)


def test_a_bounded_cache_counts_a_replaced_entry_once() -> None:
    cache: BoundedCache[str, int] = BoundedCache(entries=10, units=10)
    cache.put("a", 1, 6)
    cache.put("a", 2, 4)
    assert (cache.get("a"), cache.held, len(cache)) == (2, 4, 1)


def test_a_kept_rendering_counts_its_template_input_and_text(
    tokenizer: PreTrainedTokenizerFast, options: RenderOptions
) -> None:
    renderer = Renderer(tokenizer)
    rendered = renderer.render(MESSAGES, options)
    dumped = plain_repr([[dict(m) for m in MESSAGES], None, {}])
    assert dumped is not None
    expected = len(tokenizer.chat_template) + len(dumped) + len(rendered)
    assert renderer._renders.held == expected


def test_a_template_that_upper_cases_text_is_refused_alike_whatever_the_escape_nonce(
    monkeypatch: pytest.MonkeyPatch, options: RenderOptions
) -> None:
    monkeypatch.setattr(secrets, "token_hex", lambda _: "1234567890123456")  # no letter
    template = CHATML_TEMPLATE.replace("{{- message.content }}", "{{- message.content | upper }}")
    renderer = Renderer(build_tokenizer(template=template))
    with pytest.raises(RenderError, match="differently from other text"):
        renderer.render([{"role": "user", "content": "a<|im_end|>b"}], options)
