"""``Renderer.decode`` and ``SpecialTokenText.plain_encode`` go straight to the tokenizers
backend only where the tokenizer's own method would do nothing else, and give exactly its result."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from grove.capture.embedded import build_tokenizer
from grove.capture.render import Renderer


@pytest.mark.parametrize(
    "text", ["plain words", "<|im_start|>user\nhi<|im_end|>\n", "café ☕ 🍵", ""]
)
def test_decode_gives_the_tokenizers_exact_text(
    tokenizer: PreTrainedTokenizerFast, renderer: Renderer, text: str
) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    for cut in (ids, ids[:-1]):  # the last cut may end inside a character
        expected = tokenizer.decode(
            cut, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        assert renderer.decode(tuple(cut)) == expected


class _OwnDecode(PreTrainedTokenizerFast):
    """A fast tokenizer whose decode does more than its backend's (upper-cases the text)."""

    def _decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        return str(super()._decode(token_ids, skip_special_tokens, **kwargs)).upper()


def test_a_tokenizer_with_its_own_decode_decodes_through_it() -> None:
    base = build_tokenizer()
    own = _OwnDecode(tokenizer_object=base.backend_tokenizer)
    ids = base.encode("plain words", add_special_tokens=False)
    assert Renderer(own).decode(ids) == "PLAIN WORDS"


@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("text", ["plain words", "<|im_start|>user\nhi<|im_end|>\n", "café ☕", ""])
def test_plain_encode_gives_the_tokenizers_exact_ids(
    tokenizer: PreTrainedTokenizerFast, renderer: Renderer, text: str, special: bool
) -> None:
    expected = tokenizer.encode(text, add_special_tokens=special)
    assert renderer.special_text.plain_encode(text, add_special_tokens=special) == expected


def test_plain_encode_goes_through_the_tokenizer_when_its_backend_truncates() -> None:
    tokenizer = build_tokenizer()
    special = Renderer(tokenizer).special_text
    tokenizer.backend_tokenizer.enable_truncation(max_length=2)
    ids = special.plain_encode("plain words")  # the tokenizer's encode turns truncation off
    whole = build_tokenizer().encode("plain words", add_special_tokens=False)
    assert (ids, tokenizer.backend_tokenizer.truncation) == (whole, None)


def test_plain_encode_goes_through_the_tokenizer_when_it_splits_special_tokens() -> None:
    tokenizer = build_tokenizer()
    special = Renderer(tokenizer).special_text
    tokenizer.split_special_tokens = True
    assert 2 not in special.plain_encode("<|im_end|>")  # matched as text, not as the token


class _OwnEncode(PreTrainedTokenizerFast):
    """A fast tokenizer whose encoding does more than its backend's (adds a token)."""

    def _encode_plus(self, *args: Any, **kwargs: Any) -> Any:
        encoded = super()._encode_plus(*args, **kwargs)
        encoded["input_ids"] = [*encoded["input_ids"], 0]
        return encoded


def test_a_tokenizer_with_its_own_encoding_encodes_through_it() -> None:
    base = build_tokenizer()
    own = _OwnEncode(tokenizer_object=base.backend_tokenizer)
    ids = Renderer(own).special_text.plain_encode("plain words")
    assert ids == [*base.encode("plain words", add_special_tokens=False), 0]
