"""The shape every embedded tiny model shares, and building one from a seed.

The embedded engines' models (``grove.capture.embedded.build_model``, a Qwen2;
``grove.capture.embedded_moe.build_moe_model``, a Qwen2-MoE; and the language half of
``grove.capture.embedded_vlm.build_vlm_model``, a Qwen2-VL) are one decoder shape: a vocabulary
the tokenizer's size, an MLP twice the hidden size, 4 attention heads over 2 key-value heads,
tied input and output embeddings, and the tokenizer's end and padding tokens.
``tiny_decoder_config`` holds those keys once; each builder adds its architecture's own.
``seeded`` builds a model from ``seed`` and leaves the global torch random state as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from transformers import PreTrainedTokenizerBase

__all__ = ["seeded", "tiny_decoder_config"]

M = TypeVar("M", bound=torch.nn.Module)


def tiny_decoder_config(
    tokenizer: PreTrainedTokenizerBase, *, hidden_size: int, num_layers: int, context_length: int
) -> dict[str, Any]:
    """The decoder keys of a transformers config (Qwen2 names) for a model sized for
    ``tokenizer``."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": context_length,
        "tie_word_embeddings": True,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def seeded(seed: int, build: Callable[[], M]) -> M:
    """``build()`` with torch seeded by ``seed``, in eval mode; the global random state is kept."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build().eval()
