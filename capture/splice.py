"""Exact-token splice: the prompt a call is generated from, behind a boundary check.

A continuation's prompt is its parent chain's exact tokens — every ancestor's prompt delta and
generated tokens, as stored, never re-tokenized — followed by the tokens of the rendered suffix.
That is sound only where the template extends the parent's history by appending, so admission's
candidate must pass two textual checks first (seed ``000``, "Detailed ownership and validation
rules", step 2):

1. ``template_not_append_compatible``: the template's rendering of the request's prefix (up to and
   including the parent's assistant message, no generation prompt) must be a prefix of its
   rendering of the full request. Templates that drop earlier reasoning once a new user turn
   follows fail here.
2. ``rendered_history_differs``: the exact text of the parent chain's tokens must be a prefix of
   that prefix rendering, so the suffix starts exactly where the parent's tokens end. It fails
   where the template renders the history differently from what the model saw and generated
   (an output message that does not reproduce the generated text, a template that adds special
   tokens around the prompt, a date in the system prompt that changed).

A candidate that fails either becomes a root, with the check's name as the recorded reason; the
suffix is then the whole rendered request. Checks compare decoded text only: the parent's tokens
are reused as they are even where their text would tokenize differently today.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from capture.errors import SpliceError
from capture.render import NormalizedRequest, Renderer, RenderOptions
from ledger.admission import AdmissionDecision, DecisionKind, RootReason

__all__ = ["PromptPlan", "plan_prompt"]


@dataclass(frozen=True)
class PromptPlan:
    """The prompt of one call and the final decision that produced it.

    Producer: :func:`plan_prompt`; consumers: the lifecycle (``call.intended``: decision and
    ``prompt_len``; the engine: ``prompt_token_ids``; the delta blob: ``delta_token_ids``).
    ``prompt_token_ids[:prev_len]`` is the parent chain exactly; ``prev_len`` is 0 for a root,
    whose delta is its whole prompt. ``decision.kind`` is continuation exactly when
    ``prev_len > 0``.
    """

    decision: AdmissionDecision
    prompt_token_ids: tuple[int, ...]
    prev_len: int

    @property
    def delta_token_ids(self) -> tuple[int, ...]:
        """The prompt tokens this call adds after its parent chain (all of them for a root)."""
        return self.prompt_token_ids[self.prev_len :]

    @property
    def prompt_len(self) -> int:
        """The number of prompt tokens the engine will see."""
        return len(self.prompt_token_ids)


def plan_prompt(
    renderer: Renderer,
    request: NormalizedRequest,
    options: RenderOptions,
    decision: AdmissionDecision,
    parent_token_ids: Sequence[int] | None = None,
) -> PromptPlan:
    """Plan a call's prompt from the admission decision: splice, or root with a recorded reason.

    ``parent_token_ids`` is the parent chain's exact tokens (prompt plus generated, from its
    blobs), required for a continuation and refused for a root. Writes nothing; ``measure`` calls
    it too.
    """
    if decision.boundary.item_count != len(request.messages):
        raise SpliceError(
            f"the decision was made for {decision.boundary.item_count} items, the request has "
            f"{len(request.messages)}",
            decision.candidate_call_id,
        )
    full_text = renderer.render(request.messages, options)
    if decision.kind is DecisionKind.ROOT:
        if parent_token_ids is not None:
            raise SpliceError("a root takes no parent tokens", decision.candidate_call_id)
        return _root(renderer, options, decision, full_text)
    if not parent_token_ids:
        raise SpliceError(
            "a continuation needs its parent chain's exact tokens; missing evidence is an "
            "error, not a rewrite",
            decision.parent_call_id,
        )
    prefix = request.messages[: decision.boundary.prefix_item_count]
    prefix_text = renderer.render(prefix, options, add_generation_prompt=False)
    if not full_text.startswith(prefix_text):
        return _root(renderer, options, decision.rooted(RootReason.TEMPLATE_NOT_APPEND_COMPATIBLE),
                     full_text)  # fmt: skip
    chain_text = renderer.decode(parent_token_ids)
    if not prefix_text.startswith(chain_text):
        return _root(renderer, options, decision.rooted(RootReason.RENDERED_HISTORY_DIFFERS),
                     full_text)  # fmt: skip
    suffix = renderer.encode(full_text[len(chain_text) :])
    return PromptPlan(
        decision=decision,
        prompt_token_ids=(*parent_token_ids, *suffix),
        prev_len=len(parent_token_ids),
    )


def _root(
    renderer: Renderer, options: RenderOptions, decision: AdmissionDecision, full_text: str
) -> PromptPlan:
    tokens = renderer.encode(full_text, add_special_tokens=options.add_special_tokens)
    return PromptPlan(decision=decision, prompt_token_ids=tuple(tokens), prev_len=0)
