"""The saved tiny model is the embedded model, in the layout vLLM loads (no vLLM needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen2ForCausalLM

from grove.capture.embedded import CHATML_TEMPLATE, build_model, build_tokenizer
from tests.vllm.build_model import HIDDEN_SIZE, save_tiny_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model saved once for the module."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_config_names_the_qwen2_architecture_in_float32(saved: Path) -> None:
    config = json.loads((saved / "config.json").read_text())
    assert (config["architectures"], config["dtype"]) == (["Qwen2ForCausalLM"], "float32")


def test_heads_are_32_wide_as_vllm_cpu_attention_requires(saved: Path) -> None:
    config = json.loads((saved / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 32


def test_generation_config_ends_only_at_end_of_turn(saved: Path) -> None:
    generation = json.loads((saved / "generation_config.json").read_text())
    assert generation["eos_token_id"] == build_tokenizer().eos_token_id


def test_saved_weights_are_the_embedded_models(saved: Path) -> None:
    loaded = Qwen2ForCausalLM.from_pretrained(saved).state_dict()
    built = build_model(build_tokenizer(), hidden_size=HIDDEN_SIZE).state_dict()
    assert loaded.keys() == built.keys()
    assert all(torch.equal(loaded[name], built[name]) for name in built)


def test_saved_tokenizer_is_the_embedded_tokenizer(saved: Path) -> None:
    loaded = AutoTokenizer.from_pretrained(saved)
    assert loaded.get_vocab() == build_tokenizer().get_vocab()
    assert loaded.chat_template == CHATML_TEMPLATE
