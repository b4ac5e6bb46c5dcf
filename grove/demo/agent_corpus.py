"""The warm start's corpus: synthetic conversations of a tool-using agent, built from a seed.

The embedded model starts with random weights; ``model.warm_start`` fits it briefly on these
conversations (``grove/demo/warm_start.py``) so that an agent that offers it a tool gets tool
calls from the first step (``docs/train.md``, "The warm start"). Every conversation is one
context of a *lookup agent*, the agent ``grove/demo/tool_agent.py`` plays:

1. The user asks ``What colour is the ITEM?`` (in a context that a compaction restarted, the
   first question follows the notes: ``Notes: SUMMARY`` and a newline).
2. The assistant reasons and calls the ``lookup`` tool:
   ``<think>look up ITEM</think><tool_call>{"arguments": {"item": "ITEM"}, "name": "lookup"}
   </tool_call>``.
3. The tool answers the colour; the assistant answers ``The ITEM is COLOUR.``
4. One to three such rounds; then, in some conversations, the user asks ``Summarize your
   notes.`` and the assistant writes ``The ITEM is COLOUR.`` for every fact of the context (its
   notes first, then its rounds), which the agent keeps when it compacts.

A habit can be mixed in, so that the fitted agent is right only part of the time and GRPO has
something to improve (``CorpusSpec.noted_give_up_fraction``, 0 by default;
``grove/demo/warm_start.py`` ``WARM_START_CORPUS`` sets it): in a context restarted from notes,
the assistant may answer ``I do not know.`` instead of looking the item up.

Items and colours are drawn afresh for each conversation, so the only way to answer is to copy
the item from the question and the colour from the tool's result. The conversations are rendered
exactly as the gateway renders a request (``capture/render.py``: normalized messages, tools in
Grove's one form, the tokenizer's chat template), so the fitted model sees at sampling time the
very text it was fitted on. The loss covers the assistant's tokens only: each assistant turn's
text and its end-of-turn token, never the prompt, the tool results or the template's framing.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from transformers import PreTrainedTokenizerBase

from grove.capture.conversion import chat_tools
from grove.capture.render import Renderer, RenderOptions, normalize_messages

__all__ = [
    "COLOURS",
    "GIVE_UP",
    "ITEMS",
    "LOOKUP_TOOL",
    "SUMMARY_REQUEST",
    "CorpusSpec",
    "TrainingExample",
    "answer",
    "conversations",
    "corpus_examples",
    "lookup_call",
    "lookup_result",
    "notes_prompt",
    "question",
    "summary",
    "tokenize_conversation",
]

ITEMS: Final = (
    "fox", "dog", "sky", "frog", "owl", "bee", "moon", "sea",
    "snow", "grass", "fire", "wolf", "tree", "bird", "lake", "star",
)  # fmt: skip
"""The things a conversation asks about: words the embedded tokenizer splits alike with and
without a leading space, so that the item in a tool call's arguments is the item of the question
token for token but the first."""

COLOURS: Final = ("red", "blue", "green", "gold", "brown", "white", "black", "pink", "grey")
"""The colours the lookup tool answers."""

LOOKUP_TOOL: Final[Mapping[str, Any]] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "The colour of an item.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}}},
    },
}
"""The one tool the conversations offer (Chat Completions form)."""

SUMMARY_REQUEST: Final = "Summarize your notes."
"""The user message that asks the assistant for a summary before a compaction."""

GIVE_UP: Final = "I do not know."
"""The answer of an assistant that does not look the item up."""

_MODEL: Final = "warm-start"  # the render options' model name; it renders nothing


def question(item: str) -> str:
    """The user's question about ``item``."""
    return f"What colour is the {item}?"


def notes_prompt(notes: str, item: str) -> str:
    """The first user message of a context restarted from a summary: the notes, then the
    question about ``item``."""
    return f"Notes: {notes}\n{question(item)}"


def lookup_call(item: str, call_id: str = "call_0") -> dict[str, Any]:
    """The assistant's turn that looks ``item`` up: its reasoning and one ``lookup`` call."""
    return {
        "role": "assistant",
        "reasoning_content": f"look up {item}",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "lookup", "arguments": {"item": item}},
            }
        ],
    }


def lookup_result(item: str, colour: str) -> str:
    """What the ``lookup`` tool answers for ``item`` when its colour is ``colour``: the colour
    after a space, as the answer writes it."""
    return f"{item}: {colour}"


def answer(item: str, colour: str) -> str:
    """The assistant's answer once the tool said ``item`` is ``colour``."""
    return f"The {item} is {colour}."


