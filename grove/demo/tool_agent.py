"""A tool-using agent that compacts its context: a Grove harness on the official ``openai`` client.

``play(client, task, seed, **options)`` is the harness ``grove demo`` calls once per rollout
(``grove/demo/demo.yaml``: ``harness.target: grove.demo.tool_agent:play``). A task names the items
to ask about and the table the agent's one tool reads (``grove/demo/tool_tasks.jsonl``)::

    {"questions": ["fox", "sky", "leaf"], "facts": {"fox": "red", "sky": "blue", ...}}

For each item the agent asks ``What colour is the ITEM?`` and offers the ``lookup`` tool. When the
model calls it, the agent runs the call on the task's table and sends the result back after the
model's own message (its reasoning and tool calls echoed as they came), so Grove continues the
call instead of starting a new context; the model then answers. When the context passes
``compact_at_tokens`` (the gateway's usage count), the agent asks the model to summarize its notes
and starts a new context from the summary (``Notes: ...`` before the next question): a rewrite,
so Grove starts a new root and the rollout trains as more than one row. Answers that are empty or
hold tool-call markup that does not parse are rejected with ``grove.client.reject`` and sampled
again, as is a seeded fraction of the rest; rejected answers never enter the history.

A fork (``task["fork"]``, ``docs/fork.md``) continues a recorded conversation instead of starting
one: the agent reads where it stands from the conversation — the question last asked, the lookups
done since, a summary just written — finishes that question or compacts as the conversation asks,
and goes on with the next questions. Its reward counts only the checks it scored itself, so the
forks of one state compare what each did from there.

The reward is verifiable from the task alone: the mean, over the agent's checks, of 1 for each
question whose item the model looked up, 1 for each answer that names the item's colour, and for
each summary the share of its context's facts (``ITEM is COLOUR``) it keeps. The warm-started
embedded model (``model.warm_start``, fitted on conversations of this very agent by
``grove/demo/agent_corpus.py``) looks up and answers in a fresh context from the first step, but
after a compaction it mostly answers ``I do not know.`` without the tool, and it often writes
summaries that keep nothing; GRPO teaches it to look up and to keep its notes.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from openai import OpenAI
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageParam,
    ChatCompletionToolUnionParam,
)

from grove.client import CALL_ID_HEADER, reject
from grove.demo.agent_corpus import (
    LOOKUP_TOOL,
    SUMMARY_REQUEST,
    lookup_result,
    notes_prompt,
    question,
)

__all__ = ["kept_facts", "lookup", "names_colour", "play", "requested_item"]

_TOOL_MARKUP = "<tool_call>"


def requested_item(name: str, arguments: str) -> str | None:
    """The item a tool call asks ``lookup`` about; None when it is another tool or malformed."""
    if name != "lookup":
        return None
    try:
        item = json.loads(arguments).get("item")
    except (ValueError, AttributeError):
        return None
    return item if isinstance(item, str) else None


def lookup(facts: Mapping[str, str], name: str, arguments: str) -> str:
    """The tool: what ``lookup`` answers for the call's item (``ITEM: COLOUR``), or why it
    cannot."""
    item = requested_item(name, arguments)
    if item is None:
        return f"no such call: {name} with {arguments}"
    return lookup_result(item, facts.get(item, "unknown"))


def names_colour(text: str, colour: str) -> bool:
    """The verifier of an answer: ``colour`` is one of ``text``'s words."""
    return colour in re.findall(r"[a-z]+", text.lower())


def kept_facts(summary: str, facts: Sequence[tuple[str, str]]) -> float:
    """The verifier of a summary: the share of ``facts`` written as ``ITEM is COLOUR`` in it
    (1 when there is nothing to keep)."""
    if not facts:
        return 1.0
    return sum(f"{item} is {colour}" in summary for item, colour in facts) / len(facts)


