"""Decoder-only causal LMs built in code, random weights from a seed, nothing downloaded: the
benches' larger models and the tests' tiny ones (``tests/unit/trainer/tiny_lm.py``) come from
one builder."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

__all__ = ["FAMILIES", "causal_lm"]

FAMILIES: dict[str, tuple[type[Any], type[PreTrainedModel]]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}
"""The transformers config and model class of each family ``causal_lm`` builds."""


def causal_lm(
    family: str,
    *,
    seed: int,
    vocab_size: int,
    hidden_size: int,
    layers: int,
    heads: int,
    kv_heads: int,
    context: int,
    intermediate_size: int | None = None,
    **extra: Any,
) -> PreTrainedModel:
    """A ``family`` causal LM (``FAMILIES``) of ``layers`` decoder layers, ``heads`` attention
    heads over ``kv_heads`` key-value heads, an MLP of ``intermediate_size`` (default twice the
    hidden size) and ``context`` positions; ``extra`` are further config keys. Its weights are
    drawn after ``torch.manual_seed(seed)``; it is in train mode."""
    config_class, model_class = FAMILIES[family]
    config = config_class(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=context,
        **extra,
    )
    torch.manual_seed(seed)
    return model_class(config)
