"""Schema-5 checkpoints: exact resume, atomic writes, and every refusal with its remedy."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from grove.training.checkpoint import (
    CHECKPOINT_FILES,
    CheckpointDigestMismatch,
    CheckpointError,
    CheckpointExists,
    CheckpointFileMissing,
    CheckpointIncompatible,
    CheckpointMetadata,
    CheckpointSchemaError,
    ResumeExpectation,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from grove.training.trainer import Trainer, rollout_warmup_scheduler
from tests.unit.trainer.tiny_lm import synthetic_step_batch, tiny_causal_lm

DIGEST = "c0ffee" * 10 + "abcd"
FOREST = ResumeExpectation(forest_mode=True, execution_row_multiple=2, config_digest=DIGEST)


def _metadata(step: int, **changes) -> CheckpointMetadata:
    fields = {
        "step": step,
        "forest_mode": True,
        "execution_row_multiple": 2,
        "selection_policy": "returned_history",
        "config_digest": DIGEST,
        "projector_position": {"ledger_position": 40 + step, "xid": None},
    }
    return CheckpointMetadata(**{**fields, **changes})


def _run(seed: int = 0) -> Trainer:
    model = tiny_causal_lm(seed=seed, dropout=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = rollout_warmup_scheduler(optimizer, warmup_rollouts=7)
    return Trainer(model, optimizer, scheduler, global_batch_rollouts=3, micro_batch_size=2)


def _step(trainer: Trainer) -> float:
    # The data draws from python's, numpy's and torch's generators, and the model's dropout from
    # torch's: a resume that restored any of them wrongly would diverge.
    rows = [1 + random.randrange(2), 1 + int(np.random.randint(2)), 1]
    return trainer.train_step(synthetic_step_batch(rows_per_rollout=rows, padding_rows=1)).loss


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _save(trainer: Trainer, root: Path, **changes) -> Path:
    return save_checkpoint(
        root,
        model=trainer.model,
        optimizer=trainer.optimizer,
        scheduler=trainer.scheduler,
        metadata=_metadata(trainer.step, **changes),
    )


def _load(trainer: Trainer, path: Path, expect: ResumeExpectation = FOREST) -> CheckpointMetadata:
    return load_checkpoint(
        path,
        model=trainer.model,
        optimizer=trainer.optimizer,
        scheduler=trainer.scheduler,
        expect=expect,
    )


def test_resumed_run_matches_the_uninterrupted_run_bitwise(tmp_path: Path) -> None:
    _seed_all(7)
    uninterrupted = _run()
    losses = [_step(uninterrupted) for _ in range(3)]
    path = _save(uninterrupted, tmp_path)
    losses += [_step(uninterrupted) for _ in range(3)]

    _seed_all(12345)  # a different process state: other init, other generator positions
    resumed = _run(seed=99)
    _step(resumed)
    saved = _load(resumed, path)
    resumed.step = saved.step
    resumed_losses = [_step(resumed) for _ in range(3)]

    assert resumed_losses == losses[3:]
    assert resumed.step == uninterrupted.step == 6
    assert resumed.scheduler.last_epoch == uninterrupted.scheduler.last_epoch
    for (name, a), b in zip(
        uninterrupted.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_checkpoint_restores_its_metadata(tmp_path: Path) -> None:
    trainer = _run()
    path = _save(trainer, tmp_path, selection_policy="all_captured")
    saved = _load(_run(seed=1), path)
    assert saved == _metadata(0, selection_policy="all_captured")
    assert saved.projector_position == {"ledger_position": 40, "xid": None}


def test_manifest_lists_every_file_with_its_sha256(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["schema_version"] == 5
    assert set(manifest["files"]) == set(CHECKPOINT_FILES)
    for name, entry in manifest["files"].items():
        content = (path / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}


def test_checkpoint_directory_is_named_for_its_step_and_leaves_no_temporary(tmp_path: Path) -> None:
    trainer = _run()
    trainer.step = 12
    path = _save(trainer, tmp_path)
    assert path == tmp_path / "step_00000012"
    assert [entry.name for entry in tmp_path.iterdir()] == ["step_00000012"]


class _FailingScheduler:
    def state_dict(self) -> dict:
        raise OSError("disk full")


def test_failed_write_leaves_no_checkpoint_behind(tmp_path: Path) -> None:
    trainer = _run()
    with pytest.raises(OSError, match=r"disk full"):
        save_checkpoint(
            tmp_path,
            model=trainer.model,
            optimizer=trainer.optimizer,
            scheduler=_FailingScheduler(),
            metadata=_metadata(0),
        )
    assert list(tmp_path.iterdir()) == []
    assert latest_checkpoint(tmp_path) is None


def test_projector_position_that_is_not_json_is_refused_before_writing(tmp_path: Path) -> None:
    trainer = _run()
    with pytest.raises(CheckpointError, match=r"must be JSON-serializable"):
        _save(trainer, tmp_path / "root", projector_position={"at": object()})
    assert not (tmp_path / "root").exists()


def test_second_checkpoint_of_the_same_step_raises(tmp_path: Path) -> None:
    trainer = _run()
    _save(trainer, tmp_path)
    with pytest.raises(CheckpointExists, match=r"already exists; checkpoints are written once"):
        _save(trainer, tmp_path)


def test_latest_checkpoint_skips_incomplete_and_temporary_directories(tmp_path: Path) -> None:
    trainer = _run()
    for step in (2, 10):
        trainer.step = step
        _save(trainer, tmp_path)
    (tmp_path / "step_00000011").mkdir()  # no manifest: incomplete
    (tmp_path / ".step_00000012.tmp-abc").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000010"
    assert latest_checkpoint(tmp_path / "absent") is None


def test_missing_manifest_is_refused(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    (path / "manifest.json").unlink()
    with pytest.raises(CheckpointFileMissing, match=r"has no manifest.json: it is incomplete"):
        _load(_run(), path)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    (path / "optimizer.pt").unlink()
    with pytest.raises(
        CheckpointFileMissing, match=r"lacks 'optimizer.pt'.*resume from an earlier"
    ) as caught:
        _load(_run(), path)
    assert caught.value.file == "optimizer.pt"


def test_digest_mismatch_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    weights = path / "model.safetensors"
    content = bytearray(weights.read_bytes())
    content[-1] ^= 0xFF
    weights.write_bytes(bytes(content))
    target = _run(seed=1)
    before = [p.detach().clone() for p in target.model.parameters()]
    with pytest.raises(
        CheckpointDigestMismatch, match=r"'model.safetensors'.*changed after it was written"
    ):
        _load(target, path)
    assert all(torch.equal(a, b) for a, b in zip(before, target.model.parameters(), strict=True))


def _rewrite_metadata(path: Path, **changes) -> None:
    metadata = json.loads((path / "metadata.json").read_text())
    for key, value in changes.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    (path / "metadata.json").write_text(json.dumps(metadata))
    manifest = json.loads((path / "manifest.json").read_text())
    content = (path / "metadata.json").read_bytes()
    manifest["files"]["metadata.json"] = {
        "sha256": hashlib.sha256(content).hexdigest(),
        "bytes": len(content),
    }
    (path / "manifest.json").write_text(json.dumps(manifest))


def _schema_4(path: Path) -> None:
    _rewrite_metadata(
        path, schema_version=4, forest_mode=None, execution_row_multiple=None, selection_policy=None
    )


def test_schema_4_checkpoint_is_refused_in_forest_mode(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    _schema_4(path)
    with pytest.raises(
        CheckpointSchemaError,
        match=r"schema 4, which holds no forest metadata.*forest_training: false",
    ):
        _load(_run(), path)


def test_schema_4_checkpoint_loads_in_non_forest_mode(tmp_path: Path) -> None:
    source = _run()
    path = _save(source, tmp_path)
    _schema_4(path)
    target = _run(seed=1)
    saved = _load(target, path, ResumeExpectation(forest_mode=False, execution_row_multiple=8))
    assert (saved.schema_version, saved.forest_mode, saved.selection_policy) == (4, None, None)
    for a, b in zip(source.model.parameters(), target.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_schema_older_than_4_is_refused_without_migration(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    _rewrite_metadata(path, schema_version=3)
    with pytest.raises(CheckpointSchemaError, match=r"schema 3.*no migration. Start a fresh run"):
        _load(_run(), path, ResumeExpectation(forest_mode=False, execution_row_multiple=2))


def test_schema_newer_than_5_is_refused(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    _rewrite_metadata(path, schema_version=6)
    with pytest.raises(CheckpointSchemaError, match=r"schema 6, newer than this Grove reads"):
        _load(_run(), path)


def test_changed_forest_mode_is_refused(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    with pytest.raises(
        CheckpointIncompatible,
        match=r"token_capture.forest_training = True, but this run has False: resume with "
        r"token_capture.forest_training: true",
    ):
        _load(_run(), path, ResumeExpectation(forest_mode=False, execution_row_multiple=2))


def test_changed_execution_row_multiple_is_refused(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    with pytest.raises(
        CheckpointIncompatible, match=r"execution row multiple = 2, but this run has 4"
    ) as caught:
        _load(_run(), path, ResumeExpectation(forest_mode=True, execution_row_multiple=4))
    assert (caught.value.saved, caught.value.current) == (2, 4)


def test_changed_configuration_digest_is_refused(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    expect = ResumeExpectation(forest_mode=True, execution_row_multiple=2, config_digest="f" * 64)
    with pytest.raises(
        CheckpointIncompatible, match=r"configuration digest.*resume with the configuration"
    ):
        _load(_run(), path, expect)


def test_configuration_digest_is_not_checked_when_none_is_expected(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    expect = ResumeExpectation(forest_mode=True, execution_row_multiple=2, config_digest=None)
    assert _load(_run(), path, expect).config_digest == DIGEST


def test_other_model_architecture_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    path = _save(_run(), tmp_path)
    other = torch.nn.Linear(4, 4)
    before = other.weight.detach().clone()
    optimizer = torch.optim.AdamW(other.parameters())
    with pytest.raises(CheckpointIncompatible, match=r"model's architecture differs"):
        load_checkpoint(path, model=other, optimizer=optimizer, scheduler=None, expect=FOREST)
    assert torch.equal(other.weight, before)
