"""Schema-5 checkpoints: everything a resumed run needs to continue exactly where it stopped.

A checkpoint is one directory ``step_{step:08d}`` holding::

    model.safetensors   model weights (tied weights stored once)
    optimizer.pt        optimizer state
    scheduler.pt        learning-rate scheduler state (its clock counts logical rollouts)
    rng.pt              python, numpy and torch generator states
    metadata.json       schema version, step, forest mode, execution row multiple, data-parallel
                        size, selection policy, configuration digest, projector position (opaque,
                        the caller's)
    manifest.json       sha256 and size of every file above; written last

It is written into a temporary directory next to its final name and renamed into place, with the
manifest as its last file, so a directory named ``step_…`` with a manifest is complete (nanochat's
"written last, so its existence means complete"; prime-rl's temp-then-rename). A temporary
directory that a writer killed mid-write left behind is removed when its step is written again.
Loading verifies every digest before it touches the model, and refuses, with a message that says
what to do:

- a missing file (the manifest included) or a digest mismatch;
- a schema older than 4, or newer than 5; schema 4 (no forest metadata) in forest mode — schema 4
  still loads in non-forest mode (``docs/train.md``, "Resume");
- a changed forest mode, a changed data-parallel size, a changed execution row multiple (forest
  mode), or a configuration digest other than the one the caller expects.

The data-parallel size is the ``policy.data_parallel_size`` the run's steps were laid out for, not
how many processes trained them: a run of two ``torchrun`` ranks resumes in one process with the
same setting (that process trains every rank's rows) and the other way round
(``docs/train.md``, "Data-parallel training").

Torch files are read with ``weights_only=True``: a checkpoint is data, never code. A checkpoint is
device-independent: every tensor is written from a CPU copy and read onto the CPU, then copied
into the model and optimizer wherever their parameters live (``policy.device``), so a run
written on a GPU resumes on the CPU and the other way round.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
from safetensors.torch import load_file, save_model

from grove.training.errors import TrainingError
from grove.training.state_dict_fit import state_dict_fit

__all__ = [
    "CHECKPOINT_FILES",
    "CHECKPOINT_SCHEMA",
    "CheckpointDigestMismatch",
    "CheckpointError",
    "CheckpointExists",
    "CheckpointFileMissing",
    "CheckpointIncompatible",
    "CheckpointMetadata",
    "CheckpointSchemaError",
    "ResumeExpectation",
    "checkpoint_name",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
]

CHECKPOINT_SCHEMA: Final = 5
"""The schema this code writes: the first with forest mode, row multiple and selection policy."""

_OLDEST_LOADABLE_SCHEMA: Final = 4
MANIFEST: Final = "manifest.json"
METADATA: Final = "metadata.json"
CHECKPOINT_FILES: Final = (
    "model.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "rng.pt",
    METADATA,
)
"""Files every checkpoint holds besides its manifest, each listed in the manifest."""


class CheckpointError(TrainingError):
    """A checkpoint that cannot be written or resumed from; ``path`` names its directory."""

    def __init__(self, rule: str, path: Path, message: str) -> None:
        self.path = path
        super().__init__(rule, message)


class CheckpointExists(CheckpointError):
    """A checkpoint of this step already exists; checkpoints are written once."""


class CheckpointFileMissing(CheckpointError):
    """A file of the checkpoint (``file``) is absent: incomplete or damaged."""

    def __init__(self, path: Path, file: str, message: str) -> None:
        self.file = file
        super().__init__("checkpoint_file_missing", path, message)


class CheckpointDigestMismatch(CheckpointError):
    """A file's sha256 differs from the one its manifest records."""

    def __init__(self, path: Path, file: str, expected: str, actual: str) -> None:
        self.file = file
        self.expected = expected
        self.actual = actual
        super().__init__(
            "checkpoint_digest",
            path,
            f"Checkpoint file {file!r} in {path} has sha256 {actual}, but its manifest records "
            f"{expected}: the file changed after it was written. Restore it from a copy, or "
            "resume from an earlier checkpoint.",
        )


class CheckpointSchemaError(CheckpointError):
    """A schema version this code cannot resume from in the requested mode."""

    def __init__(self, path: Path, schema_version: object, message: str) -> None:
        self.schema_version = schema_version
        super().__init__("checkpoint_schema", path, message)


