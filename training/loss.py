"""Token-level clipped policy-gradient loss (GRPO) on forest rows, and train/generation diagnostics.

The loss, per retained token ``t`` of row ``r`` with the row's broadcast advantage ``A_r``::

    ratio_t = exp(logp_trainer_t - logp_generation_t)                 # importance ratio
    loss_t  = max(-A_r * ratio_t, -A_r * clamp(ratio_t, 1 - eps_low, 1 + eps_high))
    loss    = sum_t loss_t / N

where ``N`` is the number of retained valid tokens in the whole step (every micro batch together),
so a step split into micro batches sums to the same loss and gradient as one pass. A token is
retained when its loss mask is 1, its row belongs to a logical owner (owner index >= 0) and its
row is kept (``row_mask``). Padding rows and masked rows therefore contribute nothing, to the loss
or to ``N``. How it departs from the textbook PPO: the ratio is taken against the generation
engine's logprobs (the behaviour policy), because Grove takes one optimizer step per batch, and
the advantage is one number per logical rollout, broadcast to all of its rows.

Diagnostics, over the same retained tokens, as ``docs/metrics.md`` defines them ("Trainer and
generation agreement: TMPE and generation KL"), with ``r = logp_trainer - logp_generation``:

- token multiplicative probability error (TMPE): ``exp(|r|)`` per token; its mean and its max;
- generation KL error: the k3 estimator of KL(generation || trainer), ``exp(r) - 1 - r`` per
  token, mean.

TMPE is also pooled per logical rollout over its uniquely owned generated tokens (loss mask and
owner, before any row is excluded), each token with equal weight, so splitting a rollout into more
rows does not change its value; the pooling is ``grove.training.advantages.pooled_logprob_error``,
the same function that decides ``grpo.seq_logprob_error_threshold``. Tokens whose logprobs are not
finite are left out of the diagnostics.

The threshold decides per logical rollout, but the sequence error is also reported per physical
row (``row_sequence_errors``): the same pooling over each retained row's owned tokens. A rollout's
pooled error is the token-weighted mean of its rows' errors, so a kept rollout can have a row
above the threshold; the row figures show how often that happens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grove.training.advantages import pooled_logprob_error
from grove.training.errors import BatchError

__all__ = [
    "DEFAULT_CLIP",
    "ClipRange",
    "LossResult",
    "RowSequenceErrors",
    "TokenDiagnostics",
    "clipped_policy_gradient_loss",
    "retained_token_mask",
    "row_sequence_errors",
    "token_diagnostics",
]


@dataclass(frozen=True)
class ClipRange:
    """The importance-ratio clip interval ``[1 - low, 1 + high]`` (``loss_fn.ratio_clip_*``)."""

    low: float = 0.2
    high: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.low < 1.0 or self.high < 0.0:
            raise BatchError(
                "clip_range",
                f"the clip range needs 0 <= low < 1 and high >= 0, got low={self.low}, "
                f"high={self.high}",
            )


DEFAULT_CLIP = ClipRange()
"""PPO's symmetric 0.2 clip."""


@dataclass(frozen=True)
class TokenDiagnostics:
    """Train/generation agreement over one step's tokens; produced by ``token_diagnostics``.

    ``token_mult_prob_error`` and ``gen_kl_error`` are means, ``max_token_mult_prob_error`` the
    largest token value, over the retained tokens (1.0, 1.0 and 0.0 when there are none).
    ``rollout_token_mult_prob_error[i]`` pools logical rollout ``i``'s owned tokens; ``None`` when
    the rollout owns no token with finite logprobs.
    """

    token_mult_prob_error: float
    max_token_mult_prob_error: float
    gen_kl_error: float
    diagnostic_tokens: int
    rollout_token_mult_prob_error: tuple[float | None, ...]


@dataclass(frozen=True)
class LossResult:
    """One micro batch's loss: ``loss`` is a differentiable scalar already divided by the step's
    retained token count; ``retained_tokens`` counts this micro batch's retained tokens and
    ``clipped_tokens`` those whose ratio was clipped in the direction that binds."""

    loss: torch.Tensor
    retained_tokens: int
    clipped_tokens: int


