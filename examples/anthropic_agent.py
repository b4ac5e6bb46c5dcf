"""A tool-using agent that compacts its context, on the official ``anthropic`` client.

``play(client, task, seed, **options)`` is the harness ``grove train examples/anthropic.yaml``
calls once per rollout. It plays the demo's lookup task (``grove/demo/tool_agent.py``: a task
names the items to ask about and the table its one tool reads) through ``POST /v1/messages``:
``grove.client.anthropic_client`` turns the ``openai`` client ``grove train`` hands it into an
``anthropic.Anthropic`` bound to the same attempt, and the agent is the loop the ``anthropic``
client's documentation teaches:

- send the context with the ``lookup`` tool (streamed, ``messages.stream(...)``, unless
  ``stream`` is false) and append the answer's ``content`` as the assistant turn;
- answer each ``tool_use`` block with a ``tool_result`` block in the next user turn, so Grove
  continues the call from its exact tokens; the model then answers the question;
- when the context passes ``compact_at_tokens`` (the answer's ``usage``), ask for a summary and
  start a new context from it (``Notes: ...`` before the next question): a rewrite, so Grove
  starts a new root and the rollout trains as more than one row.

Answers that are empty or hold tool-call markup that does not parse are rejected
(``grove.client.reject``) and sampled again, as is a seeded fraction of the rest. The agent
returns its history in the Messages form, each assistant turn naming its Message by
``response_id`` (``docs/gateway.md``, "Messages API"), and the demo's verifiable reward. Its blocks
map onto the very Chat messages the demo's agent sends, so ``model.warm_start`` fits the
embedded model for it too.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any, Final

import anthropic
from anthropic.types import Message
from openai import OpenAI

from grove.client import CALL_ID_HEADER, anthropic_client, reject
from grove.demo.agent_corpus import LOOKUP_TOOL, SUMMARY_REQUEST, notes_prompt, question
from grove.demo.tool_agent import kept_facts, lookup, names_colour, requested_item

__all__ = ["LOOKUP", "play"]

LOOKUP: Final = {
    "name": LOOKUP_TOOL["function"]["name"],
    "description": LOOKUP_TOOL["function"]["description"],
    "input_schema": LOOKUP_TOOL["function"]["parameters"],
}
"""The demo's ``lookup`` tool in the Messages form."""


class _Agent:
    """One rollout: the context the model sees, the history returned, the verifier's scores."""

    def __init__(
        self, client: OpenAI, seed: int, table: Mapping[str, str], options: dict[str, Any]
    ) -> None:
        self.openai = client
        self.model = client.models.list().data[0].id
        self.messages: anthropic.Anthropic = anthropic_client(client)
        self.seed, self.table, self.options = seed, table, options
        self.context: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []
        self.facts: list[tuple[str, str]] = []
        self.scores: list[float] = []
        self.calls = self.tokens = 0

    def observe(self, content: str | list[dict[str, Any]]) -> None:
        """A user turn, for the model and the history alike."""
        turn = {"role": "user", "content": content}
        self.context.append(turn)
        self.history.append(turn)

    def sample(self) -> Message:
        """The model's next answer (sampled again after a rejection), appended to the context
        and, with its response id, to the history."""
        retries = self.options["max_response_retries"]
        for retry in range(retries + 1):
            call_id = f"c{self.calls}-{retry}"
            message = self._create(call_id)
            text = _text(message)
            calls = _tool_uses(message)
            malformed = not calls and (not text.strip() or "<tool_call>" in text)
            unlucky = random.Random(f"{self.seed}/{call_id}").random() < self.options["reject"]
            if retry == retries or not (malformed or unlucky):
                break
            reject(self.openai, message.id, "malformed" if malformed else "resampled")
        self.calls += 1
        self.tokens = message.usage.input_tokens + message.usage.output_tokens
        content = [block.model_dump(exclude_none=True) for block in message.content]
        self.context.append({"role": "assistant", "content": content})
        self.history.append({"role": "assistant", "content": content, "response_id": message.id})
        return message

    def _create(self, call_id: str) -> Message:
        request: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.options["max_tokens"],
            "messages": self.context,
            "tools": [LOOKUP],
            "extra_headers": {CALL_ID_HEADER: call_id},
        }
        if not self.options["stream"]:
            return self.messages.messages.create(**request)
        with self.messages.messages.stream(**request) as events:
            return events.get_final_message()

    def ask(self, item: str, notes: str | None) -> None:
        """One question: the model's lookups, run on the table, then its answer; scored."""
        self.observe(question(item) if notes is None else notes_prompt(notes, item))
        message = self.sample()
        looked_up = False
        for _ in range(self.options["max_lookups"]):
            calls = _tool_uses(message)
            if not calls:
                break
            results = []
            for call in calls:
                arguments = json.dumps(call.input)
                looked_up |= requested_item(call.name, arguments) == item
                answer = lookup(self.table, call.name, arguments)
                results.append({"type": "tool_result", "tool_use_id": call.id, "content": answer})
            self.observe(results)
            message = self.sample()
        colour = self.table[item]
        self.facts.append((item, colour))
        self.scores += [float(looked_up), float(names_colour(_text(message), colour))]

    def compact(self) -> str:
        """Ask for a summary, score it, and start a new context from it (the notes)."""
        self.observe(SUMMARY_REQUEST)
        notes = _text(self.sample()).strip()
        self.scores.append(kept_facts(notes, self.facts))
        self.context = []
        self.facts = [(i, c) for i, c in self.facts if f"{i} is {c}" in notes]
        return notes


def _text(message: Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def _tool_uses(message: Message) -> list[Any]:
    return [block for block in message.content if block.type == "tool_use"]


def play(
    client: OpenAI,
    task: dict[str, Any],
    seed: int,
    *,
    max_tokens: int = 48,
    compact_at_tokens: int = 200,
    max_lookups: int = 2,
    max_compactions: int | None = None,
    reject_fraction: float = 0.15,
    max_response_retries: int = 1,
    stream: bool = True,
) -> dict[str, Any]:
    """One rollout of ``task``: each question looked up and answered, compacting when the context
    passes ``compact_at_tokens`` (at most ``max_compactions`` times; None: no limit); returns the
    harness result (``output``: the accepted history in the Messages form, ``reward``).
    Rejections derive from ``seed``, so the same seed under the same weights replays the same
    rollout."""
    options = {
        "max_tokens": max_tokens,
        "max_lookups": max_lookups,
        "reject": reject_fraction,
        "max_response_retries": max_response_retries,
        "stream": stream,
    }
    agent = _Agent(client, seed, dict(task["facts"]), options)
    try:
        questions: list[str] = list(task["questions"])
        notes: str | None = None
        compactions = 0
        for index, item in enumerate(questions):
            agent.ask(item, notes)
            notes = None
            room = max_compactions is None or compactions < max_compactions
            if room and index + 1 < len(questions) and agent.tokens >= compact_at_tokens:
                notes = agent.compact()
                compactions += 1
    finally:
        agent.messages.close()
    return {"output": agent.history, "reward": sum(agent.scores) / len(agent.scores)}
