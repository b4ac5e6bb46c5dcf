"""A tiny Qwen2 causal LM built in code (random init, nothing downloaded) and synthetic rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedModel, Qwen2ForCausalLM

from bench.support.decoders import causal_lm
from grove.training.batch import LogicalRollout
from grove.training.forest import CallRecord, build_forest
from grove.training.rows import rollout_rows
from grove.training.trainer import StepBatch, Trainer

VOCAB = 48


def tiny_decoder(family: str, *, seed: int, **extra: Any) -> PreTrainedModel:
    """A ``family`` causal LM (``bench.support.decoders.FAMILIES``) of ``VOCAB`` tokens: two
    layers, hidden size 32, 4 attention heads over 2 key-value heads, 64 positions; ``extra``
    are further config keys."""
    shape = {"hidden_size": 32, "layers": 2, "heads": 4, "kv_heads": 2, "context": 64}
    return causal_lm(family, seed=seed, vocab_size=VOCAB, **shape, **extra)


def tiny_causal_lm(
    *, seed: int, dropout: float = 0.0, dtype: torch.dtype = torch.float32
) -> Qwen2ForCausalLM:
    """The tiny Qwen2 (``tiny_decoder``), tied embeddings; ``dropout`` on attention weights."""
    model = tiny_decoder("qwen2", seed=seed, attention_dropout=dropout, tie_word_embeddings=True)
    return cast(Qwen2ForCausalLM, model.to(dtype))


def tiny_absolute_position_lm(*, seed: int) -> GPT2LMHeadModel:
    """A two-layer GPT-2 with learned absolute positions: unlike rotary embeddings, which see only
    relative positions, it notices position ids that fail to restart in each packed row."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        attn_pdrop=0.0,
        embd_pdrop=0.0,
        resid_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def sgd_trainer(
    model: torch.nn.Module,
    batch: StepBatch,
    *,
    lr: float = 0.1,
    micro_batch_size: int = 2,
    **settings: Any,
) -> Trainer:
    """A ``Trainer`` of ``model`` with plain SGD at ``lr`` for ``batch``'s logical rollouts;
    ``settings`` are further ``Trainer`` keywords."""
    return Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=lr),
        global_batch_rollouts=batch.logical_rollouts,
        micro_batch_size=micro_batch_size,
        **settings,
    )


def synthetic_step_batch(
    *,
    rows_per_rollout: Sequence[int],
    padding_rows: int = 0,
    length: int = 12,
    generator: torch.Generator | None = None,
) -> StepBatch:
    """Random rows: rollout ``i`` gets ``rows_per_rollout[i]`` rows; each row's second half is
    owned generated tokens with random generation logprobs; ``padding_rows`` fully masked rows
    with owner -1 follow. Draws from ``generator`` (or torch's global generator)."""
    owners = [index for index, rows in enumerate(rows_per_rollout) for _ in range(rows)]
    real = len(owners)
    total = real + padding_rows
    token_ids = torch.randint(0, VOCAB, (total, length), generator=generator)
    loss_mask = torch.zeros(total, length, dtype=torch.bool)
    loss_mask[:real, length // 2 :] = True
    generation_logprobs = -3.0 * torch.rand(total, length, generator=generator) - 0.5
    rollout_advantages = torch.randn(len(rows_per_rollout), generator=generator)
    advantages = torch.zeros(total)
    advantages[:real] = rollout_advantages[owners]
    return StepBatch(
        token_ids=token_ids,
        loss_mask=loss_mask,
        generation_logprobs=generation_logprobs,
        advantages=advantages,
        owners=torch.tensor(owners + [-1] * padding_rows),
        logical_rollouts=len(rows_per_rollout),
    )


def forest_rollout(rollout_id: str, *, rewrite: bool, group_id: str = "g0") -> LogicalRollout:
    """Two calls: c1 answers prompt [1, 2, 3] with [4, 5]; c2 adds observation [6, 7] and answers
    [8, 9]. Without a rewrite c2 continues c1 (one row of 9 tokens); with one, c2 is a new root
    (rows [1..5] and [6..9])."""
    calls = [
        CallRecord("c1", None, [1, 2, 3], [4, 5], [-0.5, -0.7]),
        CallRecord("c2", None if rewrite else "c1", [6, 7], [8, 9], [-0.2, -0.9]),
    ]
    forest = build_forest(calls, ["c1", "c2"], terminal="c2", strict=True)
    return LogicalRollout(rollout_id, group_id, tuple(rollout_rows(forest)))
