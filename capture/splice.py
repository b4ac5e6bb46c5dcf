"""Exact-token splice: the prompt a call is generated from, behind a boundary check.

A continuation's prompt is its parent chain's exact tokens — every ancestor's prompt delta and
generated tokens, as stored, never re-tokenized — followed by the tokens of the rendered suffix.
That is sound only where the template extends the parent's history by appending, so admission's
candidate must pass two textual checks first (``docs/normalization.md``, "The splice"):

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
are reused as they are even where their text would tokenize differently today. Such a root is
*unexplained* (nothing the harness did explains it), so the plan carries a divergence diagnostic
of the two texts the failed check compared (``capture/divergence.py``), recorded on the intent;
in strict mode :func:`plan_call` refuses the call instead (``UnexplainedRootError``).

Before admission, :func:`plan_call` checks the call's fixed options (model, chat template,
template and processor kwargs, tokenization flags) against its attempt's
(``capture/fixed_options.py``) and refuses a call that changes them.

Every call of the chain is represented by its exact generated text, not by the template's rendering
of the message the client echoed (``RawOutput``). The two differ when the gateway parsed the text
into reasoning or tool calls (``capture/toolcalls.py``) and the template writes them back with
other spacing or key order. So check 2 compares the chain's text with the prefix rendered with
each chain output as plain assistant content, and the suffix is whatever that rendering writes
after the parent's last token (the end of turn) followed by the real rendering of the new items.
Where no output was parsed the two renderings are one and the same.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from grove.capture.divergence import Divergence, Side, common_prefix_length, diagnose
from grove.capture.errors import RenderError, SpliceError, UnexplainedRootError
from grove.capture.fixed_options import FIXED_OPTIONS_KEY, check_fixed_options, fixed_options
from grove.capture.render import (
    NormalizedRequest,
    Renderer,
    RenderOptions,
    ReplaySummary,
    admission_items,
    replay_summary,
)
from grove.capture.template_tokens import RenderedText, rendered_join, rendered_slice
from grove.ledger.admission import (
    UNEXPLAINED_ROOT_REASONS,
    AdmissionDecision,
    AdmissionIndex,
    DecisionKind,
    RootReason,
    decide,
    locate_boundary,
    prefix_digests,
)
from grove.ledger.attempt import AttemptState

__all__ = ["PromptPlan", "RawOutput", "plan_call"]

_ENCODED_PAST = 2048
"""Characters of a rendered side encoded past the point where the sides part (its token window
needs 16 tokens)."""


@dataclass(frozen=True)
class RawOutput:
    """A chain call's exact generated text (stop token excluded) and the index of the item that
    holds its output in any request continuing it (its replay summary's ``item_count - 1``).

    Producer: the lifecycle (from the call's blob and ``call.committed``); consumer: the
    boundary check, which renders that item as plain assistant content ``text``.
    """

    item_index: int
    text: str


@dataclass(frozen=True)
class PromptPlan:
    """The prompt of one call, the final decision that produced it, and the request's summary.

    Producer: :func:`plan_call`; consumers: the lifecycle
    (``call.intended``: ``decision``, ``request_summary``, ``prompt_len``; the engine:
    ``prompt_token_ids``; the delta blob: ``delta_token_ids``; ``call.committed``:
    ``request_summary.extended(output items)``). ``prompt_token_ids[:prev_len]`` is the parent
    chain exactly; ``prev_len`` is 0 for a root, whose delta is its whole prompt.
    ``decision.kind`` is continuation exactly when ``prev_len > 0``. ``divergence`` is set exactly
    when the splice rooted the candidate; ``fixed_options`` when :func:`plan_call` checked them.
    """

    decision: AdmissionDecision
    prompt_token_ids: tuple[int, ...]
    prev_len: int
    request_summary: ReplaySummary
    divergence: Divergence | None = None
    fixed_options: Mapping[str, Any] | None = None

    def admission_record(self) -> dict[str, Any]:
        """The intent's admission record: the decision, plus the divergence and fixed options
        when there are (``call.intended.admission``; replay reads the decision's fields)."""
        record = self.decision.as_payload()
        if self.divergence is not None:
            record["divergence"] = self.divergence.as_payload()
        if self.fixed_options is not None:
            record[FIXED_OPTIONS_KEY] = dict(self.fixed_options)
        return record

    @property
    def delta_token_ids(self) -> tuple[int, ...]:
        """The prompt tokens this call adds after its parent chain (all of them for a root)."""
        return self.prompt_token_ids[self.prev_len :]

    @property
    def prompt_len(self) -> int:
        """The number of prompt tokens the engine will see."""
        return len(self.prompt_token_ids)

    def added_items(self, request: NormalizedRequest) -> tuple[dict[str, Any], ...]:
        """The items of ``request`` (the request planned) after the parent's conversation, the
        parent's request and answer (``prefix_item_count`` items); a root's whole request: what
        the call adds to its conversation before its answer (``docs/fork.md``)."""
        if self.prev_len == 0:
            return request.messages
        return request.messages[self.decision.boundary.prefix_item_count :]


def plan_call(
    renderer: Renderer,
    request: NormalizedRequest,
    options: RenderOptions,
    index: AdmissionIndex,
    parent_tokens: Callable[[str], Sequence[int]],
    parent_outputs: Callable[[str], Sequence[RawOutput]] | None = None,
    *,
    attempt: AttemptState | None = None,
    strict: bool = False,
) -> PromptPlan:
    """Everything before inference for one request: admission, then the splice. Writes nothing.

    ``index`` holds the attempt's calls; ``parent_tokens(call_id)`` returns a call's exact chain
    tokens (its ancestors' and its own stored deltas) and ``parent_outputs(call_id)`` the raw
    outputs of the calls of that chain (none when not given); both are asked only for the chosen
    parent. The null/empty tool-content proof is rendered only when admission needs it. Intend
    and measure both call this, so they reach the same decision. Raises ``AdmissionError``
    (assistant prefill, empty suffix, ambiguous parent) before anything is generated; with
    ``attempt``, ``AttemptOptionsChangedError`` for a call that changes the attempt's fixed
    options; with ``strict``, ``UnexplainedRootError`` for a call the splice would root
    unexplained.
    """
    items = admission_items(request)
    options_digest = renderer.options_digest(options)
    fixed = fixed_options(options, renderer.chat_template(options))
    if attempt is not None:
        check_fixed_options(fixed, attempt)
    chains = tuple(prefix_digests(items))  # hashed once: the boundary and the summary read them
    boundary = locate_boundary(items, chains)
    decision = decide(boundary, render_options_digest=options_digest, index=index)
    if (
        decision.reason is RootReason.TOOL_CONTENT_NOT_EQUIVALENT
        and renderer.tool_content_forms_render_identically(request.messages, options)
    ):
        decision = decide(
            boundary,
            render_options_digest=options_digest,
            index=index,
            tool_content_equivalence_proven=True,
        )
    parent = decision.parent_call_id
    plan = _plan(
        renderer,
        request,
        options,
        decision,
        None if parent is None else parent_tokens(parent),
        replay_summary(items, options_digest, chains),
        () if parent is None or parent_outputs is None else parent_outputs(parent),
    )
    reason = plan.decision.reason
    if strict and reason in UNEXPLAINED_ROOT_REASONS and plan.divergence is not None:
        raise UnexplainedRootError(
            "" if attempt is None else attempt.capture_key,
            reason.value,
            plan.decision.candidate_call_id,
            plan.divergence,
        )
    return replace(plan, fixed_options=fixed)


def _plan(
    renderer: Renderer,
    request: NormalizedRequest,
    options: RenderOptions,
    decision: AdmissionDecision,
    parent_token_ids: Sequence[int] | None,
    summary: ReplaySummary,
    raw_outputs: Sequence[RawOutput] = (),
) -> PromptPlan:
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
        return _root(renderer, options, decision, full_text, summary)
    if not parent_token_ids:
        raise SpliceError(
            "a continuation needs its parent chain's exact tokens; missing evidence is an "
            "error, not a rewrite",
            decision.parent_call_id,
        )
    prefix = request.messages[: decision.boundary.prefix_item_count]
    prefix_text = renderer.render(prefix, options, add_generation_prompt=False)
    if not _rendered_prefix(prefix_text, full_text):
        rooted = decision.rooted(RootReason.TEMPLATE_NOT_APPEND_COMPATIBLE)
        root = _root(renderer, options, rooted, full_text, summary)
        whole = () if options.add_special_tokens else root.prompt_token_ids  # reused as encoded
        sides = (
            _rendered("parent", "the history rendered up to the parent's output", prefix_text),
            Side("request", "the request rendered whole", full_text, whole),
        )
        known = {len(prefix): len(prefix_text)}
        divergence = _diagnosed(renderer, request.messages, options, known, *sides)
        return replace(root, divergence=divergence)
    chain_text = renderer.decode(parent_token_ids)
    exact_text = _exact_prefix_text(renderer, prefix, options, prefix_text, raw_outputs)
    trailer = rendered_slice(exact_text, len(chain_text))
    if not exact_text.startswith(chain_text) or not prefix_text.endswith(trailer):
        rooted = decision.rooted(RootReason.RENDERED_HISTORY_DIFFERS)
        sides = _history_sides(renderer, parent_token_ids, chain_text, exact_text, prefix_text)
        known = {len(prefix): len(prefix_text)}
        divergence = _diagnosed(renderer, request.messages, options, known, *sides)
        return _root(renderer, options, rooted, full_text, summary, divergence)
    suffix = renderer.encode(rendered_join(trailer, rendered_slice(full_text, len(prefix_text))))
    return PromptPlan(
        decision=decision,
        prompt_token_ids=(*parent_token_ids, *suffix),
        prev_len=len(parent_token_ids),
        request_summary=summary,
    )


def _rendered_prefix(prefix_text: str, full_text: str) -> bool:
    """Whether ``prefix_text`` renders as a prefix of ``full_text``: its text, and (for
    renderings that know them) the special tokens the template wrote in it
    (``capture/template_tokens.py``), so the splice and a root encode the prefix alike."""
    if not full_text.startswith(prefix_text):
        return False
    if isinstance(prefix_text, RenderedText) and isinstance(full_text, RenderedText):
        head = rendered_slice(full_text, 0, len(prefix_text))
        return (
            isinstance(head, RenderedText) and head.template_tokens == prefix_text.template_tokens
        )
    return True


def _root(
    renderer: Renderer,
    options: RenderOptions,
    decision: AdmissionDecision,
    full_text: str,
    summary: ReplaySummary,
    divergence: Divergence | None = None,
) -> PromptPlan:
    tokens = renderer.encode(full_text, add_special_tokens=options.add_special_tokens)
    return PromptPlan(decision, tuple(tokens), 0, summary, divergence)


def _rendered(name: str, what: str, text: str) -> Side:
    """A side that is a rendering: its token ids are filled in by :func:`_diagnosed`."""
    return Side(name, what, text, ())


def _history_sides(
    renderer: Renderer,
    chain: Sequence[int],
    chain_text: str,
    exact_text: str,
    prefix_text: str,
) -> tuple[Side, Side]:
    """The two texts ``rendered_history_differs`` compared: the parent chain's exact text and
    the history rendered with exact outputs; or, when the chain's text starts that rendering
    but the end of turn after it is not the template's own, the chain followed by each end."""
    if not exact_text.startswith(chain_text):
        return (
            Side("parent", "the parent chain's exact tokens", chain_text, tuple(chain)),
            _rendered("request", "the history rendered, outputs as their exact text", exact_text),
        )
    trailer = rendered_slice(exact_text, len(chain_text))
    own = rendered_slice(prefix_text, max(0, len(prefix_text) - len(trailer)))
    return (
        Side(
            "parent",
            "the parent chain's exact tokens, then the end of turn written after its exact text",
            exact_text,
            (*chain, *renderer.encode(trailer)),
        ),
        Side(
            "request",
            "the parent chain's exact tokens, then the end of the template's own rendering",
            chain_text + own,
            (*chain, *renderer.encode(own)),
        ),
    )


def _diagnosed(
    renderer: Renderer,
    messages: Sequence[Mapping[str, Any]],
    options: RenderOptions,
    known: Mapping[int, int],
    parent: Side,
    request: Side,
) -> Divergence:
    """The divergence of two sides. A rendering's ids are the encoding (no special tokens) of its
    text up to :data:`_ENCODED_PAST` characters past the point where the sides part: enough for
    the token window after it, and the cost grows with the point's position, not the context's
    length. ``known`` maps message counts to the length of their rendering, where the caller
    rendered them already."""
    at = common_prefix_length(parent.text, request.text)
    parent, request = (
        side
        if side.token_ids
        else replace(
            side, token_ids=tuple(renderer.encode(rendered_slice(side.text, 0, at + _ENCODED_PAST)))
        )
        for side in (parent, request)
    )
    index = _message_at(renderer, messages, options, at, len(request.text), known)
    return diagnose(parent, request, message_index=index, decode=renderer.decode)


def _message_at(
    renderer: Renderer,
    messages: Sequence[Mapping[str, Any]],
    options: RenderOptions,
    at: int,
    rendered_length: int,
    known: Mapping[int, int],
) -> int:
    """The message whose rendering holds character ``at``: the last ``i`` whose first ``i``
    messages render (without a generation prompt) to at most ``at`` characters.

    The search starts from a guess, the message where the messages' JSON sizes reach the point's
    share of ``rendered_length`` (a rendering of about all of them), then gallops away from it
    and halves: two renders when the guess is right (fewer where ``known`` has the length of a
    rendering), O(log n) otherwise.
    """

    def starts_by(count: int) -> bool:
        if count <= 0:
            return True
        if count in known:
            return known[count] <= at
        try:
            text = renderer.render(messages[:count], options, add_generation_prompt=False)
        except RenderError:
            return False
        return len(text) <= at

    sizes = list(itertools.accumulate(len(json.dumps(m, default=str)) for m in messages))
    share = at / max(rendered_length, 1) * (sizes[-1] if sizes else 0)
    guess = min(bisect.bisect_right(sizes, share), len(messages))
    if starts_by(guess):  # gallop up from the guess
        lo, step = guess, 1
        while True:
            hi = min(lo + step, len(messages) + 1)
            if hi > len(messages) or not starts_by(hi):
                break
            lo, step = hi, step * 2
    else:  # gallop down from it
        hi, step = guess, 1
        while True:
            lo = max(hi - step, 0)
            if starts_by(lo):
                break
            hi, step = lo, step * 2
    while hi - lo > 1:  # messages[:lo] fit within the point, messages[:hi] do not
        mid = (lo + hi) // 2
        if starts_by(mid):
            lo = mid
        else:
            hi = mid
    return min(lo, max(len(messages) - 1, 0))


def _exact_prefix_text(
    renderer: Renderer,
    prefix: Sequence[Mapping[str, Any]],
    options: RenderOptions,
    prefix_text: str,
    raw_outputs: Sequence[RawOutput],
) -> str:
    """The prefix rendered with every chain output as its exact text (plain assistant content);
    ``prefix_text`` itself when no echoed output differs from that form."""
    messages = list(prefix)
    changed = False
    for output in raw_outputs:
        index = output.item_index
        if 0 <= index < len(messages) and messages[index].get("role") == "assistant":
            raw = {"content": output.text, "role": "assistant"}
            if messages[index] != raw:
                messages[index] = raw
                changed = True
    if not changed:
        return prefix_text
    return renderer.render(messages, options, add_generation_prompt=False)
