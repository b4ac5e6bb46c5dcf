"""A model call as the capture service takes it and answers it: ``ModelCall`` (what a harness
asks for), ``MeasuredCall`` (what measuring it found) and ``CallOutcome`` (a committed call, as the
gateway answers); ``grove.capture.lifecycle`` runs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grove.capture.engine import Generation, SamplingParams
from grove.capture.render import RenderOptions
from grove.ledger.admission import AdmissionDecision
from grove.storage import BlobRef

__all__ = ["CallOutcome", "MeasuredCall", "ModelCall"]


@dataclass(frozen=True)
class ModelCall:
    """One model call as a harness asks for it: its items (Chat messages or Responses input
    items), the render options, sampling, and optionally the call id to record it under."""

    items: Sequence[Mapping[str, Any]]
    options: RenderOptions
    sampling: SamplingParams
    call_id: str | None = None


@dataclass(frozen=True)
class MeasuredCall:
    """What ``measure`` found: the prompt length the call would have, and the decision."""

    prompt_tokens: int
    decision: AdmissionDecision


@dataclass(frozen=True)
class CallOutcome:
    """A committed call, as the gateway answers the harness.

    ``message`` is the Chat Completions assistant message (``grove.capture.toolcalls``); ``text``
    the exact generated text it was parsed from (stop token excluded); ``finish_reason`` the one
    recorded and answered: ``tool_calls`` when the generation stopped after tool calls, else the
    engine's ``stop`` or ``length``.
    """

    capture_key: str
    call_id: str
    response_id: str
    message: dict[str, Any]
    generation: Generation
    decision: AdmissionDecision
    prompt_tokens: int
    blob: BlobRef
    text: str = ""
    finish_reason: str = "stop"
