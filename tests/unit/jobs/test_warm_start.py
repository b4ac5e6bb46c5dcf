"""The warm start: a deterministic supervised fit of the embedded model, cached under the workdir
by a key of everything that decides it, and fitted again when the cache does not verify.

A few-step fit on a few conversations shows each rule; the default fit, and what it teaches, is
``tests/unit/jobs/test_warm_started_model.py``'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grove.capture.embedded import build_model, build_tokenizer
from grove.config import ConfigurationError, load_config
from grove.demo.agent_corpus import CorpusSpec, corpus_examples
from grove.demo.warm_start import (
    CACHE_DIRECTORY,
    FitSettings,
    WarmStart,
    WarmStartError,
    fit,
    warm_start,
    warm_start_key,
)
from grove.engines.models import ModelLoadError, load_model, save_embedded_model

CORPUS = CorpusSpec(conversations=8)
SETTINGS = FitSettings(steps=6, batch_size=2, warmup_steps=2)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[name].equal(b[name]) for name in a)


def start(tokenizer, root: Path, **overrides) -> tuple[WarmStart, dict[str, torch.Tensor]]:
    """The tiny warm start of the seed-0 embedded model under ``root``, and its weights."""
    model = build_model(tokenizer, seed=overrides.pop("base_seed", 0))
    options = {"corpus": CORPUS, "settings": SETTINGS, **overrides}
    done = warm_start(model, tokenizer, root, base_seed=0, **options)
    return done, weights(model)


def test_the_fit_lowers_the_loss_on_the_assistant_tokens(tokenizer) -> None:
    model = build_model(tokenizer, seed=0)
    examples = corpus_examples(tokenizer, CORPUS)

    losses = fit(model, examples, FitSettings(steps=20, batch_size=4), pad_token_id=0)

    assert len(losses) == 20
    assert losses[-1] < losses[0] / 2
    assert model.training is False


def test_the_same_settings_fit_the_same_weights_bit_for_bit(tokenizer, tmp_path: Path) -> None:
    _, first = start(tokenizer, tmp_path / "a")
    _, second = start(tokenizer, tmp_path / "b")
    base = weights(build_model(tokenizer, seed=0))

    assert equal(first, second)
    assert not equal(first, base)


def test_the_fit_leaves_the_global_random_state_and_the_thread_count_as_they_were(
    tokenizer, tmp_path: Path
) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    threads = torch.get_num_threads()

    start(tokenizer, tmp_path)

    assert torch.rand(3).equal(expected)
    assert torch.get_num_threads() == threads


def test_a_second_warm_start_loads_the_cache_instead_of_fitting(tokenizer, tmp_path: Path) -> None:
    first, fitted = start(tokenizer, tmp_path)
    second, loaded = start(tokenizer, tmp_path)

    assert (first.fitted, second.fitted) == (True, False)
    assert first.directory == second.directory == tmp_path / CACHE_DIRECTORY / first.key
    assert sorted(p.name for p in first.directory.iterdir()) == [
        "manifest.json",
        "model.safetensors",
    ]
    assert second.manifest == first.manifest
    assert equal(loaded, fitted)


def test_the_manifest_records_the_settings_the_losses_and_the_weights_digest(
    tokenizer, tmp_path: Path
) -> None:
    done, _ = start(tokenizer, tmp_path)

    manifest = json.loads((done.directory / "manifest.json").read_text())
    assert manifest["key"] == done.key
    assert manifest["fit"]["steps"] == SETTINGS.steps
    assert manifest["corpus"]["conversations"] == CORPUS.conversations
    assert manifest["examples"] == CORPUS.conversations
    assert manifest["final_loss"] < manifest["first_loss"]
    assert manifest["weights_bytes"] == (done.directory / "model.safetensors").stat().st_size


@pytest.mark.parametrize(
    "damage",
    ["flip a weight byte", "truncate the weights", "no manifest", "manifest of another key"],
)
def test_a_damaged_cache_entry_is_detected_and_fitted_again(
    tokenizer, tmp_path: Path, damage: str
) -> None:
    first, fitted = start(tokenizer, tmp_path)
    weights_file = first.directory / "model.safetensors"
    manifest_file = first.directory / "manifest.json"
    data = weights_file.read_bytes()
    if damage == "flip a weight byte":
        weights_file.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif damage == "truncate the weights":
        weights_file.write_bytes(data[: len(data) // 2])
    elif damage == "no manifest":
        manifest_file.unlink()
    else:
        manifest_file.write_text(json.dumps({**first.manifest, "key": "0" * 64}))

    again, refitted = start(tokenizer, tmp_path)

    assert again.fitted is True
    assert equal(refitted, fitted)
    assert weights_file.read_bytes() == data
    assert json.loads(manifest_file.read_text())["key"] == first.key


def test_a_leftover_temporary_directory_does_not_count_as_a_cache(
    tokenizer, tmp_path: Path
) -> None:
    first, _ = start(tokenizer, tmp_path)
    partial = first.directory.with_name(f".{first.key}.1.dead.tmp")
    first.directory.rename(partial)
    (partial / "manifest.json").unlink()  # a write cut short before its manifest

    again, _ = start(tokenizer, tmp_path)

    assert again.fitted is True
    assert again.directory == first.directory


@pytest.mark.parametrize(
    "change",
    [
        {"corpus": CorpusSpec(conversations=8, seed=1)},
        {"settings": FitSettings(steps=6, batch_size=2, warmup_steps=2, learning_rate=1e-3)},
        {"base_seed": 1},
    ],
    ids=["corpus", "fit settings", "base seed"],
)
def test_the_cache_key_names_the_corpus_the_fit_and_the_base_model(tokenizer, change: dict) -> None:
    def key(**options) -> str:
        seed = options.pop("base_seed", 0)
        model = build_model(tokenizer, seed=seed)
        merged = {"corpus": CORPUS, "settings": SETTINGS, **options}
        return warm_start_key(model, tokenizer, base_seed=seed, **merged)

    assert key() == key()
    assert key(**change) != key()


def test_a_workdir_that_cannot_hold_the_cache_is_refused_with_its_path(
    tokenizer, tmp_path: Path
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")

    with pytest.raises(WarmStartError, match=r"a-file/warm_start/[0-9a-f]{64}: cannot write"):
        start(tokenizer, blocked)


def test_a_warm_start_of_a_model_directory_is_refused(tmp_path: Path) -> None:
    directory = save_embedded_model(tmp_path / "policy")

    with pytest.raises(ModelLoadError, match=r"model\.warm_start fits the embedded model only"):
        load_model(str(directory), warm_start_dir=tmp_path)


def test_the_configuration_refuses_a_warm_start_of_a_model_directory(tmp_path: Path) -> None:
    directory = save_embedded_model(tmp_path / "policy")

    with pytest.raises(ConfigurationError, match=r"model\.warm_start fits the embedded model only"):
        load_config({"model": {"path": str(directory), "warm_start": True}})
    assert load_config({"model": {"warm_start": True}}).model.warm_start is True
