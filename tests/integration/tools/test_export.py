"""``grove export``: a trained schema-5 checkpoint as a Hugging Face directory that transformers
loads with the trained model's logits, bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grove.engines.models import ModelLoadError, load_model, save_embedded_model
from grove.tools.export import ExportError, export_checkpoint, export_from_run
from grove.training.checkpoint import (
    CheckpointDigestMismatch,
    CheckpointMetadata,
    save_checkpoint,
)

GROVE = Path(sys.executable).parent / "grove"
CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 21 + 3? (think first)"},
]
BATCH = torch.tensor(
    [
        [1, 415, 201, 74, 75, 267, 274, 2, 201, 1, 304, 409],
        [1, 304, 409, 362, 86, 201, 7, 9, 11, 13, 2, 0],
    ]
)  # (2, 12)


def train_two_steps(model: torch.nn.Module) -> torch.optim.Optimizer:
    """Two AdamW steps of next-token loss on BATCH: weights that no seed builds."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        loss = model(input_ids=BATCH, labels=BATCH).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    return optimizer


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=BATCH).logits  # (2, 12, V)


def metadata(step: int) -> CheckpointMetadata:
    return CheckpointMetadata(
        step=step,
        forest_mode=True,
        execution_row_multiple=1,
        selection_policy="returned_history",
        config_digest="export-test",
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    """A checkpoint (step 2) of the embedded model (seed 0) after two optimizer steps, next to
    the run's config.json; and the trained model's logits on BATCH."""
    model = load_model("embedded", seed=0).model
    optimizer = train_two_steps(model)
    root = tmp_path_factory.mktemp("run") / "checkpoints"
    checkpoint = save_checkpoint(
        root, model=model, optimizer=optimizer, scheduler=None, metadata=metadata(2)
    )
    run_config = {"model": {"path": "embedded", "dtype": "float32"}, "seed": 0, "steps": 2}
    (root / "config.json").write_text(json.dumps(run_config))
    return checkpoint, logits(model)


@pytest.fixture(scope="module")
def exported(trained: tuple[Path, torch.Tensor], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained checkpoint exported onto the embedded model, once for the module."""
    out = tmp_path_factory.mktemp("export") / "trained"
    return export_checkpoint(trained[0], out, model_path="embedded")


def reload(directory: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()


def test_training_changed_the_weights(trained: tuple[Path, torch.Tensor]) -> None:
    assert not torch.equal(trained[1], logits(load_model("embedded", seed=0).model))


def test_export_reloads_with_the_trained_models_logits_exactly(
    trained: tuple[Path, torch.Tensor], exported: Path
) -> None:
    assert torch.equal(logits(reload(exported)), trained[1])


def test_export_keeps_input_and_output_embeddings_tied(exported: Path) -> None:
    model = reload(exported)

    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_export_holds_weights_config_generation_config_tokenizer_and_record(
    trained: tuple[Path, torch.Tensor], exported: Path
) -> None:
    files = {path.name for path in exported.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= (
        files
    )
    assert not [name for name in files if name.endswith((".bin", ".pt"))]
    assert json.loads((exported / "generation_config.json").read_text())["eos_token_id"] == 2
    record = json.loads((exported / "grove_export.json").read_text())
    assert (record["checkpoint"], record["step"], record["model_path"], record["dtype"]) == (
        str(trained[0].resolve()),
        2,
        "embedded",
        "float32",
    )


def test_exported_tokenizer_renders_the_same_chat_template(exported: Path) -> None:
    embedded = load_model("embedded").tokenizer
    expected = embedded.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True
    )

    auto = AutoTokenizer.from_pretrained(exported, local_files_only=True)

    assert auto.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True) == (
        expected
    )
    assert auto.eos_token == embedded.eos_token


def test_exported_directory_loads_as_model_path_with_the_same_ids_and_logits(
    trained: tuple[Path, torch.Tensor], exported: Path
) -> None:
    embedded = load_model("embedded").tokenizer
    loaded = load_model(str(exported))

    assert loaded.tokenizer.apply_chat_template(
        CONVERSATION, tokenize=True, add_generation_prompt=True
    ) == embedded.apply_chat_template(CONVERSATION, tokenize=True, add_generation_prompt=True)
    assert torch.equal(logits(loaded.model), trained[1])


def test_export_onto_a_model_directory_gives_the_same_logits(
    trained: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    base = save_embedded_model(tmp_path / "base", seed=5)

    out = export_checkpoint(trained[0], tmp_path / "out", model_path=str(base))

    assert torch.equal(logits(reload(out)), trained[1])


def test_export_from_run_reads_model_dtype_and_seed_from_the_run_config(
    trained: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    out = export_from_run(trained[0], tmp_path / "out")

    assert torch.equal(logits(reload(out)), trained[1])
    assert json.loads((out / "grove_export.json").read_text())["model_path"] == "embedded"


def test_export_from_run_without_run_config_says_to_pass_model(
    trained: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    lone = tmp_path / "elsewhere"
    lone.mkdir()
    (lone / trained[0].name).symlink_to(trained[0])

    with pytest.raises(ExportError, match=r"No run configuration at .*pass it with --model"):
        export_from_run(lone / trained[0].name, tmp_path / "out")


def test_export_into_a_non_empty_directory_is_refused(
    trained: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")

    with pytest.raises(ExportError, match=r"already exists and is not empty; .* Choose a new"):
        export_checkpoint(trained[0], tmp_path / "out", model_path="embedded")
    assert [path.name for path in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_export_into_an_empty_directory_fills_it(
    trained: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    (tmp_path / "out").mkdir()

    export_checkpoint(trained[0], tmp_path / "out", model_path="embedded")

    assert torch.equal(logits(reload(tmp_path / "out")), trained[1])
    assert [path.name for path in tmp_path.iterdir()] == ["out"]  # no staging left behind


def test_tampered_checkpoint_is_refused_and_nothing_is_written(
    trained: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    checkpoint = Path(shutil.copytree(trained[0], tmp_path / "step_00000002"))
    weights = bytearray((checkpoint / "model.safetensors").read_bytes())
    weights[-1] ^= 0x01
    (checkpoint / "model.safetensors").write_bytes(bytes(weights))

    with pytest.raises(CheckpointDigestMismatch, match=r"'model\.safetensors'"):
        export_checkpoint(checkpoint, tmp_path / "out", model_path="embedded")
    assert not (tmp_path / "out").exists()


def test_export_in_another_dtype_than_the_checkpoints_is_refused(
    trained: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    with pytest.raises(
        ExportError, match=r"holds torch\.float32 tensors but .* torch\.bfloat16.*--dtype float32"
    ):
        export_checkpoint(trained[0], tmp_path / "out", model_path="embedded", dtype="bfloat16")
    assert not (tmp_path / "out").exists()


def test_export_onto_another_architecture_is_refused(
    trained: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    from grove.capture.embedded import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    build_model(tokenizer, hidden_size=32).save_pretrained(tmp_path / "narrow")
    tokenizer.save_pretrained(tmp_path / "narrow")

    with pytest.raises(ExportError, match=r"does not fit the model .* Pass the run's model"):
        export_checkpoint(trained[0], tmp_path / "out", model_path=str(tmp_path / "narrow"))


def test_export_onto_a_missing_model_is_refused(
    trained: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        export_checkpoint(trained[0], tmp_path / "out", model_path=str(tmp_path / "absent"))


def grove(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GROVE), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_cli_export_writes_a_directory_with_the_trained_logits(
    trained: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    done = grove("export", str(trained[0]), "--hf", str(tmp_path / "out"))

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.strip() == f"exported {trained[0]} to {tmp_path / 'out'}"
    assert torch.equal(logits(reload(tmp_path / "out")), trained[1])


def test_cli_export_refuses_a_non_empty_directory(
    trained: tuple[Path, torch.Tensor], tmp_path: Path
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")

    done = grove("export", str(trained[0]), "--hf", str(tmp_path / "out"), "--model", "embedded")

    assert done.returncode == 1
    assert f"error: Export directory {tmp_path / 'out'} already exists and is not empty" in (
        done.stderr
    )
