"""Chains of calls, simulated in plain data: embedded engine, admission, splice, stored deltas.

No ledger or blob store: each committed call keeps (parent, delta tokens) as its blob would, and
the admission index is fed from the calls' replay summaries as the lifecycle will feed it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grove.capture.embedded import EmbeddedEngine
from grove.capture.engine import SamplingParams
from grove.capture.render import (
    Renderer,
    RenderOptions,
    admission_items,
    normalize_messages,
)
from grove.capture.splice import PromptPlan, plan_call
from grove.ledger.admission import AdmissionIndex, CallStatus, DecisionKind, RootReason

Message = Mapping[str, Any]
SYSTEM = {"role": "system", "content": "You are a terse agent."}
TASK = {"role": "user", "content": "Find the weather, then summarize."}


@dataclass
class SimulatedAttempt:
    """The capture path of one attempt, minus the ledger: admit, splice, generate, commit."""

    renderer: Renderer
    options: RenderOptions
    engine: EmbeddedEngine
    index: AdmissionIndex = field(default_factory=AdmissionIndex)
    parents: dict[str, str | None] = field(default_factory=dict)
    deltas: dict[str, tuple[int, ...]] = field(default_factory=dict)
    plans: dict[str, PromptPlan] = field(default_factory=dict)
    generated: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def chain(self, call_id: str) -> tuple[int, ...]:
        """The call's exact tokens, rebuilt from the stored deltas along its parent links."""
        parent = self.parents[call_id]
        return (self.chain(parent) if parent else ()) + self.deltas[call_id]

    def call(self, call_id: str, messages: list[Message], seed: int) -> Message:
        """Run one model call and return the assistant message the harness would receive."""
        request = normalize_messages(messages)
        plan = plan_call(self.renderer, request, self.options, self.index, self.chain)
        generation = self.engine.generate(
            plan.prompt_token_ids, SamplingParams(max_tokens=8, seed=seed)
        )
        ids = generation.token_ids
        text_ids = ids[:-1] if generation.finish_reason == "stop" else ids
        output = {"role": "assistant", "content": self.renderer.decode(text_ids)}
        summary = plan.request_summary.extended(admission_items(normalize_messages([output])))
        self.index.add(summary.candidate(call_id, CallStatus.COMMITTED))
        self.parents[call_id] = plan.decision.parent_call_id
        self.deltas[call_id] = plan.delta_token_ids + ids
        self.plans[call_id] = plan
        self.generated[call_id] = ids
        return output


def run_agent(attempt: SimulatedAttempt, calls: int, rewrite_after: int | None = None) -> None:
    """A tool-using agent: each turn appends its output and an observation; optionally, after
    call ``rewrite_after`` it replaces its history with a summary (a rewrite)."""
    messages: list[Message] = [SYSTEM, TASK]
    for n in range(1, calls + 1):
        output = attempt.call(f"c{n}", messages, seed=n)
        messages = [*messages, output, {"role": "user", "content": f"observation {n}"}]
        if n == rewrite_after:
            summary = {"role": "user", "content": f"Summary of calls 1-{n}: it is sunny."}
            messages = [SYSTEM, TASK, summary]


def test_twenty_calls_without_a_rewrite_form_one_chain_of_exact_deltas(
    renderer: Renderer, options: RenderOptions, engine: EmbeddedEngine
) -> None:
    attempt = SimulatedAttempt(renderer, options, engine)
    run_agent(attempt, 20)
    assert attempt.parents == {"c1": None} | {f"c{n}": f"c{n - 1}" for n in range(2, 21)}
    assert attempt.plans["c1"].decision.reason is RootReason.FIRST_CALL
    last = attempt.plans["c20"]
    deltas = tuple(token for n in range(1, 21) for token in attempt.deltas[f"c{n}"])
    assert deltas == last.prompt_token_ids + attempt.generated["c20"]


def test_every_continuation_prompt_starts_with_its_parent_chain_exactly(
    renderer: Renderer, options: RenderOptions, engine: EmbeddedEngine
) -> None:
    attempt = SimulatedAttempt(renderer, options, engine)
    run_agent(attempt, 5)
    for n in range(2, 6):
        plan = attempt.plans[f"c{n}"]
        assert plan.prompt_token_ids[: plan.prev_len] == attempt.chain(f"c{n - 1}")


def test_a_rewrite_after_call_ten_starts_a_root_and_a_second_chain(
    renderer: Renderer, options: RenderOptions, engine: EmbeddedEngine
) -> None:
    attempt = SimulatedAttempt(renderer, options, engine)
    run_agent(attempt, 20, rewrite_after=10)
    rewritten = attempt.plans["c11"].decision
    assert (rewritten.kind, rewritten.reason) == (DecisionKind.ROOT, RootReason.HISTORY_REWRITTEN)
    roots = [call_id for call_id, parent in attempt.parents.items() if parent is None]
    assert roots == ["c1", "c11"]
    assert attempt.parents["c12"] == "c11"
    for first, last in ((1, 10), (11, 20)):
        deltas = tuple(t for n in range(first, last + 1) for t in attempt.deltas[f"c{n}"])
        assert deltas == attempt.plans[f"c{last}"].prompt_token_ids + attempt.generated[f"c{last}"]
