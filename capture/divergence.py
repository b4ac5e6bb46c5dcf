"""Divergence diagnostics: where the two sides of a failed boundary check part, and why.

When the splice roots admission's candidate (``template_not_append_compatible`` or
``rendered_history_differs``, ``capture/splice.py``), the reason alone does not say what to fix.
The diagnostic records, on the call's intent (``call.intended.admission["divergence"]``), where
the two texts the failed check compared part (``docs/normalization.md``, "Divergence
diagnostics"):

- ``message_index``: the request's message whose rendering holds the point where they part;
- ``char_offset``: the length of their common text;
- on each side, the index of the token holding that point (the *token offset*) and a window of up
  to :data:`WINDOW` tokens before and from it, ids and decoded texts (each text cut to
  :data:`TOKEN_TEXT_LIMIT` characters): the record is bounded whatever the context length;
- ``cause``, the likely cause, classified by :func:`classify` in this order:

  1. ``stripped_reasoning``: at the point the parent side opens a ``<think>`` block (or is inside
     one) that the request side does not carry there: the template dropped or emptied the
     parent's reasoning;
  2. ``truncation``: one side's text is a prefix of the other's: the shorter one stops early;
  3. ``token_merging``: the request side's tokens, decoded, agree with the parent side past the
     point (or the texts are equal and only their ids differ): the same text, cut into tokens
     another way (a tokenizer whose decode does not reproduce the rendered text);
  4. ``changed_content``: the texts differ at the point and agree again within
     :data:`REALIGN_SPAN` characters (a common run of :data:`REALIGN_RUN` characters or more):
     something was replaced, such as a date in a system prompt or trimmed whitespace;
  5. ``unknown``: none of these.

Pure: plain data in, plain data out. The one callable taken, ``decode``, is the tokenizer's
exact decode (``grove.capture.render.Renderer.decode``); the texts and ids come from the splice. The
cost is one comparison of the two texts, one decode of the ids both sides share, a few decodes
around the point and a bounded ``difflib`` match, besides what the caller renders and encodes.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from grove.capture.toolcalls import THINK_CLOSE, THINK_OPEN

__all__ = [
    "REALIGN_RUN",
    "REALIGN_SPAN",
    "TOKEN_TEXT_LIMIT",
    "WINDOW",
    "Cause",
    "Divergence",
    "Side",
    "TokenWindow",
    "classify",
    "common_prefix_length",
    "diagnose",
    "token_at",
]

WINDOW: Final = 16
"""Tokens shown on each side of the token offset, on each side of the divergence."""
TOKEN_TEXT_LIMIT: Final = 64
"""Characters kept of one token's decoded text."""
REALIGN_SPAN: Final = 256
"""Characters after the point searched for text the two sides share again."""
REALIGN_RUN: Final = 8
"""The shortest common run that counts as the two sides agreeing again."""

Decode = Callable[[Sequence[int]], str]


class Cause(StrEnum):
    """The likely cause of a divergence (module docstring: the order they are tried in)."""

    STRIPPED_REASONING = "stripped_reasoning"
    TRUNCATION = "truncation"
    TOKEN_MERGING = "token_merging"
    CHANGED_CONTENT = "changed_content"
    UNKNOWN = "unknown"


_CAUSE_TEXT: Final = {
    Cause.STRIPPED_REASONING: (
        "stripped reasoning: the parent's <think>…</think> is missing from the request side "
        "(a template that drops earlier reasoning)"
    ),
    Cause.TRUNCATION: "truncation: one side is a prefix of the other",
    Cause.TOKEN_MERGING: (
        "token merging: the texts agree once tokenized, the token boundaries differ"
    ),
    Cause.CHANGED_CONTENT: (
        "changed content: the text differs there and agrees again after it (e.g. a date in the "
        "system prompt, trimmed whitespace)"
    ),
    Cause.UNKNOWN: "unknown",
}


@dataclass(frozen=True)
class Side:
    """One side of a failed check: the text it compared and that text's token ids.

    ``what`` says what the side is (e.g. "the parent chain's exact tokens"); ``text`` is what
    the check compared; ``decode(token_ids)`` should be ``text``, or its start through at least
    :data:`WINDOW` tokens past the point where the sides part (for the parent chain it is the
    whole text by construction; a rendering is encoded only that far).
    """

    name: str
    what: str
    text: str
    token_ids: Sequence[int]


