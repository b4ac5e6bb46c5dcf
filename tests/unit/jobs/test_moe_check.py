"""The setup check on the loaded model, before any rollout (``grove/train/preflight.py``): dense
models pass; an MoE model passes only with dropless per-token routing that Grove replays, no
auxiliary loss, no capacity limit, and an engine that captures its routes."""

from __future__ import annotations

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM

from grove.capture.embedded import build_model, build_tokenizer
from grove.capture.embedded_moe import build_moe_model
from grove.config import ConfigurationError, load_config
from grove.engines.models import EMBEDDED, ModelLoadError, load_model
from grove.train.preflight import ModelCheckError, check_policy_model, moe_problems

RULE = (
    r"Model 'tiny' is refused before any rollout: MoE models must use supported dropless "
    r"per-token routing without auxiliary losses or capacity limits \(docs/moe\.md\)"
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def moe(tokenizer):
    return build_moe_model(tokenizer, seed=0, hidden_size=16, num_layers=1)


def test_a_dense_model_passes(tokenizer) -> None:
    check_policy_model(build_model(tokenizer, seed=0), "tiny", engine_kind="embedded")


def test_the_embedded_moe_model_passes(moe) -> None:
    check_policy_model(moe, "tiny", engine_kind="embedded")


@pytest.mark.parametrize(
    ("key", "value"),
    [("capacity_factor", 1.25), ("expert_capacity", 64), ("moe_expert_capacity_factor", 1.0)],
)
def test_an_moe_model_with_a_capacity_limit_is_refused(moe, key: str, value: float) -> None:
    setattr(moe.config, key, value)
    with pytest.raises(ModelCheckError, match=RULE + rf"\.\n  - config\.{key} is {value!r}"):
        check_policy_model(moe, "tiny", engine_kind="embedded")


def test_an_moe_model_that_drops_tokens_is_refused(moe) -> None:
    moe.config.moe_token_dropping = True
    with pytest.raises(ModelCheckError, match=r"config\.moe_token_dropping is True: token drop"):
        check_policy_model(moe, "tiny", engine_kind="embedded")


def test_an_moe_model_with_its_load_balancing_loss_on_is_refused(moe) -> None:
    moe.config.output_router_logits = True
    moe.config.router_aux_loss_coef = 0.001
    with pytest.raises(ModelCheckError, match=r"output_router_logits is true with router_aux"):
        check_policy_model(moe, "tiny", engine_kind="embedded")


def test_an_aux_loss_coefficient_without_router_logits_computes_no_loss_and_passes(moe) -> None:
    moe.config.router_aux_loss_coef = 0.001  # transformers adds it only with router logits on
    assert moe_problems(moe) == []


def test_an_moe_model_with_a_megatron_aux_loss_is_refused(moe) -> None:
    moe.config.moe_aux_loss_coeff = 0.01
    with pytest.raises(ModelCheckError, match=r"config\.moe_aux_loss_coeff is 0\.01: an aux"):
        check_policy_model(moe, "tiny", engine_kind="embedded")


def test_a_mixtral_with_router_jitter_is_refused() -> None:
    config = MixtralConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=4,
        num_experts_per_tok=2,
        router_jitter_noise=0.1,
    )
    with torch.random.fork_rng(devices=[]):
        model = MixtralForCausalLM(config)
    assert moe_problems(model) == [
        "config.router_jitter_noise is 0.1: the router's input is randomized in training, so "
        "the learner's gate weights are not the engine's; set it to 0"
    ]


def test_an_moe_model_whose_router_grove_cannot_replay_is_refused(tokenizer) -> None:
    class SwitchRouter(torch.nn.Module):
        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return hidden

    model = build_model(tokenizer, seed=0)
    model.model.layers[0].mlp.router = SwitchRouter()
    with pytest.raises(ModelCheckError, match=r"\(SwitchRouter\) use a router Grove cannot"):
        check_policy_model(model, "tiny", engine_kind="embedded")


def test_an_moe_model_on_an_engine_that_captures_no_routes_is_refused(moe) -> None:
    with pytest.raises(ModelCheckError, match=r"engine.kind 'vllm' does not capture routed"):
        check_policy_model(moe, "tiny", engine_kind="vllm")


def test_every_problem_is_listed_in_one_refusal(moe) -> None:
    moe.config.capacity_factor = 2.0
    moe.config.moe_aux_loss_coeff = 0.01
    with pytest.raises(ModelCheckError) as refused:
        check_policy_model(moe, "tiny", engine_kind="vllm")
    assert [p.split(" is ")[0].split(" ")[0] for p in refused.value.problems] == [
        "config.capacity_factor",
        "config.moe_aux_loss_coeff",
        "engine.kind",
    ]


def test_load_model_builds_the_embedded_moe_for_architecture_moe() -> None:
    loaded = load_model(EMBEDDED, architecture="moe")
    assert type(loaded.model).__name__ == "Qwen2MoeForCausalLM"
    assert loaded.name == "grove/embedded-tiny-moe"


def test_architecture_moe_with_a_model_directory_is_refused_by_the_configuration(
    tmp_path,
) -> None:
    with pytest.raises(ConfigurationError, match=r"model.architecture: moe builds the embedded"):
        load_config({"model": {"path": str(tmp_path), "architecture": "moe"}})


def test_load_model_refuses_architecture_moe_for_a_directory(tmp_path) -> None:
    with pytest.raises(ModelLoadError, match=r"builds the embedded model only"):
        load_model(str(tmp_path), architecture="moe")


def test_a_warm_start_of_the_embedded_moe_is_refused_by_the_configuration() -> None:
    with pytest.raises(ConfigurationError, match=r"model.warm_start fits the dense embedded"):
        load_config({"model": {"architecture": "moe", "warm_start": True}})
