"""FSDP2 on two torchrun ranks (gloo, CPU) trains the weights one process trains, and its
gathered state is ordinary one-process state (``docs/train.md``, "Sharded training with FSDP2").

One launch of ``tests/e2e/fsdp_worker.py`` trains three steps of eight rows (four a rank, micro
batch 1) and writes the gathered weights and optimizer state; both launches run with
``OMP_NUM_THREADS=1``. The reference is one process training the same rows with the same
two-rank layout (``SingleProcess(2)``). FSDP sums each micro batch's gradient into its shard
as it goes, one process sums a shard's micro batches first: the floats differ in summation
order only, hence 1e-5 rather than bitwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from grove.training.checkpoint import (
    CheckpointMetadata,
    ResumeExpectation,
    load_checkpoint,
    save_checkpoint,
)
from grove.training.errors import BatchError
from grove.training.fsdp import check_equal_passes
from grove.training.row_sharding import SingleProcess, shard_rows
from grove.training.trainer import Trainer
from tests.e2e.fsdp_worker import learner, step_batches
from tests.unit.trainer.tiny_lm import tiny_causal_lm

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5  # float32, summation order

pytestmark = pytest.mark.xdist_group("data_parallel")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The worker's output directory after one two-rank launch."""
    out = tmp_path_factory.mktemp("fsdp")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    result = subprocess.run(
        [*torchrun, "--nproc-per-node=2", str(ROOT / "tests/e2e/fsdp_worker.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _one_process(steps: slice) -> Trainer:
    torch.set_num_threads(1)
    trainer = learner(tiny_causal_lm(seed=0), SingleProcess(2))
    for batch in step_batches()[steps]:
        trainer.train_step(batch)
    return trainer


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def _load(path: Path) -> Any:
    return torch.load(path, weights_only=True)


def test_three_sharded_steps_on_two_ranks_reach_the_single_process_weights(sharded: Path) -> None:
    one = _one_process(slice(None)).model.state_dict()

    assert _largest_difference(_load(sharded / "final.pt"), one) <= TOLERANCE
    # ... and the weights moved far more than that: the test compares trained weights.
    assert _largest_difference(one, tiny_causal_lm(seed=0).state_dict()) > 100 * TOLERANCE


def test_the_gathered_state_is_an_ordinary_checkpoint_that_resumes_in_one_process(
    sharded: Path, tmp_path: Path
) -> None:
    gathered = _load(sharded / "step2.pt")
    writer = learner(tiny_causal_lm(seed=1), SingleProcess(2))
    writer.model.load_state_dict(gathered["model"])
    writer.optimizer.load_state_dict(gathered["optimizer"])
    path = save_checkpoint(
        tmp_path,
        model=writer.model,
        optimizer=writer.optimizer,
        scheduler=None,
        metadata=CheckpointMetadata(
            step=2,
            forest_mode=True,
            execution_row_multiple=2,
            selection_policy="returned_history",
            config_digest="digest",
            data_parallel_size=2,
        ),
    )
    resumed = learner(tiny_causal_lm(seed=2), SingleProcess(2))
    load_checkpoint(
        path,
        model=resumed.model,
        optimizer=resumed.optimizer,
        scheduler=None,
        expect=ResumeExpectation(forest_mode=True, execution_row_multiple=2, data_parallel_size=2),
    )

    resumed.train_step(step_batches()[-1])

    final = _load(sharded / "final.pt")
    assert _largest_difference(resumed.model.state_dict(), final) <= TOLERANCE


def test_the_gathered_state_resumes_on_two_sharded_ranks(sharded: Path) -> None:
    # The worker's second sharded model loaded the step-2 state (load_full_state) and trained
    # step 3 on the same two ranks.
    assert _largest_difference(_load(sharded / "resumed.pt"), _load(sharded / "final.pt")) <= (
        TOLERANCE
    )


def test_each_of_two_ranks_holds_about_half_the_parameter_and_optimizer_bytes(
    sharded: Path,
) -> None:
    measured = json.loads((sharded / "bytes.json").read_text())

    assert measured["rank"] / measured["single"] < 0.6


def test_a_micro_batch_plan_with_unequal_passes_per_rank_is_refused() -> None:
    shards = shard_rows(4, 2)  # rank 0: rows 0-1, rank 1: rows 2-3
    check_equal_passes([slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 4)], shards)  # 2 and 2

    # a plan that keeps rows 1-2 together gives rank 0 two passes and rank 1 one
    with pytest.raises(
        BatchError, match=r"same number of micro batches on every rank, got \[2, 1\]"
    ):
        check_equal_passes([slice(0, 1), slice(1, 3), slice(3, 4)], shards)
