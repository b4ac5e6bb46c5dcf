"""The trainer: one optimizer step per logical batch, a scheduler that counts logical rollouts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grove.training.advantages import AdvantageConfig, RolloutOutcome, compute_advantages
from grove.training.batch import assemble_batch
from grove.training.errors import BatchError
from grove.training.trainer import (
    StepBatch,
    Trainer,
    causal_token_logprobs,
    recompute_token_logprobs,
    rollout_warmup_scheduler,
    step_batch,
)
from tests.unit.trainer.tiny_lm import VOCAB, forest_rollout, synthetic_step_batch, tiny_causal_lm


def _trainer(model, *, global_batch_rollouts=4, micro_batch_size=2, warmup_rollouts=10, **kwargs):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = rollout_warmup_scheduler(optimizer, warmup_rollouts=warmup_rollouts)
    return Trainer(
        model,
        optimizer,
        scheduler,
        global_batch_rollouts=global_batch_rollouts,
        micro_batch_size=micro_batch_size,
        **kwargs,
    )


def test_one_optimizer_step_per_logical_batch_when_rows_exceed_rollouts() -> None:
    # 2 rollouts in 5 rows + 1 padding row = 6 rows = 3 micro batches of 2, still one step.
    torch.manual_seed(1)
    trainer = _trainer(tiny_causal_lm(seed=0), global_batch_rollouts=2)
    report = trainer.train_step(synthetic_step_batch(rows_per_rollout=[2, 3], padding_rows=1))
    adam_steps = {float(state["step"]) for state in trainer.optimizer.state.values()}
    assert adam_steps == {1.0}
    assert (report.step, report.optimizer_steps, report.rows, report.padding_rows) == (1, 1, 6, 1)
    assert trainer.step == 1


def test_scheduler_advances_by_logical_rollouts_not_rows() -> None:
    torch.manual_seed(2)
    trainer = _trainer(tiny_causal_lm(seed=0), global_batch_rollouts=3, warmup_rollouts=9)
    first = trainer.train_step(synthetic_step_batch(rows_per_rollout=[3, 2, 4]))
    second = trainer.train_step(synthetic_step_batch(rows_per_rollout=[1, 1, 1]))
    assert trainer.scheduler.last_epoch == 6
    assert (first.scheduler_step_increment, second.scheduler_step_increment) == (3, 3)
    # Warm-up factor (n + 1) / (9 + 1) after n rollouts: 0.1 for step 1, 0.4 for step 2
    # (9 rows before it would have given 1.0).
    assert first.learning_rate == pytest.approx(1e-4)
    assert second.learning_rate == pytest.approx(4e-4)
    assert first.metrics()["scheduler_step_increment"] == 3.0


def test_micro_batch_size_does_not_change_the_update() -> None:
    torch.manual_seed(3)
    batch = synthetic_step_batch(rows_per_rollout=[2, 1, 3])
    parameters = []
    for micro_batch_size in (1, 6):
        model = tiny_causal_lm(seed=0, dtype=torch.float64)
        report = _trainer(
            model, global_batch_rollouts=3, micro_batch_size=micro_batch_size
        ).train_step(batch)
        parameters.append(
            (report.loss, torch.cat([p.detach().flatten() for p in model.parameters()]))
        )
    (loss_a, params_a), (loss_b, params_b) = parameters
    assert loss_a == pytest.approx(loss_b, abs=1e-12)
    torch.testing.assert_close(params_a, params_b, rtol=0, atol=1e-12)


def test_padding_rows_leave_the_update_bitwise_unchanged() -> None:
    torch.manual_seed(4)
    batch = synthetic_step_batch(rows_per_rollout=[1, 1], padding_rows=2)
    unpadded = dataclasses.replace(
        batch,
        token_ids=batch.token_ids[:2],
        loss_mask=batch.loss_mask[:2],
        generation_logprobs=batch.generation_logprobs[:2],
        advantages=batch.advantages[:2],
        owners=batch.owners[:2],
    )
    results = []
    for candidate in (batch, unpadded):
        model = tiny_causal_lm(seed=0)
        report = _trainer(model, global_batch_rollouts=2).train_step(candidate)
        results.append((report.loss, [p.detach().clone() for p in model.parameters()]))
    assert results[0][0] == results[1][0]
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))


def test_masked_rows_train_nothing() -> None:
    torch.manual_seed(5)
    batch = synthetic_step_batch(rows_per_rollout=[1, 1])
    masked = dataclasses.replace(batch, row_mask=torch.tensor([False, False]))
    model = tiny_causal_lm(seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = _trainer(model, global_batch_rollouts=2, max_grad_norm=None)
    trainer.optimizer.param_groups[0]["weight_decay"] = 0.0
    report = trainer.train_step(masked)
    assert (report.loss, report.retained_tokens) == (0.0, 0)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_batch_with_more_rollouts_than_the_global_batch_raises() -> None:
    trainer = _trainer(tiny_causal_lm(seed=0), global_batch_rollouts=2)
    with pytest.raises(
        BatchError, match=r"at most policy\.train_global_batch_size = 2 logical rollouts, got 3"
    ):
        trainer.train_step(synthetic_step_batch(rows_per_rollout=[1, 1, 1]))
    assert trainer.step == 0


def test_batch_below_the_minimum_step_fraction_stops_training() -> None:
    trainer = _trainer(
        tiny_causal_lm(seed=0), global_batch_rollouts=4, min_step_batch_fraction=0.75
    )
    with pytest.raises(BatchError, match="retains 2 of 4 logical rollouts, below the floor of 3"):
        trainer.train_step(synthetic_step_batch(rows_per_rollout=[1, 1]))


def test_batch_above_the_minimum_step_fraction_trains() -> None:
    trainer = _trainer(
        tiny_causal_lm(seed=0), global_batch_rollouts=4, min_step_batch_fraction=0.75
    )
    assert trainer.train_step(synthetic_step_batch(rows_per_rollout=[1, 1, 1])).step == 1


def test_step_report_diagnostics_match_recomputed_logprobs() -> None:
    torch.manual_seed(6)
    model = tiny_causal_lm(seed=0)
    batch = synthetic_step_batch(rows_per_rollout=[2, 1])
    expected = recompute_token_logprobs(model, batch.token_ids, micro_batch_size=3)
    batch = dataclasses.replace(batch, generation_logprobs=expected)
    report = _trainer(model, global_batch_rollouts=2).train_step(batch)
    assert report.diagnostics.token_mult_prob_error == pytest.approx(1.0, abs=1e-5)
    assert report.diagnostics.gen_kl_error == pytest.approx(0.0, abs=1e-6)
    assert report.diagnostics.diagnostic_tokens == 3 * 6


class _Bigram(torch.nn.Module):
    """logits at position t = table[token_t]: p(token_t+1 | token_t) = softmax(table[token_t])."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(
            torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]))
        )

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.table[token_ids]


