"""Loading ``model.path``: the embedded model, a Hugging Face directory, and each refusal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from grove.capture.embedded import EMBEDDED_MODEL_NAME
from grove.engines.models import (
    ModelLoadError,
    check_model_directory,
    load_model,
    save_embedded_model,
)

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "It is sunny, 21 degrees."},
    {"role": "user", "content": "And the wind?"},
]
TOKENS = torch.tensor([[1, 415, 201, 74, 75, 267, 274, 2, 201, 1, 304, 409]])  # (1, 12)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model (seed 0) saved once as a Hugging Face directory; read-only."""
    return save_embedded_model(tmp_path_factory.mktemp("saved") / "embedded-tiny", seed=0)


@pytest.fixture
def copy(saved: Path, tmp_path: Path) -> Path:
    """A private copy of the saved directory, for tests that damage it."""
    return Path(shutil.copytree(saved, tmp_path / "model"))


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=TOKENS).logits  # (1, 12, V)


def test_embedded_model_loads_in_eval_mode_under_the_embedded_name() -> None:
    loaded = load_model("embedded")

    assert loaded.name == EMBEDDED_MODEL_NAME
    assert loaded.source == "embedded"
    assert loaded.model.training is False
    assert loaded.tokenizer.eos_token == "<|im_end|>"
    assert loaded.tokenizer.chat_template


def test_embedded_seed_selects_the_weights() -> None:
    assert torch.equal(
        logits(load_model("embedded", seed=3).model), logits(load_model("embedded", seed=3).model)
    )
    assert not torch.equal(
        logits(load_model("embedded", seed=3).model), logits(load_model("embedded").model)
    )


def test_saved_directory_has_no_problems(saved: Path) -> None:
    assert check_model_directory(str(saved)) == []


def test_saved_directory_loads_under_its_directory_name(saved: Path) -> None:
    loaded = load_model(str(saved))

    assert loaded.name == "embedded-tiny"
    assert loaded.source == str(saved.resolve())
    assert loaded.model.training is False


def test_saved_directory_tokenizes_a_conversation_like_the_embedded_tokenizer(
    saved: Path,
) -> None:
    # "21" is one pre-token for the embedded (GPT-2) pre-tokenizer and two for Qwen2's, which
    # transformers 5's AutoTokenizer would substitute for a qwen2 directory (docs/export.md).
    embedded = load_model("embedded").tokenizer
    directory = load_model(str(saved)).tokenizer

    expected = embedded.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True
    )
    assert (
        directory.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
        == expected
    )
    assert (
        directory(expected, add_special_tokens=False)["input_ids"]
        == embedded(expected, add_special_tokens=False)["input_ids"]
    )
    assert directory.eos_token_id == embedded.eos_token_id


def test_saved_directory_gives_the_embedded_models_logits_exactly(saved: Path) -> None:
    assert torch.equal(logits(load_model(str(saved)).model), logits(load_model("embedded").model))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dtype_is_applied_to_the_embedded_model(dtype: torch.dtype) -> None:
    loaded = load_model("embedded", dtype=str(dtype).removeprefix("torch."))

    assert {p.dtype for p in loaded.model.parameters()} == {dtype}


def test_dtype_is_applied_to_a_directory_model(saved: Path) -> None:
    loaded = load_model(str(saved), dtype="bfloat16")

    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ModelLoadError, match=r"model\.dtype must be one of .* got 'int8'"):
        load_model("embedded", dtype="int8")


def test_missing_directory_is_refused_with_its_path(tmp_path: Path) -> None:
    missing = tmp_path / "absent"

    with pytest.raises(ModelLoadError, match=f"directory {missing} does not exist") as caught:
        load_model(str(missing))

    assert caught.value.path == str(missing)


def test_directory_without_config_is_refused(copy: Path) -> None:
    (copy / "config.json").unlink()

    with pytest.raises(ModelLoadError, match=f"{copy} has no config.json"):
        load_model(str(copy))


def test_directory_without_weights_is_refused(copy: Path) -> None:
    (copy / "model.safetensors").unlink()

    with pytest.raises(ModelLoadError, match=r"has no weights: expected \*\.safetensors files"):
        load_model(str(copy))


def test_pickled_weights_are_refused_with_a_conversion_hint(copy: Path) -> None:
    (copy / "model.safetensors").rename(copy / "pytorch_model.bin")

    assert check_model_directory(str(copy)) == [
        f"{copy} has no weights: expected *.safetensors files, got none (found "
        "pytorch_model.bin: convert them to safetensors, e.g. load the model and call "
        "save_pretrained)"
    ]


def test_directory_without_tokenizer_is_refused(copy: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (copy / name).unlink()

    with pytest.raises(ModelLoadError, match=f"{copy} has no tokenizer"):
        load_model(str(copy))


def test_tokenizer_without_chat_template_is_refused(copy: Path) -> None:
    (copy / "chat_template.jinja").unlink()

    with pytest.raises(ModelLoadError, match=f"the tokenizer in {copy} has no chat template"):
        load_model(str(copy))


def test_tokenizer_without_eos_token_is_refused(copy: Path) -> None:
    config = json.loads((copy / "tokenizer_config.json").read_text())
    del config["eos_token"]
    (copy / "tokenizer_config.json").write_text(json.dumps(config))

    with pytest.raises(ModelLoadError, match=f"the tokenizer in {copy} has no eos token"):
        load_model(str(copy))


def test_check_lists_every_problem_without_reading_the_weights(copy: Path) -> None:
    (copy / "model.safetensors").write_bytes(b"not safetensors")  # never read by the check
    (copy / "chat_template.jinja").unlink()
    (copy / "config.json").unlink()

    problems = check_model_directory(str(copy))

    assert [problem.split(" has no ")[1].split(",")[0] for problem in problems] == [
        "config.json",
        "chat template",
    ]


def test_weights_missing_a_tensor_are_refused_rather_than_initialized(copy: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(copy / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})

    with pytest.raises(ModelLoadError, match=r"missing: \['model\.norm\.weight'\]"):
        load_model(str(copy))


def test_unreadable_weights_are_wrapped_with_the_path(copy: Path) -> None:
    (copy / "model.safetensors").write_bytes(b"not safetensors")

    with pytest.raises(ModelLoadError, match=f"transformers cannot load a causal LM from {copy}"):
        load_model(str(copy))
