"""The embedded tiny models share one decoder shape (``grove.capture.tiny_decoder``)."""

from __future__ import annotations

import torch

from grove.capture.embedded import build_model, build_tokenizer
from grove.capture.embedded_moe import build_moe_model
from grove.capture.embedded_vlm import build_vlm_model, build_vlm_tokenizer
from grove.capture.tiny_decoder import seeded, tiny_decoder_config

SIZE = {"hidden_size": 32, "num_layers": 1, "context_length": 256}


def _shown(config: object, keys: dict[str, object]) -> dict[str, object]:
    return {key: getattr(config, key) for key in keys}


def test_the_dense_and_moe_models_have_the_shared_decoder_shape() -> None:
    tokenizer = build_tokenizer()
    shape = tiny_decoder_config(tokenizer, **SIZE)

    assert _shown(build_model(tokenizer, **SIZE).config, shape) == shape
    assert _shown(build_moe_model(tokenizer, **SIZE).config, shape) == shape
    assert shape["intermediate_size"] == 64 and shape["vocab_size"] == len(tokenizer)


def test_the_vision_language_model_has_it_as_its_text_config() -> None:
    tokenizer = build_vlm_tokenizer()
    shape = tiny_decoder_config(tokenizer, **SIZE)

    assert _shown(build_vlm_model(tokenizer, **SIZE).config.text_config, shape) == shape


def test_seeded_builds_the_same_weights_and_keeps_the_global_random_state() -> None:
    torch.manual_seed(7)
    before = torch.random.get_rng_state()

    first = seeded(3, lambda: torch.nn.Linear(4, 4))
    second = seeded(3, lambda: torch.nn.Linear(4, 4))

    assert torch.equal(first.weight, second.weight)
    assert not first.training
    assert torch.equal(torch.random.get_rng_state(), before)