@dataclass(frozen=True)
class TokenWindow:
    """Up to :data:`WINDOW` tokens of one side before its token offset and from it.

    ``start`` is the side's index of ``token_ids[0]``; ``offset`` the index of the token that
    holds the point where the sides part (the side's length when its text ends before it);
    ``texts[i]`` is ``token_ids[i]`` decoded alone, cut to :data:`TOKEN_TEXT_LIMIT` characters.
    """

    side: str
    what: str
    start: int
    offset: int
    token_ids: tuple[int, ...]
    texts: tuple[str, ...]

    def as_payload(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {
            "side": self.side,
            "what": self.what,
            "start": self.start,
            "offset": self.offset,
            "token_ids": list(self.token_ids),
            "texts": list(self.texts),
        }

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> TokenWindow:
        """The window :meth:`as_payload` wrote."""
        return cls(
            side=payload["side"],
            what=payload["what"],
            start=payload["start"],
            offset=payload["offset"],
            token_ids=tuple(payload["token_ids"]),
            texts=tuple(payload["texts"]),
        )

    def describe(self) -> list[str]:
        """Two lines: the window's text and ids, split at the offset by ``▶``."""
        cut = self.offset - self.start
        before, after = "".join(self.texts[:cut]), "".join(self.texts[cut:])
        end = self.start + len(self.token_ids)
        ids_before = " ".join(map(str, self.token_ids[:cut]))
        ids_after = " ".join(map(str, self.token_ids[cut:]))
        return [
            f"  {self.side} ({self.what}), tokens {self.start}-{end}, offset {self.offset}:",
            f"    text {_quoted(before)} ▶ {_quoted(after)}",
            f"    ids  [{ids_before}] ▶ [{ids_after}]",
        ]


@dataclass(frozen=True)
class Divergence:
    """Where a rooted candidate's two sides part, and the likely cause (module docstring).

    Producer: :func:`diagnose` (called by ``capture/splice.py``); consumers: the intent's
    admission record (``divergence``), ``grove lineage`` and ``grove show``, and the strict-mode
    refusal (``grove.capture.errors.UnexplainedRootError``). ``token_offset`` is the parent side's.
    """

    message_index: int
    char_offset: int
    cause: Cause
    parent: TokenWindow
    request: TokenWindow

    @property
    def token_offset(self) -> int:
        """The index, in the parent side, of the token that holds the point where they part."""
        return self.parent.offset

    def as_payload(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (the admission record's ``divergence``)."""
        return {
            "message_index": self.message_index,
            "char_offset": self.char_offset,
            "token_offset": self.token_offset,
            "cause": self.cause.value,
            "parent": self.parent.as_payload(),
            "request": self.request.as_payload(),
        }

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Divergence:
        """The divergence :meth:`as_payload` wrote."""
        return cls(
            message_index=payload["message_index"],
            char_offset=payload["char_offset"],
            cause=Cause(payload["cause"]),
            parent=TokenWindow.from_payload(payload["parent"]),
            request=TokenWindow.from_payload(payload["request"]),
        )

    def describe(self) -> str:
        """Several lines for a person: where, the likely cause, and both windows."""
        head = (
            f"diverged at message {self.message_index}, character {self.char_offset}, token "
            f"{self.parent.offset} of the parent side and {self.request.offset} of the request "
            f"side; likely cause: {_CAUSE_TEXT[self.cause]}"
        )
        return "\n".join([head, *self.parent.describe(), *self.request.describe()])


def common_prefix_length(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading elements (characters, token ids) ``a`` and ``b`` share.

    A binary search over slice comparisons: O(log n) comparisons done in C, not a Python loop.
    Token ids may come as a list on one side and a tuple on the other: both are compared as
    tuples.
    """
    if type(a) is not type(b):
        a, b = tuple(a), tuple(b)
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def token_at(
    token_ids: Sequence[int],
    char_offset: int,
    decode: Decode,
    known: int = 0,
    base: int | None = None,
) -> int:
    """The index of the token whose decoded text holds character ``char_offset`` of
    ``decode(token_ids)``; ``len(token_ids)`` when the text ends before it.

    ``known`` tokens at the start are taken whole before the point (the ids both sides share),
    their text ``base`` characters long (decoded when not given); the search gallops forward from
    them, so its cost grows with the distance to the point, not with the context.
    """
    known = max(0, min(known, len(token_ids)))
    if base is None:
        base = len(decode(token_ids[:known])) if known else 0
    if base > char_offset:
        known, base = 0, 0

    def reaches(end: int) -> bool:  # does the text of tokens [.., end) pass the point?
        return base + len(decode(token_ids[known:end])) > char_offset

    lo, step = known, 1  # the text of tokens [.., lo) does not pass the point
    while True:
        hi = min(lo + step, len(token_ids))
        if hi == lo:
            return len(token_ids)
        if reaches(hi):
            break
        lo, step = hi, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if reaches(mid):
            hi = mid
        else:
            lo = mid
    return lo


def classify(
    parent_text: str,
    request_text: str,
    *,
    request_decoded: str,
    same_token_ids: bool,
    decoded_from: int = 0,
) -> Cause:
    """The likely cause of the divergence between two texts (module docstring, in order).

    ``request_decoded`` is the request side's token ids decoded from character ``decoded_from``
    on (its text as the model would read it back, through the point); ``same_token_ids`` whether
    the two sides' ids are equal.
    """
    if parent_text == request_text:
        return Cause.UNKNOWN if same_token_ids else Cause.TOKEN_MERGING
    at = common_prefix_length(parent_text, request_text)
    if _reasoning_missing(parent_text, request_text, at):
        return Cause.STRIPPED_REASONING
    if at == min(len(parent_text), len(request_text)):
        return Cause.TRUNCATION
    parent_there = parent_text[decoded_from : decoded_from + len(request_decoded)]
    if decoded_from + common_prefix_length(parent_there, request_decoded) > at:
        return Cause.TOKEN_MERGING
    parent_rest = parent_text[at : at + REALIGN_SPAN]
    request_rest = request_text[at : at + REALIGN_SPAN]
    matcher = difflib.SequenceMatcher(None, parent_rest, request_rest, autojunk=False)
    run = matcher.find_longest_match(0, len(parent_rest), 0, len(request_rest)).size
    return Cause.CHANGED_CONTENT if run >= REALIGN_RUN else Cause.UNKNOWN


def diagnose(parent: Side, request: Side, *, message_index: int, decode: Decode) -> Divergence:
    """The divergence of two sides (``message_index`` located by the caller, which renders).

    The ids both sides share are decoded once; the request side's own tokens are decoded only
    from there through the window after the point.
    """
    at = common_prefix_length(parent.text, request.text)
    shared = common_prefix_length(parent.token_ids, request.token_ids)
    base = len(decode(parent.token_ids[:shared])) if shared else 0
    if base > at:  # a decode that does not extend its prefixes: search from the start
        shared, base = 0, 0
    parent_offset = token_at(parent.token_ids, at, decode, shared, base)
    request_offset = token_at(request.token_ids, at, decode, shared, base)
    cause = classify(
        parent.text,
        request.text,
        request_decoded=decode(request.token_ids[shared : request_offset + WINDOW]),
        decoded_from=base,
        same_token_ids=shared == len(parent.token_ids) == len(request.token_ids),
    )
    return Divergence(
        message_index=message_index,
        char_offset=at,
        cause=cause,
        parent=_window(parent, parent_offset, decode),
        request=_window(request, request_offset, decode),
    )


def _window(side: Side, offset: int, decode: Decode) -> TokenWindow:
    start = max(0, offset - WINDOW)
    ids = tuple(side.token_ids[start : offset + WINDOW])
    texts = tuple(_cut(decode([token])) for token in ids)
    return TokenWindow(side.name, side.what, start, offset, ids, texts)


def _cut(text: str) -> str:
    return text if len(text) <= TOKEN_TEXT_LIMIT else text[: TOKEN_TEXT_LIMIT - 1] + "…"


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _reasoning_missing(parent: str, request: str, at: int) -> bool:
    """Whether, at ``at``, the parent opens (or is inside) a reasoning block the request lacks."""
    if parent.rfind(THINK_OPEN, 0, at) > parent.rfind(THINK_CLOSE, 0, at):
        return True  # inside the parent's reasoning, and the request's differs from there
    tag = parent.find(THINK_OPEN, max(0, at - len(THINK_OPEN) + 1))
    if tag == -1:
        return False
    if tag < at:
        return True  # the tag straddles the point: the request shares only its start
    return parent[at:tag].strip() == "" and not request[at:].lstrip().startswith(THINK_OPEN)