def _check_row_shapes(
    token_values: dict[str, torch.Tensor], row_values: dict[str, torch.Tensor]
) -> tuple[int, int]:
    shapes = {name: tuple(value.shape) for name, value in token_values.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(shape != first for shape in shapes.values()):
        raise BatchError("row_shapes", f"per-token tensors must all be [rows, tokens]: {shapes}")
    rows = first[0]
    for name, value in row_values.items():
        if tuple(value.shape) != (rows,):
            raise BatchError(
                "row_shapes", f"{name} must be [rows] = [{rows}], got {list(value.shape)}"
            )
    return first


def retained_token_mask(
    loss_mask: torch.Tensor, owners: torch.Tensor, row_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Boolean ``[R, T]``: tokens that count for loss (mask 1, real owner, row kept)."""
    _check_row_shapes({"loss_mask": loss_mask}, {"owners": owners})
    kept = owners >= 0
    if row_mask is not None:
        _check_row_shapes({"loss_mask": loss_mask}, {"row_mask": row_mask})
        kept = kept & row_mask.bool()
    return loss_mask.bool() & kept[:, None]


def clipped_policy_gradient_loss(
    trainer_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    retained: torch.Tensor,
    *,
    step_retained_tokens: int,
    clip: ClipRange = DEFAULT_CLIP,
) -> LossResult:
    """The GRPO loss of one micro batch, normalized by the whole step's retained token count.

    ``trainer_logprobs``, ``generation_logprobs`` and ``retained`` are ``[R, T]`` and aligned with
    the row's tokens (position ``t`` is the logprob of token ``t``); ``advantages`` is ``[R]``.
    Summing the results of a step's micro batches gives the step's loss. Non-finite values at
    positions that are not retained are ignored; a non-finite generation logprob on a retained
    token is an error.
    """
    _check_row_shapes(
        {
            "trainer_logprobs": trainer_logprobs,
            "generation_logprobs": generation_logprobs,
            "retained": retained,
        },
        {"advantages": advantages},
    )
    if step_retained_tokens < 0:
        raise BatchError(
            "retained_tokens",
            f"the step's retained token count is negative: {step_retained_tokens}",
        )
    retained = retained.bool()
    if not torch.isfinite(generation_logprobs[retained]).all():
        raise BatchError(
            "finite_generation_logprobs",
            "a retained token has a non-finite generation logprob; the capture is corrupt",
        )
    # Masked positions are replaced, not multiplied by zero, so that a NaN or inf there (padding)
    # can reach neither the loss nor its gradient.
    log_ratio = torch.where(retained, trainer_logprobs - generation_logprobs, 0.0)  # (R, T)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - clip.low, 1.0 + clip.high)
    row_advantage = advantages.to(ratio.dtype)[:, None]  # (R, 1)
    unclipped_loss = -row_advantage * ratio
    clipped_loss = -row_advantage * clipped_ratio
    token_loss = torch.where(retained, torch.maximum(unclipped_loss, clipped_loss), 0.0)
    clipped_tokens = int((retained & (clipped_loss > unclipped_loss)).sum())
    loss = token_loss.sum() / max(step_retained_tokens, 1)
    return LossResult(loss=loss, retained_tokens=int(retained.sum()), clipped_tokens=clipped_tokens)


@torch.no_grad()
def token_diagnostics(
    trainer_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    owners: torch.Tensor,
    *,
    logical_rollouts: int,
    row_mask: torch.Tensor | None = None,
) -> TokenDiagnostics:
    """TMPE (mean, max, per rollout) and generation KL error (mean) of one step.

    Step values use the retained tokens (``retained_token_mask``); per-rollout values use every
    token the rollout owns, kept row or not, so a threshold can be decided from them.
    """
    _check_row_shapes(
        {
            "trainer_logprobs": trainer_logprobs,
            "generation_logprobs": generation_logprobs,
            "loss_mask": loss_mask,
        },
        {"owners": owners},
    )
    if owners.numel() and int(owners.max()) >= logical_rollouts:
        raise BatchError(
            "owner_index",
            f"owner index {int(owners.max())} is outside the {logical_rollouts} logical rollouts",
        )
    finite = torch.isfinite(trainer_logprobs) & torch.isfinite(generation_logprobs)
    retained = retained_token_mask(loss_mask, owners, row_mask) & finite
    log_ratio = torch.where(retained, trainer_logprobs.double() - generation_logprobs.double(), 0.0)
    tmpe = torch.exp(log_ratio.abs())  # (R, T)
    kl = torch.exp(log_ratio) - 1.0 - log_ratio  # (R, T), k3 with logr = trainer - generation
    count = int(retained.sum())
    pooled = pooled_logprob_error(
        generation_logprobs,
        trainer_logprobs,
        loss_mask.bool() & finite,
        owners[:, None].expand_as(loss_mask),
        logical_rollouts,
    )
    return TokenDiagnostics(
        token_mult_prob_error=float(tmpe[retained].mean()) if count else 1.0,
        max_token_mult_prob_error=float(tmpe[retained].max()) if count else 1.0,
        gen_kl_error=float(kl[retained].mean()) if count else 0.0,
        diagnostic_tokens=count,
        rollout_token_mult_prob_error=tuple(
            None if math.isnan(value) else value for value in pooled.tolist()
        ),
    )


@dataclass(frozen=True)
class RowSequenceErrors:
    """Per physical row sequence errors of one step (producer: ``row_sequence_errors``;
    consumer: the step's metrics, ``docs/metrics.md``).

    A row's error is the mean TMPE over the generated tokens it owns; ``max`` and ``mean`` are
    over the retained rows (a real owner, not excluded by ``row_mask``) that own a token with
    finite logprobs (1.0 and 1.0 when there is none), ``rows`` how many those are, and
    ``over_threshold`` how many of them exceed the threshold."""

    max: float
    mean: float
    rows: int
    over_threshold: int

    def metrics(self) -> dict[str, float]:
        """The step metrics ``train/row_seq_logprob_error_max``, ``..._mean`` and
        ``train/rows_over_seq_logprob_error_threshold``."""
        return {
            "train/row_seq_logprob_error_max": self.max,
            "train/row_seq_logprob_error_mean": self.mean,
            "train/rows_over_seq_logprob_error_threshold": float(self.over_threshold),
        }


@torch.no_grad()
def row_sequence_errors(
    trainer_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    owners: torch.Tensor,
    *,
    row_mask: torch.Tensor | None,
    threshold: float,
) -> RowSequenceErrors:
    """Each retained row's sequence error (``pooled_logprob_error`` with the row as owner of its
    owned tokens), and how many exceed ``threshold`` (``grpo.seq_logprob_error_threshold``).

    ``trainer_logprobs``, ``generation_logprobs`` and ``loss_mask`` are ``[R, T]``, ``owners``
    and ``row_mask`` ``[R]`` as in ``retained_token_mask``."""
    rows, _ = _check_row_shapes(
        {
            "trainer_logprobs": trainer_logprobs,
            "generation_logprobs": generation_logprobs,
            "loss_mask": loss_mask,
        },
        {"owners": owners},
    )
    retained = retained_token_mask(loss_mask, owners, row_mask) & torch.isfinite(trainer_logprobs)
    row_ids = torch.arange(rows)[:, None].expand_as(loss_mask)
    per_row = pooled_logprob_error(
        generation_logprobs.cpu(),
        trainer_logprobs.cpu(),
        retained.cpu(),
        torch.where(retained.cpu(), row_ids, -1),
        rows,
    )  # (R,) float64, NaN for a row with no retained finite token
    errors = per_row[~per_row.isnan()]
    if not errors.numel():
        return RowSequenceErrors(max=1.0, mean=1.0, rows=0, over_threshold=0)
    return RowSequenceErrors(
        max=float(errors.max()),
        mean=float(errors.mean()),
        rows=int(errors.numel()),
        over_threshold=int((errors > threshold).sum()),
    )
