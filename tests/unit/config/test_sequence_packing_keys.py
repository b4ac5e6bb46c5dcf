"""``policy.sequence_packing.*``: the run's trainer packs rows into token-budget bins, same loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grove.config import ConfigurationError, load_config
from grove.training.sequence_packing import recompute_packed_logprobs
from tests.unit.config.steps import rows_batch, training_run

PACKED = {"sequence_packing": {"enabled": True, "train_mb_tokens": 12, "logprob_mb_tokens": 6}}
SHORT = {"max_total_sequence_length": 6}


def _input_shapes(model: torch.nn.Module) -> list[tuple[int, ...]]:
    """The input ids' shape of every forward pass of ``model`` from now on."""
    shapes: list[tuple[int, ...]] = []

    def record(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        shapes.append(tuple(args[0].shape))

    model.register_forward_hook(record)
    return shapes


def test_sequence_packing_trains_bins_of_train_mb_tokens_with_the_same_loss(
    tmp_path: Path,
) -> None:
    def step(directory: Path, packing: dict[str, Any]) -> tuple[list[tuple[int, ...]], float]:
        training = training_run(directory, {"policy": {**SHORT, **packing}})
        shapes = _input_shapes(training.model)
        report = training.trainer.train_step(rows_batch(4))
        return shapes, report.loss

    rows_shapes, rows_loss = step(tmp_path / "rows", {})
    packed_shapes, packed_loss = step(tmp_path / "packed", PACKED)

    # Four 6-token rows: micro batches of 2 rows run (2, 6) twice; bins of 12 tokens hold two
    # rows each, one sequence (1, 12) per bin.
    assert rows_shapes == [(2, 6), (2, 6)]
    assert packed_shapes == [(1, 12), (1, 12)]
    assert packed_loss == pytest.approx(rows_loss, abs=1e-6)


def test_logprob_mb_tokens_bounds_the_recompute_passes(tmp_path: Path) -> None:
    training = training_run(tmp_path, {"policy": {**SHORT, **PACKED}})
    shapes = _input_shapes(training.model)
    batch = rows_batch(4)
    packing = training.config.policy.sequence_packing

    recompute_packed_logprobs(
        training.model, batch.token_ids, batch.loss_mask, tokens=packing.logprob_mb_tokens
    )

    # Bins of 6 tokens hold one 6-token row each.
    assert shapes == [(1, 6)] * 4


def test_sequence_packing_makes_the_row_multiple_the_data_parallel_size() -> None:
    packed = load_config({"policy": {"data_parallel_size": 2, **PACKED, **SHORT}})
    fixed = load_config({"policy": {"data_parallel_size": 2, "train_micro_batch_size": 4}})

    assert packed.policy.execution_row_multiple == 2
    assert fixed.policy.execution_row_multiple == 8


def test_an_algorithm_other_than_first_fit_decreasing_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="first_fit_decreasing"):
        load_config({"policy": {"sequence_packing": {"algorithm": "best_fit"}}})


def test_bins_smaller_than_the_longest_row_are_refused() -> None:
    with pytest.raises(ConfigurationError) as refused:
        load_config({"policy": {"sequence_packing": {"enabled": True, "train_mb_tokens": 100}}})

    assert refused.value.problems == (
        "policy.sequence_packing.train_mb_tokens (100) must be at least "
        "policy.max_total_sequence_length (4096): every row must fit one bin",
    )


def test_sequence_packing_with_tree_packing_is_refused() -> None:
    with pytest.raises(ConfigurationError) as refused:
        load_config({"policy": {"sequence_packing": {"enabled": True}, "tree_packing": True}})

    assert refused.value.problems == (
        "policy.sequence_packing.enabled and policy.tree_packing lay out a micro batch two "
        "ways: tree packing computes the shared prefixes of whole rollouts once, sequence "
        "packing gives every row its own attention context in token-budget bins; turn one off",
    )
