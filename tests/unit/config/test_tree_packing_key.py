"""``policy.tree_packing``: the run's trainer computes each shared prefix once, same loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grove.config import ConfigurationError, load_config
from tests.unit.config.steps import rows_batch, training_run


def _input_shapes(model: torch.nn.Module) -> list[tuple[int, ...]]:
    """A list that records the input ids' shape of every forward pass of ``model`` from now on."""
    shapes: list[tuple[int, ...]] = []

    def record(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        shapes.append(tuple(args[0].shape))

    model.register_forward_hook(record)
    return shapes


def test_tree_packing_computes_each_shared_prefix_once_with_the_same_loss(tmp_path: Path) -> None:
    def step(directory: Path, packing: bool) -> tuple[list[tuple[int, ...]], float]:
        training = training_run(directory, {"policy": {"tree_packing": packing}})
        shapes = _input_shapes(training.model)
        report = training.trainer.train_step(rows_batch(4))
        return shapes, report.loss

    rows_shapes, rows_loss = step(tmp_path / "rows", False)
    tree_shapes, tree_loss = step(tmp_path / "tree", True)

    # Four rollouts of one identical 6-token row, micro batches of 2 rows (2 rollouts): row by
    # row each pass runs (2, 6); tree-packed the two rows of a pass are one tree of 6 tokens.
    assert rows_shapes == [(2, 6), (2, 6)]
    assert tree_shapes == [(1, 6), (1, 6)]
    assert tree_loss == pytest.approx(rows_loss, rel=1e-6)


def test_tree_packing_with_a_mixture_of_experts_model_is_refused() -> None:
    with pytest.raises(ConfigurationError) as refused:
        load_config({"policy": {"tree_packing": True}, "model": {"architecture": "moe"}})

    assert refused.value.problems == (
        "policy.tree_packing: true is not supported with model.architecture: moe: tree-packed "
        "training neither replays routed experts nor feeds media; turn policy.tree_packing off",
    )
