"""Each generation carries the policy version of the weights that sampled it, and a weight update
(``EmbeddedEngine.updating``) never overlaps a generation."""

from __future__ import annotations

import threading

import pytest
from transformers import PreTrainedTokenizerFast

from grove.capture.embedded import EmbeddedEngine
from grove.capture.engine import Generation, SamplingParams
from grove.capture.errors import InvalidGenerationError

SAMPLING = SamplingParams(max_tokens=3, seed=5)


@pytest.fixture
def own_engine(tokenizer: PreTrainedTokenizerFast) -> EmbeddedEngine:
    """An engine of this test alone (the session's engine keeps version 0)."""
    return EmbeddedEngine.build(tokenizer)


@pytest.fixture(scope="module")
def prompt(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    return tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n", add_special_tokens=False)


def test_a_generation_carries_its_policy_version_and_none_means_unknown() -> None:
    known = Generation(token_ids=(1,), logprobs=(-0.1,), finish_reason="stop", policy_version=3)
    unknown = Generation(token_ids=(1,), logprobs=(-0.1,), finish_reason="stop")
    assert (known.policy_version, unknown.policy_version) == (3, None)


def test_a_negative_policy_version_is_refused() -> None:
    with pytest.raises(InvalidGenerationError, match=r"policy_version is None or .*; got -1"):
        Generation(token_ids=(1,), logprobs=(-0.1,), finish_reason="stop", policy_version=-1)


def test_embedded_engine_starts_at_version_zero(
    own_engine: EmbeddedEngine, prompt: list[int]
) -> None:
    assert own_engine.generate(prompt, SAMPLING).policy_version == 0


def test_embedded_engine_reports_the_version_set_before_the_call(
    own_engine: EmbeddedEngine, prompt: list[int]
) -> None:
    with own_engine.updating():
        own_engine.policy_version = 2
    first = own_engine.generate(prompt, SAMPLING)
    own_engine.policy_version = 3
    second = own_engine.generate(prompt, SAMPLING)
    assert (first.policy_version, second.policy_version) == (2, 3)
    assert first.token_ids == second.token_ids  # same seed, same weights: only the label moved


def test_updating_is_reentrant_in_its_own_thread(
    own_engine: EmbeddedEngine, prompt: list[int]
) -> None:
    # The training loop holds the update across the optimizer step and the publish, which
    # enters it again; a generation in the same thread is not held off by its own update.
    with own_engine.updating(), own_engine.updating():
        own_engine.policy_version = 1
        assert own_engine.generate(prompt, SAMPLING).policy_version == 1


def test_updating_holds_off_a_concurrent_generation_until_it_exits(
    own_engine: EmbeddedEngine, prompt: list[int]
) -> None:
    started, finished = threading.Event(), threading.Event()
    order: list[str] = []
    results: list[Generation] = []

    def generate() -> None:
        started.set()
        results.append(own_engine.generate(prompt, SAMPLING))
        order.append("generated")
        finished.set()

    worker = threading.Thread(target=generate)
    with own_engine.updating():
        worker.start()
        assert started.wait(10)
        # Bounded wait for something that must not happen: a held-off generation cannot
        # finish however long the update lasts (never a false failure, only a false pass).
        assert not finished.wait(0.5)
        own_engine.policy_version = 7  # the last thing the update does
        order.append("updated")
    worker.join(30)
    assert order == ["updated", "generated"]
    assert [g.policy_version for g in results] == [7]


def test_updating_waits_for_a_generation_in_progress(
    own_engine: EmbeddedEngine, prompt: list[int]
) -> None:
    in_forward, release, entered = threading.Event(), threading.Event(), threading.Event()
    generation: list[Generation] = []

    def pause(module: object, args: object) -> None:
        if not in_forward.is_set():
            in_forward.set()
            assert release.wait(10)

    def update() -> None:
        with own_engine.updating():
            entered.set()
            own_engine.policy_version = 1

    hook = own_engine.model.register_forward_pre_hook(pause)
    worker = threading.Thread(
        target=lambda: generation.append(own_engine.generate(prompt, SAMPLING))
    )
    updater = threading.Thread(target=update)
    try:
        worker.start()
        assert in_forward.wait(10)  # the generation is inside the model
        updater.start()
        assert not entered.wait(0.5)  # bounded wait for what must not happen
        release.set()
        assert entered.wait(10)
        updater.join(10)
        worker.join(10)
    finally:
        release.set()
        hook.remove()
    assert generation[0].policy_version == 0  # its weights were those before the update
    assert own_engine.generate(prompt, SAMPLING).policy_version == 1