class CheckpointIncompatible(CheckpointError):
    """The run differs from the checkpoint in ``setting``: ``saved`` versus ``current``."""

    def __init__(
        self, path: Path, setting: str, saved: object, current: object, remedy: str
    ) -> None:
        self.setting = setting
        self.saved = saved
        self.current = current
        super().__init__(
            "checkpoint_incompatible",
            path,
            f"Checkpoint {path} was written with {setting} = {saved!r}, but this run has "
            f"{current!r}: {remedy}",
        )


@dataclass(frozen=True)
class CheckpointMetadata:
    """What a checkpoint records besides tensors (producer: the trainer loop via
    ``save_checkpoint``; consumer: ``load_checkpoint`` and the projector on resume).

    ``step`` counts optimizer steps taken. ``forest_mode``, ``execution_row_multiple`` and
    ``selection_policy`` are None only in schema-4 checkpoints, which predate them;
    ``data_parallel_size`` (``policy.data_parallel_size``) is None in checkpoints written before
    Grove recorded it.
    ``projector_position`` is the projector's opaque JSON-able resume point (ledger position and
    whatever else it needs); ``config_digest`` is ``GroveConfig.digest()`` of the run.
    """

    step: int
    forest_mode: bool | None
    execution_row_multiple: int | None
    selection_policy: str | None
    config_digest: str
    projector_position: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = CHECKPOINT_SCHEMA
    data_parallel_size: int | None = None


