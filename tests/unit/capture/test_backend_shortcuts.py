"""``Renderer.decode`` goes straight to the tokenizers backend only where the tokenizer's own
decode would do nothing else, and gives exactly the tokenizer's text."""

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