def test_causal_token_logprobs_reads_token_t_from_the_logits_at_t_minus_one() -> None:
    # Tokens 0, 1, 2: position 0 has no prediction (0.0); p(1 | 0) = 0.25; p(2 | 1) = 0.8.
    logprobs = causal_token_logprobs(_Bigram(), torch.tensor([[0, 1, 2]]))
    assert logprobs.tolist()[0] == pytest.approx(
        [0.0, torch.log(torch.tensor(0.25)).item(), torch.log(torch.tensor(0.8)).item()], abs=1e-6
    )


def test_causal_token_logprobs_rejects_a_model_without_logits() -> None:
    class _Scalar(torch.nn.Module):
        def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
            return token_ids.float().sum()

    with pytest.raises(BatchError, match="must return logits"):
        causal_token_logprobs(_Scalar(), torch.tensor([[0, 1]]))


def test_recompute_token_logprobs_runs_in_eval_mode_and_restores_train_mode() -> None:
    model = tiny_causal_lm(seed=0, dropout=0.5)
    model.train()
    token_ids = torch.randint(0, VOCAB, (3, 8), generator=torch.Generator().manual_seed(0))
    first = recompute_token_logprobs(model, token_ids, micro_batch_size=2)
    second = recompute_token_logprobs(model, token_ids, micro_batch_size=3)
    torch.testing.assert_close(first, second)
    assert model.training


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"loss_mask": torch.ones(2, 5, dtype=torch.bool)},
            r"loss_mask must match token_ids \(2, 4\)",
        ),
        ({"owners": torch.tensor([0, 2])}, r"owner indices must lie in \[-1, 2\), got \[0, 2\]"),
        ({"owners": torch.tensor([0, -1])}, "padding rows .* must carry no loss token"),
        ({"advantages": torch.zeros(3)}, r"advantages must be \(2,\)"),
        ({"logical_rollouts": 0}, "at least one logical rollout"),
    ],
)
def test_malformed_step_batch_raises(change, message) -> None:
    fields = {
        "token_ids": torch.zeros(2, 4, dtype=torch.long),
        "loss_mask": torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1]], dtype=torch.bool),
        "generation_logprobs": torch.zeros(2, 4),
        "advantages": torch.zeros(2),
        "owners": torch.tensor([0, 1]),
        "logical_rollouts": 2,
    }
    with pytest.raises(BatchError, match=message):
        StepBatch(**{**fields, **change})


def test_step_batch_from_an_assembled_forest_batch_broadcasts_logical_advantages() -> None:
    # Rollout a was rewritten (2 rows), b was not (1 row): 3 rows + 1 padding for a multiple of 4.
    # b is flagged by the environment: it trains nothing; with `exclude` the baseline is a's alone,
    # so a's advantage is (1 - 1) / (0 + eps) = 0 — yet a's rows stay in the loss.
    batch = assemble_batch(
        [forest_rollout("a", rewrite=True), forest_rollout("b", rewrite=False)], row_multiple=4
    )
    advantages = compute_advantages(
        [RolloutOutcome("a", "g0", 1.0), RolloutOutcome("b", "g0", 0.0, env_masked=True)],
        AdvantageConfig(),
    )
    prepared = step_batch(batch, advantages)
    assert prepared.owners.tolist() == [0, 0, 1, -1]
    assert prepared.row_mask.tolist() == [True, True, False, False]
    assert prepared.advantages.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert (prepared.logical_rollouts, prepared.rows, prepared.padding_rows) == (2, 4, 1)
    report = _trainer(tiny_causal_lm(seed=0), global_batch_rollouts=2).train_step(prepared)
    # a's rows own c1 (2 tokens) and c2 (2 tokens); b's row is excluded.
    assert report.retained_tokens == 4


def test_step_batch_with_advantages_of_other_rollouts_raises() -> None:
    batch = assemble_batch([forest_rollout("a", rewrite=True)], row_multiple=1)
    advantages = compute_advantages([RolloutOutcome("z", "g0", 1.0)], AdvantageConfig())
    with pytest.raises(BatchError, match="same logical rollouts in the same order"):
        step_batch(batch, advantages)