@dataclass(frozen=True)
class ResumeExpectation:
    """The resuming run's settings that a checkpoint must match. ``config_digest`` None accepts
    any configuration digest (an explicit decision to resume under a changed configuration);
    ``data_parallel_size`` None accepts any data-parallel size."""

    forest_mode: bool
    execution_row_multiple: int
    config_digest: str | None = None
    data_parallel_size: int | None = None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    numpy_state = np.random.get_state()
    assert isinstance(numpy_state, tuple)  # the legacy form, get_state's default
    name, keys, position, has_gauss, cached = numpy_state
    state: dict[str, Any] = {
        "python": (version, internal, gauss),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng(state: Mapping[str, Any]) -> None:
    random.setstate(tuple(state["python"]))
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _on_cpu(value: Any) -> Any:
    """``value`` (a state dict: nested dicts, lists and tuples) with every tensor on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_on_cpu(item) for item in value)
    return value


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint after ``step`` optimizer steps."""
    return f"step_{step:08d}"


def save_checkpoint(
    root: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    metadata: CheckpointMetadata,
) -> Path:
    """Write a schema-5 checkpoint of the current model, optimizer, scheduler and generator
    states under ``root``; returns its directory. Atomic: a failure leaves no ``step_…``
    directory behind. Raises ``CheckpointExists`` if this step was already saved."""
    root = Path(root)
    final = root / checkpoint_name(metadata.step)
    if metadata.schema_version != CHECKPOINT_SCHEMA or None in (
        metadata.forest_mode,
        metadata.execution_row_multiple,
        metadata.selection_policy,
    ):
        raise CheckpointSchemaError(
            final,
            metadata.schema_version,
            f"Grove writes schema {CHECKPOINT_SCHEMA} only, with forest mode, execution row "
            "multiple and selection policy all set",
        )
    try:
        metadata_json = json.dumps(asdict(metadata), sort_keys=True, indent=2, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise CheckpointError(
            "checkpoint_metadata",
            final,
            f"checkpoint metadata must be JSON-serializable (projector_position included): {error}",
        ) from error
    if final.exists():
        raise CheckpointExists(
            "checkpoint_exists",
            final,
            f"Checkpoint {final} already exists; checkpoints are written once. Remove it only if "
            "you mean to discard it.",
        )
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".{final.name}.tmp-*"):
        # Left by a writer of this step that was killed mid-write (its own failures clean up):
        # a checkpoint is written once, so its partial files can only be discarded.
        shutil.rmtree(stale, ignore_errors=True)
    staging = root / f".{final.name}.tmp-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        save_model(model, str(staging / "model.safetensors"))
        torch.save(_on_cpu(optimizer.state_dict()), staging / "optimizer.pt")
        torch.save(
            scheduler.state_dict() if scheduler is not None else {}, staging / "scheduler.pt"
        )
        torch.save(_rng_state(), staging / "rng.pt")
        (staging / METADATA).write_text(metadata_json)
        files = {
            name: {"sha256": _sha256(staging / name), "bytes": (staging / name).stat().st_size}
            for name in CHECKPOINT_FILES
        }
        for name in CHECKPOINT_FILES:
            _fsync(staging / name)
        manifest = {"schema_version": CHECKPOINT_SCHEMA, "files": files}
        (staging / MANIFEST).write_text(json.dumps(manifest, sort_keys=True, indent=2))
        _fsync(staging / MANIFEST)
        staging.rename(final)
        _fsync(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint (one with a manifest) of the highest step under ``root``, or None;
    temporary and incomplete directories are skipped."""
    root = Path(root)
    if not root.is_dir():
        return None
    complete = [
        path
        for path in root.glob("step_*")
        if path.is_dir() and path.name[5:].isdigit() and (path / MANIFEST).is_file()
    ]
    return max(complete, key=lambda path: int(path.name[5:]), default=None)


def _read_json(path: Path, directory: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(
            "checkpoint_unreadable",
            directory,
            f"Checkpoint file {path.name!r} in {directory} cannot be read ({error}); resume from "
            "an earlier checkpoint.",
        ) from error


def verify_checkpoint(path: str | os.PathLike[str]) -> CheckpointMetadata:
    """Check that every file is present with its manifest digest and parse the metadata; no
    state is touched. Raises ``CheckpointFileMissing`` or ``CheckpointDigestMismatch``."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        raise CheckpointFileMissing(
            path,
            MANIFEST,
            f"Checkpoint {path} has no {MANIFEST}: it is incomplete (the manifest is written "
            "last) or is not a checkpoint. Resume from the latest complete checkpoint "
            "(latest_checkpoint skips incomplete ones).",
        )
    manifest = _read_json(path / MANIFEST, path)
    files = manifest.get("files", {}) if isinstance(manifest, dict) else {}
    for name in CHECKPOINT_FILES:
        if name not in files or not (path / name).is_file():
            raise CheckpointFileMissing(
                path,
                name,
                f"Checkpoint {path} lacks {name!r}, which every checkpoint holds: it is damaged. "
                "Restore the file from a copy, or resume from an earlier checkpoint.",
            )
        actual = _sha256(path / name)
        if actual != files[name].get("sha256"):
            raise CheckpointDigestMismatch(path, name, str(files[name].get("sha256")), actual)
    raw = _read_json(path / METADATA, path)
    try:
        return CheckpointMetadata(
            step=int(raw["step"]),
            forest_mode=raw.get("forest_mode"),
            execution_row_multiple=raw.get("execution_row_multiple"),
            selection_policy=raw.get("selection_policy"),
            config_digest=str(raw["config_digest"]),
            projector_position=dict(raw.get("projector_position", {})),
            schema_version=raw["schema_version"],
            data_parallel_size=raw.get("data_parallel_size"),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(
            "checkpoint_metadata",
            path,
            f"Checkpoint {path} has malformed metadata ({error!r}); resume from an earlier "
            "checkpoint.",
        ) from error


def _check_schema(path: Path, saved: CheckpointMetadata, expect: ResumeExpectation) -> None:
    version = saved.schema_version
    if not isinstance(version, int) or version > CHECKPOINT_SCHEMA:
        raise CheckpointSchemaError(
            path,
            version,
            f"Checkpoint {path} has schema {version!r}, newer than this Grove reads "
            f"({CHECKPOINT_SCHEMA}): upgrade Grove to resume it.",
        )
    if version < _OLDEST_LOADABLE_SCHEMA:
        raise CheckpointSchemaError(
            path,
            version,
            f"Checkpoint {path} has schema {version}, from before Grove's capture receipts; "
            "there is no migration. Start a fresh run.",
        )
    if version < CHECKPOINT_SCHEMA and expect.forest_mode:
        raise CheckpointSchemaError(
            path,
            version,
            f"Checkpoint {path} has schema {version}, which holds no forest metadata (forest "
            f"mode, execution row multiple, selection policy); forest training resumes only "
            f"from schema {CHECKPOINT_SCHEMA}. Resume it with token_capture.forest_training: "
            "false, or start a fresh forest run.",
        )


def _check_compatible(path: Path, saved: CheckpointMetadata, expect: ResumeExpectation) -> None:
    saved_forest = bool(saved.forest_mode)
    if saved_forest != expect.forest_mode:
        raise CheckpointIncompatible(
            path,
            "token_capture.forest_training",
            saved_forest,
            expect.forest_mode,
            f"resume with token_capture.forest_training: {str(saved_forest).lower()}, or start "
            "a fresh run.",
        )
    if (
        saved.data_parallel_size is not None
        and expect.data_parallel_size is not None
        and saved.data_parallel_size != expect.data_parallel_size
    ):
        raise CheckpointIncompatible(
            path,
            "policy.data_parallel_size",
            saved.data_parallel_size,
            expect.data_parallel_size,
            "its steps were laid out for that many data-parallel ranks (each prompt group padded "
            "to policy.data_parallel_size x policy.train_micro_batch_size rows). Resume with "
            f"policy.data_parallel_size: {saved.data_parallel_size}, under torchrun "
            f"--nproc-per-node {saved.data_parallel_size} or in one process (which trains every "
            "rank's rows), or start a fresh run.",
        )
    if expect.forest_mode and saved.execution_row_multiple != expect.execution_row_multiple:
        raise CheckpointIncompatible(
            path,
            "execution row multiple",
            saved.execution_row_multiple,
            expect.execution_row_multiple,
            "saved prompt groups were padded to the saved multiple (policy.data_parallel_size x "
            "policy.train_micro_batch_size, or the data-parallel size when packing); restore "
            "those settings, or start a fresh run.",
        )
    if expect.config_digest is not None and saved.config_digest != expect.config_digest:
        raise CheckpointIncompatible(
            path,
            "configuration digest",
            saved.config_digest,
            expect.config_digest,
            "resume with the configuration the checkpoint was written with, or accept the "
            "change explicitly (resume without an expected configuration digest).",
        )


def _check_same_model(path: Path, model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    fit = state_dict_fit(model, tensors)  # tied weights are stored once by ``save_model``
    if not fit.same_layout:
        raise CheckpointIncompatible(
            path,
            "model parameters",
            {
                "only in checkpoint": list(fit.unexpected),
                "other shape": [name for name, _, _ in fit.reshaped],
            },
            {"only in model": list(fit.missing)},
            "the model's architecture differs from the checkpoint's; build the same model.",
        )


def _check_same_optimizer(
    path: Path, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]
) -> None:
    saved = [len(group["params"]) for group in state.get("param_groups", [])]
    current = [len(group["params"]) for group in optimizer.param_groups]
    if saved != current:
        raise CheckpointIncompatible(
            path,
            "optimizer parameter groups (sizes)",
            saved,
            current,
            "the optimizer covers other parameters than the checkpoint's; build the same one.",
        )


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    expect: ResumeExpectation,
) -> CheckpointMetadata:
    """Verify the checkpoint, check it against the resuming run, then restore model, optimizer,
    scheduler and generator states; returns its metadata (step, projector position, ...).
    Every refusal happens before any state is changed."""
    path = Path(path)
    saved = verify_checkpoint(path)
    _check_schema(path, saved, expect)
    _check_compatible(path, saved, expect)
    tensors = load_file(path / "model.safetensors", device="cpu")
    # On the CPU whatever device wrote them; load_state_dict moves the optimizer's state to its
    # parameters' device.
    optimizer_state = torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu")
    scheduler_state = torch.load(path / "scheduler.pt", weights_only=True, map_location="cpu")
    rng_state = torch.load(path / "rng.pt", weights_only=True, map_location="cpu")
    _check_same_model(path, model, tensors)
    _check_same_optimizer(path, optimizer, optimizer_state)
    model.load_state_dict(tensors, strict=False)
    optimizer.load_state_dict(optimizer_state)
    if scheduler is not None:
        scheduler.load_state_dict(scheduler_state)
    _restore_rng(rng_state)
    return saved
