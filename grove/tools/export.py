"""``grove export``: a trained checkpoint as a Hugging Face model directory (docs/export.md).

A schema-5 checkpoint holds the trained weights but not the model's architecture or tokenizer;
those come from the run's ``model.path`` (``embedded`` or a local model directory). Export:

1. refuses an output directory that exists and is not empty (nothing is overwritten);
2. verifies every file of the checkpoint against its manifest (``verify_checkpoint``), before
   any model is built;
3. loads the run's model (:func:`grove.engines.models.load_model`) and checks that the checkpoint's
   tensors are exactly its parameters: same names (a tied weight is stored once, under either
   name), shapes and dtypes — a dtype cast would change the weights, so a dtype other than the
   run's is refused rather than converted;
4. copies the tensors in and writes ``save_pretrained`` of the model (safetensors weights,
   ``config.json``, ``generation_config.json`` ending at the tokenizer's eos token) and of the
   tokenizer (its chat template included), plus ``grove_export.json`` naming the checkpoint it
   came from — into a temporary directory next to the output, renamed into place when complete.

The result loads with ``AutoModelForCausalLM.from_pretrained`` and gives the trained model's
logits bit for bit; ``grove train`` takes it as ``model.path``.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any, Final

import torch
from safetensors.torch import load_file

from grove.engines.models import DTYPES, LoadedModel, load_model, quiet_transformers
from grove.errors import JobError
from grove.training.checkpoint import verify_checkpoint
from grove.training.state_dict_fit import state_dict_fit

__all__ = [
    "EXPORT_RECORD",
    "RUN_CONFIG",
    "ExportError",
    "export_checkpoint",
    "export_from_run",
]

RUN_CONFIG: Final = "config.json"
"""The run's whole configuration as JSON, written by the trainer next to its checkpoints."""

EXPORT_RECORD: Final = "grove_export.json"
"""The file in an export that names its checkpoint, step, model path and dtype."""

_WEIGHTS: Final = "model.safetensors"


class ExportError(JobError, ValueError):
    """An export refused before anything was written: ``path`` names the file or directory at
    fault, ``problem`` states the rule, got versus expected, and what to do."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(problem)


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(
            out_dir,
            f"Export directory {out_dir} already exists and is not empty; an export never "
            "overwrites files. Choose a new directory, or remove this one first.",
        )


def _check_tensors(
    checkpoint: Path, model: torch.nn.Module, tensors: dict[str, torch.Tensor]
) -> None:
    """The checkpoint's tensors are exactly the model's parameters and buffers in its state
    dict: same names (a tied weight stored once), shapes and dtypes
    (``grove.training.state_dict_fit``)."""
    fit = state_dict_fit(model, tensors)
    if not fit.same_layout:
        reshaped = [f"{name}: {saved} vs {wanted}" for name, saved, wanted in fit.reshaped]
        raise ExportError(
            checkpoint,
            f"Checkpoint {checkpoint} does not fit the model it is exported onto (only in the "
            f"checkpoint: {list(fit.unexpected[:10])}; only in the model: "
            f"{list(fit.missing[:10])}; checkpoint vs model shape: {reshaped[:10]}). Pass the "
            "run's model.path as --model.",
        )
    if fit.retyped:
        saved, loaded = fit.retyped[0]
        raise ExportError(
            checkpoint,
            f"Checkpoint {checkpoint} holds {saved} tensors but the model was loaded as "
            f"{loaded}; exporting would convert the trained weights. Export with the dtype "
            f"the run trained in (--dtype {saved.removeprefix('torch.')}).",
        )


def _write(
    staging: Path, loaded: LoadedModel, record: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> None:
    model, tokenizer = loaded.model, loaded.tokenizer
    model.load_state_dict(tensors, strict=False)  # strict: checked by _check_tensors
    generation = getattr(model, "generation_config", None)
    if generation is not None and generation.eos_token_id is None:
        generation.eos_token_id = tokenizer.eos_token_id
    with quiet_transformers():
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    (staging / EXPORT_RECORD).write_text(json.dumps(record, sort_keys=True, indent=2) + "\n")


def export_checkpoint(
    checkpoint: Path,
    out_dir: Path,
    *,
    model_path: str,
    dtype: str = "float32",
    seed: int = 0,
    architecture: str = "dense",
) -> Path:
    """Write the weights of ``checkpoint`` on the model that ``model_path`` names (loaded in
    ``dtype``; ``seed`` and ``architecture`` build the embedded model) as a Hugging Face
    directory ``out_dir``
    (new, or empty); returns ``out_dir``. Raises ``ExportError``, ``ModelLoadError`` or a
    ``CheckpointError`` before anything is written."""
    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    _check_out_dir(out_dir)
    metadata = verify_checkpoint(checkpoint)
    loaded = load_model(model_path, dtype=dtype, seed=seed, architecture=architecture)
    tensors = load_file(checkpoint / _WEIGHTS)
    _check_tensors(checkpoint, loaded.model, tensors)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    record = {
        "checkpoint": str(checkpoint.resolve()),
        "step": metadata.step,
        "config_digest": metadata.config_digest,
        "weights_sha256": manifest["files"][_WEIGHTS]["sha256"],
        "model_path": model_path,
        "model_source": loaded.source,
        "dtype": dtype,
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        _write(staging, loaded, record, tensors)
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _run_settings(config_path: Path) -> tuple[str, str, int, str]:
    """``model.path``, ``model.dtype``, ``seed`` and ``model.architecture`` from a run's
    configuration JSON."""
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise ExportError(
            config_path,
            f"The run configuration {config_path} cannot be read ({error}); pass the run's "
            "model with --model PATH_OR_embedded (and --dtype).",
        ) from error
    model = config.get("model") if isinstance(config, dict) else None
    path = model.get("path") if isinstance(model, dict) else None
    dtype = model.get("dtype", "float32") if isinstance(model, dict) else None
    seed = config.get("seed", 0) if isinstance(config, dict) else None
    architecture = model.get("architecture", "dense") if isinstance(model, dict) else "dense"
    if not isinstance(path, str) or dtype not in DTYPES or not isinstance(seed, int):
        raise ExportError(
            config_path,
            f"The run configuration {config_path} must hold model.path (a string), model.dtype "
            f"(one of {sorted(DTYPES)}) and seed (an integer); got model={model!r}, "
            f"seed={seed!r}. Pass the run's model with --model PATH_OR_embedded (and --dtype).",
        )
    return path, dtype, seed, architecture


def export_from_run(checkpoint: Path, out_dir: Path) -> Path:
    """:func:`export_checkpoint` with the model, dtype and seed of the run that wrote
    ``checkpoint``, read from ``checkpoint.parent / "config.json"``; returns ``out_dir``."""
    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    config_path = checkpoint.parent / RUN_CONFIG
    if not config_path.is_file():
        raise ExportError(
            config_path,
            f"No run configuration at {config_path} (the trainer writes it next to its "
            "checkpoints), so the checkpoint's model is unknown; pass it with --model "
            "PATH_OR_embedded (and --dtype).",
        )
    _check_out_dir(out_dir)
    path, dtype, seed, architecture = _run_settings(config_path)
    return export_checkpoint(
        checkpoint, out_dir, model_path=path, dtype=dtype, seed=seed, architecture=architecture
    )