@dataclass
class _Rollout:
    """One rollout's state: the context the model sees, the history the agent returns, the
    facts of the current context and the verifier's scores."""

    client: OpenAI
    model: str
    seed: int
    options: dict[str, Any]
    context: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    calls: int = 0
    total_tokens: int = 0
    call_prefix: str = "c"  # a fork's are "f": its call ids never take its source call's

    def observe(self, message: dict[str, Any]) -> None:
        """A user or tool message, for the model and the history alike."""
        self.context.append(message)
        self.history.append(message)

    def sample(self) -> dict[str, Any]:
        """The model's next message on the context (resampled after a rejection), echoed into
        the context and the history (with its response id)."""
        retries = self.options["max_response_retries"]
        for retry in range(retries + 1):
            call_id = f"{self.call_prefix}{self.calls}-{retry}"
            completion = self._create(call_id)
            message = completion.choices[0].message
            text = message.content or ""
            malformed = not message.tool_calls and (not text.strip() or _TOOL_MARKUP in text)
            draw = random.Random(f"{self.seed}/{call_id}").random()  # the same in every process
            unlucky = draw < self.options["reject_fraction"]
            if retry == retries or not (malformed or unlucky):
                break
            reject(self.client, completion.id, "malformed" if malformed else "resampled")
        self.calls += 1
        self.total_tokens = completion.usage.total_tokens if completion.usage else 0
        echoed = message.model_dump(exclude_none=True)
        self.context.append(echoed)
        self.history.append({**echoed, "response_id": completion.id})
        return echoed

    def _create(self, call_id: str) -> ChatCompletion:
        return self.client.chat.completions.create(
            model=self.model,
            # the context and the tool are the wire's JSON as plain dicts, not openai's TypedDicts
            messages=cast("list[ChatCompletionMessageParam]", self.context),
            tools=[cast("ChatCompletionToolUnionParam", LOOKUP_TOOL)],
            max_tokens=self.options["max_tokens"],
            extra_headers={CALL_ID_HEADER: call_id},
        )

    def ask(self, item: str, notes: str | None, table: Mapping[str, str]) -> None:
        """One question: the model's lookups, run on ``table``, then its answer; scored."""
        text = question(item) if notes is None else notes_prompt(notes, item)
        self.observe({"role": "user", "content": text})
        self.finish(item, self.sample(), table)

    def finish(
        self,
        item: str,
        message: dict[str, Any],
        table: Mapping[str, str],
        *,
        looked_up: bool = False,
        lookups: int = 0,
    ) -> None:
        """The rest of the question about ``item`` from the model's ``message``: its lookups
        (``lookups`` of ``max_lookups`` rounds done, ``looked_up`` whether one asked for
        ``item``), then its answer; scored."""
        for _ in range(self.options["max_lookups"] - lookups):
            calls = message.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                name, arguments = call["function"]["name"], call["function"]["arguments"]
                looked_up |= requested_item(name, arguments) == item
                result = lookup(table, name, arguments)
                self.observe({"role": "tool", "tool_call_id": call["id"], "content": result})
            message = self.sample()
        colour = table[item]
        self.facts.append((item, colour))
        self.scores += [float(looked_up), float(names_colour(message.get("content") or "", colour))]

    def compact(self) -> str:
        """Ask for a summary, score it, and start a new context; the summary is the notes."""
        self.observe({"role": "user", "content": SUMMARY_REQUEST})
        notes = (self.sample().get("content") or "").strip()
        self.scores.append(kept_facts(notes, self.facts))
        self.context = []
        return notes


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
) -> dict[str, Any]:
    """One rollout of ``task``: each question looked up and answered, compacting when the context
    passes ``compact_at_tokens`` (at most ``max_compactions`` times; None: no limit); returns the
    harness result (``output``: the accepted history, ``reward``). Rejections derive from
    ``seed``, so the same seed under the same weights replays the same rollout."""
    rollout = _Rollout(
        client,
        client.models.list().data[0].id,
        seed,
        {
            "max_tokens": max_tokens,
            "max_lookups": max_lookups,
            "reject_fraction": reject_fraction,
            "max_response_retries": max_response_retries,
        },
    )
    table: dict[str, str] = dict(task["facts"])
    questions: list[str] = list(task["questions"])
    notes: str | None = None
    compactions = 0
    start, answered = 0, False  # a fork starts where its conversation stands
    if task.get("fork") is not None:
        start, answered, notes, compactions = _resume(rollout, task["fork"], questions, table)
    for index, item in enumerate(questions):
        if index < start:
            continue
        if not (answered and index == start):
            rollout.ask(item, notes, table)
        notes = None
        room = max_compactions is None or compactions < max_compactions
        if room and index + 1 < len(questions) and rollout.total_tokens >= compact_at_tokens:
            notes = rollout.compact()
            compactions += 1
            rollout.facts = _noted(notes, rollout.facts)
    reward = sum(rollout.scores) / len(rollout.scores) if rollout.scores else 0.0
    return {"output": rollout.history, "reward": reward}


def _noted(notes: str, facts: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The facts a new context starts with: those its notes kept."""
    return [(item, colour) for item, colour in facts if f"{item} is {colour}" in notes]


_ASKED = re.compile(r"What colour is the (.+)\?$")


def _resume(
    rollout: _Rollout, fork: Mapping[str, Any], questions: Sequence[str], table: Mapping[str, str]
) -> tuple[int, bool, str | None, int]:
    """Take up the forked conversation: the question it stands at (its index) and whether that
    question is answered, the notes a summary just written starts the next context with, and the
    compactions the conversation shows; a question the source call left open (its answer called
    tools) is finished here, and scored."""
    messages: list[dict[str, Any]] = [dict(m) for m in fork["messages"]]
    rollout.context, rollout.history = list(messages), list(messages)
    rollout.call_prefix = "f"
    rollout.total_tokens = int(fork.get("cum_len") or 0)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    asked = [(i, _ASKED.search(messages[i].get("content") or "")) for i in users]
    asked_at = [(i, m.group(1)) for i, m in asked if m is not None and m.group(1) in questions]
    if not asked_at:
        raise ValueError("the forked conversation asks none of the task's questions")
    at, item = asked_at[-1]
    index = questions.index(item)
    rollout.facts = [(i, table[i]) for _, i in asked_at]
    compactions = sum(
        (m.get("content") or "").startswith("Notes: ") or m.get("content") == SUMMARY_REQUEST
        for m in messages
        if m["role"] == "user"
    )
    last = messages[-1]
    if messages[users[-1]].get("content") == SUMMARY_REQUEST:  # the source call summarized
        notes = (last.get("content") or "").strip()
        rollout.facts = _noted(notes, rollout.facts)
        rollout.context = []
        return index + 1, False, notes, compactions
    if last.get("tool_calls"):  # the source call looked something up: finish the question
        rounds = [m for m in messages[at:] if m["role"] == "assistant" and m.get("tool_calls")]
        looked_up = any(
            requested_item(c["function"]["name"], c["function"]["arguments"]) == item
            for m in rounds[:-1]
            for c in m["tool_calls"]
        )
        rollout.finish(item, last, table, looked_up=looked_up, lookups=len(rounds) - 1)
    return index, True, None, compactions
