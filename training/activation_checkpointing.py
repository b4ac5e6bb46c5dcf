"""Activation checkpointing per decoder layer (``policy.dtensor_cfg.activation_checkpointing``).

Each decoder layer's forward runs under ``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)``: its activations are dropped after the forward and recomputed from the
layer's input during the backward. Memory for activations falls from one set per layer to one
layer's input per layer; compute rises by one forward per layer.

Hugging Face causal LMs (the embedded Qwen2-style models and any directory's Llama-family model)
do this through their own ``gradient_checkpointing_enable`` with ``use_reentrant: False``, which
wraps exactly the decoder layers. The recomputed forward runs the same operations on the same
inputs in the same order (dropout is off in every Grove model), so in float32 on the CPU the
gradients are bitwise those of the plain backward (``tests/unit/trainer/
test_activation_checkpointing.py``).
"""

from __future__ import annotations

import torch

from grove.training.errors import TrainingError

__all__ = ["enable_activation_checkpointing"]


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Checkpoint every decoder layer of ``model`` (a Hugging Face causal LM) in training mode.
    Raises ``TrainingError`` for a model that does not support gradient checkpointing."""
    settings = {"use_reentrant": False}
    # transformers 5 renamed gradient_checkpointing_enable to activation_checkpointing_enable
    enable_new = getattr(model, "activation_checkpointing_enable", None)
    enable_old = getattr(model, "gradient_checkpointing_enable", None)
    if not getattr(model, "supports_gradient_checkpointing", False) or not (
        callable(enable_new) or callable(enable_old)
    ):
        raise TrainingError(
            "activation_checkpointing",
            f"policy.dtensor_cfg.activation_checkpointing: true checkpoints decoder layers of a "
            f"Hugging Face causal LM, but {type(model).__name__} does not support gradient "
            "checkpointing; turn the key off for this model",
        )
    if callable(enable_new):
        enable_new(activation_checkpointing_kwargs=settings)
    elif callable(enable_old):
        enable_old(gradient_checkpointing_kwargs=settings)
