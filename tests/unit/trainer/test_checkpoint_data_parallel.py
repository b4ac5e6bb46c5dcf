"""Checkpoints record the data-parallel size their steps were laid out for
(``policy.data_parallel_size``); resuming under another size is refused with its remedy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grove.training.checkpoint import CheckpointIncompatible, ResumeExpectation, verify_checkpoint
from tests.unit.trainer.test_checkpoint import DIGEST, _load, _run, _save


def _expect(data_parallel_size: int | None) -> ResumeExpectation:
    return ResumeExpectation(
        forest_mode=True,
        execution_row_multiple=2,
        config_digest=DIGEST,
        data_parallel_size=data_parallel_size,
    )


def test_checkpoint_records_the_data_parallel_size(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path, data_parallel_size=2)

    assert json.loads((path / "metadata.json").read_text())["data_parallel_size"] == 2
    assert verify_checkpoint(path).data_parallel_size == 2


def test_resume_under_the_same_data_parallel_size_loads(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path, data_parallel_size=2)

    assert _load(_run(), path, _expect(2)).data_parallel_size == 2


def test_resume_under_another_data_parallel_size_is_refused_with_its_remedy(
    tmp_path: Path,
) -> None:
    # Row multiple 2 both times (2 ranks x micro batch 1, then 1 rank x micro batch 2): the size
    # is refused on its own, before the configuration digest, with how to resume.
    path = _save(_run(), tmp_path, data_parallel_size=2)

    with pytest.raises(
        CheckpointIncompatible,
        match=r"policy.data_parallel_size = 2, but this run has 1: .*Resume with "
        r"policy.data_parallel_size: 2, under torchrun --nproc-per-node 2 or in one process",
    ) as caught:
        _load(_run(), path, _expect(1))
    assert (caught.value.setting, caught.value.saved, caught.value.current) == (
        "policy.data_parallel_size",
        2,
        1,
    )


def test_a_checkpoint_that_predates_the_record_resumes_under_any_size(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)

    assert verify_checkpoint(path).data_parallel_size is None
    assert _load(_run(), path, _expect(4)).step == 0
