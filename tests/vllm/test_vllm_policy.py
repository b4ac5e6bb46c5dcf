"""Publishing weights to a running vLLM server (``engine.vllm_url``): reload, version, probe.

The server is the session's (``tests/vllm/conftest.py``), started with development endpoints on
the untied tiny model. Each test changes the trainer's weights in a known way and shows that the
server samples the new ones after ``publish``; the module puts the original weights back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import torch
import yaml

from grove.capture.engine import SamplingParams
from grove.config import GroveConfig, load_config
from grove.engines.models import LoadedModel, load_model
from grove.engines.policy import VllmPolicy, VllmWeightsError, open_policy_engine
from grove.engines.policy import write_serving_directory as write_weights
from tests.vllm.server import VllmServer

pytestmark = pytest.mark.vllm

TOLERANCE: Final = 1e-4  # float32: measured |vLLM - transformers| below 2e-6 on these tokens
PROMPT: Final = [5, 6, 7, 8, 9, 10, 11, 12]


def _config(tmp_path: Path, url: str) -> GroveConfig:
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "engine": {
                    "kind": "vllm",
                    "vllm_url": url,
                    "vllm_weights_dir": str(tmp_path / "weights"),
                },
                "harness": {"target": "external"},
            }
        )
    )
    return load_config(path)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    """The trainer's model: the tiny model, whose weights the tests change."""
    return load_model(str(tiny_model_dir))


@pytest.fixture(scope="module")
def policy(
    dev_server: VllmServer,
    loaded: LoadedModel,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VllmPolicy]:
    """A policy on the session's server at step 0; the original weights are put back after."""
    root = tmp_path_factory.mktemp("policy")
    opened = open_policy_engine(_config(root, dev_server.base_url), loaded, step=0)
    assert isinstance(opened, VllmPolicy)
    try:
        yield opened
    finally:
        original = write_weights(load_model(str(tiny_model_dir)), root / "original")
        opened.engine.reload_weights(str(original))
        opened.close()


def _perturb(model: torch.nn.Module, *, names: str = "", seed: int, scale: float = 0.05) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if names in name:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)


def _served_error(policy: VllmPolicy, model: torch.nn.Module, seed: int) -> float:
    """Largest |server - trainer| logprob over a seeded generation of 16 tokens."""
    generation = policy.engine.generate(PROMPT, SamplingParams(max_tokens=16, seed=seed))
    ids = torch.tensor([PROMPT + list(generation.token_ids)])  # (1, P + G)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1]  # (G, V)
    steps = torch.log_softmax(logits.float(), dim=-1)
    reference = [float(steps[i, t]) for i, t in enumerate(generation.token_ids)]
    return max(abs(a - b) for a, b in zip(generation.logprobs, reference, strict=True))


def test_opening_publishes_the_trainers_weights_as_version_zero(policy: VllmPolicy) -> None:
    assert (policy.policy_version, policy.engine.weight_version()) == (0, "0")
    assert policy.weights_dir is not None and policy.weights_dir.name == "step-000000"


def test_publish_serves_every_changed_weight(policy: VllmPolicy, loaded: LoadedModel) -> None:
    _perturb(loaded.model, seed=1)
    before = _served_error(policy, loaded.model, seed=3)
    policy.publish(1)
    assert before > 0.01  # the server still had the old weights: the change is visible
    assert _served_error(policy, loaded.model, seed=3) < TOLERANCE
    assert (policy.policy_version, policy.engine.weight_version()) == (1, "1")


def test_publish_serves_a_changed_embedding_through_the_output_layer_too(
    policy: VllmPolicy, loaded: LoadedModel
) -> None:
    # The tied embedding is also the output layer: written untied, both reload.
    _perturb(loaded.model, names="embed_tokens", seed=2, scale=0.2)
    assert _served_error(policy, loaded.model, seed=4) > 0.01
    policy.publish(2)
    assert _served_error(policy, loaded.model, seed=4) < TOLERANCE


def test_generations_report_the_version_that_sampled_them(policy: VllmPolicy) -> None:
    generation = policy.engine.generate(PROMPT, SamplingParams(max_tokens=2, seed=0))
    assert generation.policy_version == policy.policy_version == 2


def test_publish_keeps_only_the_newest_step_directory(policy: VllmPolicy) -> None:
    assert policy.weights_dir is not None
    assert sorted(p.name for p in policy.weights_dir.parent.glob("step-*")) == ["step-000002"]


def test_server_that_serves_other_weights_fails_the_probe(
    policy: VllmPolicy, loaded: LoadedModel, tmp_path: Path
) -> None:
    # Behind Grove's back, the server gets other weights: the next verification says so.
    stale = write_weights(load_model(str(policy.weights_dir)), tmp_path / "stale")
    _perturb(loaded.model, seed=5, scale=0.2)
    publisher = policy._publisher
    assert publisher is not None
    policy.engine.reload_weights(str(stale))
    with pytest.raises(VllmWeightsError, match=r"does not sample the trainer's weights"):
        publisher.verify(policy.engine, 3, stale)
    policy.publish(3)  # and a publish repairs it
    assert _served_error(policy, loaded.model, seed=6) < TOLERANCE


def test_publish_records_the_seconds_it_took(policy: VllmPolicy) -> None:
    assert policy.publish_seconds is not None and 0 < policy.publish_seconds < 60
