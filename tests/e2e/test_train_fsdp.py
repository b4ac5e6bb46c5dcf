"""``grove train`` with ``policy.dtensor_cfg.enabled: true`` under ``torchrun --nproc-per-node 2``
(gloo, CPU) trains an FSDP2-sharded policy to the weights one process reaches, and writes
ordinary schema-5 checkpoints that resume on two sharded ranks and in one process
(``docs/train.md``, "Sharded training with FSDP2").

The run is ``tests/e2e/test_data_parallel.py``'s: two prompt groups of two rollouts a step,
rollout 0 of each group rewritten, four rows a step, two a rank. One process with the same
configuration trains unsharded (sharding needs ranks), so it is the reference. FSDP sums each
micro batch's gradient into its shard as it goes, one process sums a shard's micro batches
first: the floats differ in summation order only, hence 1e-5 rather than bitwise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_data_parallel import _config, _largest_difference, _train, _weights

TOLERANCE = 1e-5  # float32, summation order

pytestmark = pytest.mark.xdist_group("data_parallel")


THRESHOLD = 2.0
"""``grpo.seq_logprob_error_threshold``: far above the engine's disagreement with the trainer, so
it masks nothing, but rank 0 judges every rollout (and reports every row) from its unsharded
copy."""


def _sharded_config(directory: Path) -> Path:
    """``test_data_parallel``'s configuration with ``policy.dtensor_cfg.enabled: true`` and a
    sequence-error threshold."""
    path = _config(directory)
    config = yaml.safe_load(path.read_text())
    config["policy"]["dtensor_cfg"] = {"enabled": True}
    config["grpo"]["seq_logprob_error_threshold"] = THRESHOLD
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The sharded configuration trained for three steps in one process (unsharded): its
    summary, and its ``workdir``."""
    directory = tmp_path_factory.mktemp("single")
    return {**_train(_sharded_config(directory), directory / "work"), "workdir": directory / "work"}


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The sharded configuration trained for two steps on two ranks: its directory, summary."""
    directory = tmp_path_factory.mktemp("sharded")
    summary = _train(_sharded_config(directory), directory / "work", "--steps", "2", ranks=2)
    return directory, summary


def _resumed_copy(two_steps: tuple[Path, dict], into: Path, *, ranks: int) -> dict:
    """The two-step run copied to ``into`` and resumed there for its third step."""
    directory, _ = two_steps
    shutil.copytree(directory, into)
    return _train(into / "config.yaml", into / "work", "--resume", ranks=ranks)


def test_two_sharded_ranks_write_an_ordinary_schema_5_checkpoint(
    two_steps: tuple[Path, dict],
) -> None:
    _, summary = two_steps
    checkpoint = Path(summary["checkpoint"])

    assert summary["steps"] == 2
    assert checkpoint.name == "step_00000002"
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    metadata = json.loads((checkpoint / "metadata.json").read_text())
    assert (manifest["schema_version"], metadata["schema_version"]) == (5, 5)
    assert metadata["data_parallel_size"] == 2
    assert sorted(manifest["files"]) == [
        "metadata.json",
        "model.safetensors",
        "optimizer.pt",
        "rng.pt",
        "scheduler.pt",
    ]


def test_a_sharded_run_resumed_on_two_ranks_reaches_the_single_process_weights(
    single: dict, two_steps: tuple[Path, dict], tmp_path: Path
) -> None:
    resumed = _resumed_copy(two_steps, tmp_path / "resumed", ranks=2)

    assert resumed["steps"] == single["steps"] == 3
    sharded = _weights(Path(resumed["checkpoint"]))
    one = _weights(Path(single["checkpoint"]))
    assert _largest_difference(sharded, one) <= TOLERANCE
    # ... and the weights moved far more than that: the test compares trained weights.
    start = _weights(Path(single["checkpoint"]).parent / "step_00000001")
    assert _largest_difference(one, start) > 100 * TOLERANCE


def test_a_sharded_checkpoint_resumes_in_one_process_to_the_same_weights(
    single: dict, two_steps: tuple[Path, dict], tmp_path: Path
) -> None:
    resumed = _resumed_copy(two_steps, tmp_path / "resumed", ranks=1)

    assert resumed["steps"] == 3
    weights = _weights(Path(resumed["checkpoint"]))
    assert _largest_difference(weights, _weights(Path(single["checkpoint"]))) <= TOLERANCE


def _metrics(summary: dict, workdir: Path) -> list[dict[str, float]]:
    """Each logged step's metrics of the run of ``summary``."""
    lines = (workdir / "runs" / summary["run_id"] / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["metrics"] for line in lines]


def test_rank_0_reports_each_steps_row_sequence_errors_from_its_unsharded_copy(
    single: dict, two_steps: tuple[Path, dict]
) -> None:
    directory, summary = two_steps
    sharded = _metrics(summary, directory / "work")
    one = _metrics(single, single["workdir"])[:2]

    assert len(sharded) == len(one) == 2
    for step, reference in zip(sharded, one, strict=True):
        # every retained row agrees with the engine far below the threshold: none is over it
        assert step["train/rows_over_seq_logprob_error_threshold"] == 0.0
        assert step["forest/masked_rows"] == 0.0
        assert step["train/row_seq_logprob_error_mean"] >= 1.0
        assert step["train/row_seq_logprob_error_mean"] <= step["train/row_seq_logprob_error_max"]
        assert step["train/row_seq_logprob_error_max"] < 1.0 + TOLERANCE
        # ... and the copy holds the weights one process trains
        assert step["train/row_seq_logprob_error_max"] == pytest.approx(
            reference["train/row_seq_logprob_error_max"], abs=TOLERANCE
        )
