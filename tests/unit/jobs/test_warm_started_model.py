"""The embedded model after the default warm start (``model.warm_start``): what ``load_model``
gives, and that it acts as the lookup agent of ``grove/demo/tool_agent.py`` from the first step.

The fit runs once per test process (``tests/unit/jobs/warm_cache.py``). Generations are sampled at
temperature 1 with fixed seeds, on prompts rendered as the gateway renders the agent's requests,
and parsed as the gateway parses them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest
import torch
from safetensors.torch import load_file

from grove.capture.conversion import chat_tools
from grove.capture.embedded import EmbeddedEngine
from grove.capture.engine import SamplingParams
from grove.capture.render import Renderer, RenderOptions, normalize_messages
from grove.capture.toolcalls import parse_output
from grove.demo.agent_corpus import (
    COLOURS,
    ITEMS,
    LOOKUP_TOOL,
    lookup_call,
    lookup_result,
    question,
)
from grove.demo.warm_start import CACHE_DIRECTORY
from grove.engines.models import LoadedModel, load_model
from tests.unit.jobs.warm_cache import seed_workdir, warm_model

QUESTIONS = 16


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.getbasetemp()


@pytest.fixture(scope="module")
def warm(base) -> LoadedModel:
    return warm_model(base)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Sample on one thread: on a busy 2-core machine two threads make it many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def generate(loaded: LoadedModel, messages: list[dict], seed: int) -> str:
    """The model's next assistant text on ``messages`` with the lookup tool, as the gateway
    renders the request; sampled with ``seed``, end-of-turn token dropped."""
    renderer = Renderer(loaded.tokenizer)
    options = RenderOptions(model=loaded.name, tools=chat_tools([LOOKUP_TOOL]))
    prompt = renderer.encode(renderer.render(normalize_messages(messages).messages, options))
    stop = loaded.tokenizer.eos_token_id
    engine = EmbeddedEngine(loaded.model, stop_token_ids=[stop])
    generation = engine.generate(prompt, SamplingParams(max_tokens=48, seed=seed))
    return renderer.decode([t for t in generation.token_ids if t != stop])


def facts() -> list[tuple[str, str]]:
    draw = random.Random(2024)
    return [(draw.choice(ITEMS), draw.choice(COLOURS)) for _ in range(QUESTIONS)]


def looked_up_items(loaded: LoadedModel) -> list[str | None]:
    """For each question, the item of the model's lookup call (None: no parsable lookup)."""
    items = []
    for seed, (item, _) in enumerate(facts()):
        parsed = parse_output(
            generate(loaded, [{"role": "user", "content": question(item)}], seed),
            tool_calls=True,
        )
        calls = [c for c in parsed.tool_calls if c.name == "lookup"]
        items.append(json.loads(calls[0].arguments).get("item") if calls else None)
    return items


def test_load_model_gives_the_embedded_model_the_cached_fit(warm, base) -> None:
    (entry,) = (base / "shared-warm-start" / CACHE_DIRECTORY).iterdir()
    fitted = load_file(entry / "model.safetensors")
    state = warm.model.state_dict()
    random_weights = load_model("embedded").model.state_dict()

    assert all(state[name].equal(tensor) for name, tensor in fitted.items())
    assert not any(random_weights[name].equal(tensor) for name, tensor in fitted.items())
    assert warm.model.training is False


def test_a_warm_started_model_is_cast_to_the_requested_dtype_after_the_fit(warm, base) -> None:
    halved = warm_model(base, dtype="bfloat16")

    assert {p.dtype for p in halved.model.parameters()} == {torch.bfloat16}
    assert all(
        p.equal(q.to(torch.bfloat16))
        for p, q in zip(halved.model.parameters(), warm.model.parameters(), strict=True)
    )


def test_a_workdir_seeded_with_the_cache_loads_it_under_the_same_key(base, tmp_path) -> None:
    entry = seed_workdir(tmp_path, base)

    assert entry.parent == tmp_path / CACHE_DIRECTORY
    assert (entry / "manifest.json").is_file()


def test_the_warm_started_model_looks_up_the_item_it_is_asked_about(warm) -> None:
    asked = [item for item, _ in facts()]

    looked_up = looked_up_items(warm)

    right = sum(got == want for got, want in zip(looked_up, asked, strict=True))
    assert right >= QUESTIONS * 3 // 4, looked_up


def test_the_warm_started_model_answers_with_the_colour_the_tool_returned(warm) -> None:
    answers = []
    for seed, (item, colour) in enumerate(facts()):
        messages = [
            {"role": "user", "content": question(item)},
            lookup_call(item),
            {"role": "tool", "tool_call_id": "call_0", "content": lookup_result(item, colour)},
        ]
        answers.append((colour, generate(warm, messages, seed)))

    right = sum(f" {colour}." in text for colour, text in answers)
    assert right >= QUESTIONS * 3 // 4, answers