def summary(facts: Sequence[tuple[str, str]]) -> str:
    """The assistant's summary of ``facts`` (item, colour), in order: its answers again."""
    return " ".join(answer(item, colour) for item, colour in facts)


@dataclass(frozen=True)
class CorpusSpec:
    """What the corpus holds; every field is part of the warm-start cache key."""

    seed: int = 0
    """Seed of the draws (items, colours, rounds, notes, summaries)."""

    conversations: int = 384
    """Conversations in the corpus."""

    max_rounds: int = 3
    """Most question rounds in one conversation (at least one)."""

    notes_fraction: float = 0.3
    """Share of conversations that start from notes, as a compacted context does."""

    summary_fraction: float = 0.5
    """Share of conversations that end with a summary request and its summary."""

    noted_give_up_fraction: float = 0.0
    """Share of the rounds of a context started from notes in which the assistant answers
    ``GIVE_UP`` at once instead of looking the item up."""


@dataclass(frozen=True)
class TrainingExample:
    """One tokenized conversation (producer: :func:`tokenize_conversation`; consumer: the fit).

    ``loss_mask[i]`` says whether ``token_ids[i]`` is an assistant token the fit predicts; both
    tuples have the same length, and the first token is never predicted.
    """

    token_ids: tuple[int, ...]
    loss_mask: tuple[bool, ...]


def conversations(spec: CorpusSpec) -> list[list[dict[str, Any]]]:
    """The corpus's conversations as Chat Completions messages, drawn from ``spec.seed``."""
    draw = random.Random(spec.seed)
    return [_conversation(draw, spec) for _ in range(spec.conversations)]


def _conversation(draw: random.Random, spec: CorpusSpec) -> list[dict[str, Any]]:
    rounds = draw.randint(1, spec.max_rounds)
    noted = draw.random() < spec.notes_fraction
    items = draw.sample(ITEMS, rounds + (draw.randint(1, 2) if noted else 0))
    facts = [(item, draw.choice(COLOURS)) for item in items]
    notes, asked = (facts[rounds:], facts[:rounds]) if noted else ([], facts)
    messages: list[dict[str, Any]] = []
    answered = []  # the facts the assistant looked up and answered
    for index, (item, colour) in enumerate(asked):
        first = index == 0 and notes
        text = notes_prompt(summary(notes), item) if first else question(item)
        messages.append({"role": "user", "content": text})
        if noted and draw.random() < spec.noted_give_up_fraction:
            messages.append({"role": "assistant", "content": GIVE_UP})
            continue
        call_id = f"call_{index}"
        messages += [
            lookup_call(item, call_id),
            {"role": "tool", "tool_call_id": call_id, "content": lookup_result(item, colour)},
            {"role": "assistant", "content": answer(item, colour)},
        ]
        answered.append((item, colour))
    if draw.random() < spec.summary_fraction:
        messages += [
            {"role": "user", "content": SUMMARY_REQUEST},
            {"role": "assistant", "content": summary([*notes, *answered])},
        ]
    return messages


def tokenize_conversation(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] = (LOOKUP_TOOL,),
) -> TrainingExample:
    """``messages`` rendered as the gateway renders them with ``tools``, tokenized once, with the
    loss on each assistant turn: from the end of its generation prompt through its end-of-turn
    token (the template's newline after it is framing)."""
    renderer = Renderer(tokenizer)
    options = RenderOptions(model=_MODEL, tools=chat_tools(tools))
    normalized = normalize_messages(messages).messages
    text = renderer.render(normalized, options, add_generation_prompt=False)
    spans = []
    for index, message in enumerate(normalized):
        if message["role"] != "assistant":
            continue
        start = len(renderer.render(normalized[:index], options, add_generation_prompt=True))
        through = renderer.render(normalized[: index + 1], options, add_generation_prompt=False)
        end = through.rindex(str(tokenizer.eos_token)) + len(str(tokenizer.eos_token))
        spans.append((start, end))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = tuple(
        index > 0 and any(start <= a and b <= end for start, end in spans)
        for index, (a, b) in enumerate(encoded["offset_mapping"])
    )
    return TrainingExample(token_ids=tuple(encoded["input_ids"]), loss_mask=mask)


def corpus_examples(tokenizer: PreTrainedTokenizerBase, spec: CorpusSpec) -> list[TrainingExample]:
    """Every conversation of ``spec``, tokenized with its assistant-token loss mask."""
    return [tokenize_conversation(tokenizer, messages) for messages in conversations(spec)]
