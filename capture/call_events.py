"""The two events a captured call records, built from plain data: its intent and its commit.

``intent_event`` records what admission decided and planned, before inference: the decision and
its reason, the request's replay summary, the prompt length, the admission record and the output
constraint. ``commit_event`` records what was stored, after the delta blob is written: the
lengths (``prev_len + delta_len = cum_len``), the blob's key, digest and size, the chain digest
(the parent's, extended by this delta: ``grove.storage.chain_digest``), the finish reason, a
fresh response id, and the output's fingerprint and replay summary.

The committed output is the generated text parsed into an assistant message (reasoning, and tool
calls when the request offered tools: ``capture/toolcalls.py``); the fingerprint and the replay
summary describe that message, so a client that echoes it back continues the call. The finish
reason is ``tool_calls`` when the generation stopped after tool calls, else the engine's.

Nothing here reads or writes: the capture lifecycle (``capture/lifecycle.py``) appends the events.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from grove.capture.engine import Generation, SamplingParams
from grove.capture.render import NormalizedRequest, admission_items, normalize_messages
from grove.capture.splice import PromptPlan
from grove.capture.toolcalls import assistant_message, parse_output
from grove.ledger.events import CallCommitted, CallIntended
from grove.ledger.fingerprint import fingerprint_output
from grove.storage import BlobRef, CallDelta, chain_digest

__all__ = [
    "Answer",
    "CommittedOutput",
    "answer_of",
    "commit_event",
    "intent_event",
    "output_message",
]


def output_message(text: str, *, tools: bool = False) -> dict[str, Any]:
    """The assistant message a harness sends back for a generation with this text: reasoning and,
    when the request offered ``tools``, tool calls parsed (each given a fresh ``call_…`` id)."""
    parsed = parse_output(text, tool_calls=tools)
    return assistant_message(parsed, [f"call_{uuid.uuid4().hex[:24]}" for _ in parsed.tool_calls])


@dataclass(frozen=True)
class Answer:
    """A generation parsed once, before its blob is written: ``text`` the exact generated text
    (stop token excluded), ``message`` the assistant message the harness receives, and
    ``normalized`` that message normalized (its fingerprint, replay summary and the blob's
    recorded conversation item)."""

    text: str
    message: dict[str, Any]
    normalized: NormalizedRequest


def answer_of(text: str, *, tools: bool) -> Answer:
    """The answer of a generation whose decoded text is ``text`` (tool calls parsed when the
    request offered ``tools``)."""
    message = output_message(text, tools=tools)
    return Answer(text, message, normalize_messages([message]))


def intent_event(
    call_id: str, plan: PromptPlan, sampling: SamplingParams, policy_version: int | None
) -> CallIntended:
    """The intent of call ``call_id``, planned as ``plan`` and sampled with ``sampling``;
    ``policy_version`` is the version the engine serves at admission (None: unknown)."""
    decision = plan.decision
    return CallIntended(
        call_id=call_id,
        decision=decision.kind.value,
        parent_call_id=decision.parent_call_id,
        root_reason=None if decision.reason is None else decision.reason.value,
        replay_summary=plan.request_summary,
        equivalences=tuple(e.value for e in decision.equivalences),
        prompt_tokens=plan.prompt_len,
        admission=plan.admission_record(),
        policy_version=policy_version,
        constraint=None if sampling.constraint is None else sampling.constraint.record(),
    )


@dataclass(frozen=True)
class CommittedOutput:
    """A commit event and the assistant message it describes (``message``, parsed from
    ``text``, the exact generated text before the stop token)."""

    event: CallCommitted
    message: dict[str, Any]
    text: str


def commit_event(
    call_id: str,
    plan: PromptPlan,
    generation: Generation,
    delta: CallDelta,
    blob: BlobRef,
    *,
    answer: Answer,
    parent_chain_digest: str | None,
) -> CommittedOutput:
    """The commit of call ``call_id``: ``delta`` (built from ``generation``) stored as ``blob``;
    ``answer`` the generation parsed (``answer_of``); ``parent_chain_digest`` the parent commit's
    chain digest (None for a root)."""
    message, normalized = answer.message, answer.normalized
    finish_reason = (
        "tool_calls"
        if generation.finish_reason == "stop" and message.get("tool_calls")
        else generation.finish_reason
    )
    event = CallCommitted(
        call_id=call_id,
        parent_call_id=plan.decision.parent_call_id,
        prev_len=plan.prev_len,
        delta_len=delta.delta_len,
        cum_len=plan.prev_len + delta.delta_len,
        prompt_delta_len=len(plan.delta_token_ids),
        generated_len=len(generation.token_ids),
        blob_key=blob.key,
        blob_sha256=blob.sha256,
        blob_bytes=blob.size,
        chain_digest=chain_digest(parent_chain_digest, delta.prompt_delta, delta.generated),
        finish_reason=finish_reason,
        response_id=f"resp-{uuid.uuid4().hex}",
        output_fingerprint=fingerprint_output(normalized.messages),
        replay_summary=plan.request_summary.extended(admission_items(normalized)),
        policy_version=generation.policy_version,
    )
    return CommittedOutput(event, message, answer.text)
