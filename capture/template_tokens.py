"""Text stays text: a prompt's special tokens come from the chat template, never from its text.

A tokenizer's special tokens (``<|im_start|>``, ``<|im_end|>``, ...) have a text form, and a
tokenizer asked to encode a rendered prompt matches that form wherever it occurs — also inside a
tool result, a web page or a user message. Left so, any text could forge a turn boundary in the
captured tokens (``docs/security.md``, "Text stays text"). Grove therefore tokenizes a rendering
knowing which special-token occurrences the template wrote (``docs/normalization.md``, "Text
stays text"):

1. Escape. Every string the template is given (message content, reasoning, tool-call names and
   arguments, keys included, tools, template kwargs; not a message's ``role``, which
   normalization restricts to five names) is scanned for special-token text. Each whole
   occurrence, a leading proper suffix and a trailing proper prefix of one (so adjacent texts
   cannot complete one with the template's help) is replaced by a marker: ASCII letters and
   digits with a random nonce per tokenizer, which ``tojson``, ``trim`` and string concatenation
   pass through unchanged.
2. Render the escaped input. Every special-token text left in the result was written by the
   template. Put the escaped texts back, recording where the template's special tokens lie.
3. Verify. Render the original input as well: the restored text must equal it, else the
   template treats special-token text in message text unlike other text (it splits on it, or
   changes the text) and the call is refused rather than rendered another way. Steps 1–3 cost
   nothing beyond a scan when no string holds special-token text or a piece of one.
4. Encode. Where the tokenizer's own matching finds exactly the template's tokens, the text is
   encoded by the tokenizer as it stands, so every prompt without special-token text in its
   text gets the ids it always got. Otherwise the text is cut at the template's tokens — where
   the tokenizer cuts it anyway: no BPE merge crosses an added token — and each piece between
   them is encoded with special-token matching off (``tokenizers``' ``encode_special_tokens``)
   on a copy of the tokenizer, behind a throwaway anchor token so that a piece keeps the
   position it has in the whole text (a Metaspace pre-tokenizer prefixes only the first piece);
   the pieces and the template's ids are joined. ``lstrip``/``rstrip`` tokens absorb the
   whitespace beside them as the tokenizer does. A piece that still encodes to a special id
   (the model's vocabulary spells it) is refused.

Non-special added tokens (``<think>``, ``<tool_call>`` in Qwen-style tokenizers) are ordinary
vocabulary: text holding them encodes to them, as it does in any server of the model.
"""

from __future__ import annotations

import functools
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Final, Generic, TypeVar

from tokenizers import AddedToken, Tokenizer
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from grove.capture.errors import CaptureError

__all__ = [
    "BoundedCache",
    "RenderedText",
    "SpecialTokenText",
    "TemplateTokenError",
    "expand_template_token",
    "plain_repr",
    "rendered_join",
    "rendered_slice",
]

Span = tuple[int, int]
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

ENCODINGS_CACHED: Final = 256
"""Encodings of renderings a :class:`SpecialTokenText` keeps (a prompt group's roots share one)."""
ENCODING_UNITS_CACHED: Final = 1 << 20
"""Characters and token ids those encodings may hold together."""


class TemplateTokenError(CaptureError, ValueError):
    """The text cannot be rendered or encoded with its special tokens kept to the template's
    (the renderer answers it as :class:`~grove.capture.errors.RenderError`)."""


class RenderedText(str):
    """A chat template's rendering and the ``[start, end)`` spans of the special tokens that the
    template itself wrote, in order; any other special-token text in it is message text.

    Producer: ``Renderer.render``; consumers: ``Renderer.encode`` and the splice, which cuts and
    joins renderings with :func:`rendered_slice` and :func:`rendered_join`. Plain ``str``
    operations (slicing, ``+`` with a ``str``) give a plain ``str``, which carries no spans.
    """

    template_tokens: tuple[Span, ...]

    def __new__(cls, text: str, template_tokens: Sequence[Span] = ()) -> RenderedText:
        """``text`` with the template's special-token spans."""
        rendered = super().__new__(cls, text)
        rendered.template_tokens = tuple(template_tokens)
        return rendered

    def __add__(self, other: str) -> str:
        """Joined with another rendering, a rendering; with a plain ``str``, a plain ``str``."""
        return rendered_join(self, other)


def rendered_slice(text: str, start: int, end: int | None = None) -> str:
    """``text[start:end]``, keeping the template's spans that lie wholly inside when ``text`` is a
    :class:`RenderedText` (a span cut by either end is dropped: its piece is text)."""
    stop = len(text) if end is None else min(end, len(text))
    piece = str.__getitem__(text, slice(start, stop))
    if not isinstance(text, RenderedText):
        return piece
    spans = [(a - start, b - start) for a, b in text.template_tokens if start <= a and b <= stop]
    return RenderedText(piece, spans)


def rendered_join(left: str, right: str) -> str:
    """``left + right``; a :class:`RenderedText` when both are, a plain ``str`` otherwise."""
    text = str.__add__(str(left), str(right))
    if not (isinstance(left, RenderedText) and isinstance(right, RenderedText)):
        return text
    shift = len(left)
    return RenderedText(
        text, (*left.template_tokens, *((a + shift, b + shift) for a, b in right.template_tokens))
    )


def expand_template_token(text: str, token: str, counts: Sequence[int]) -> str:
    """``text`` with the ``k``-th ``token`` the template wrote repeated ``counts[k]`` times (an
    image token expanded into its placeholders), each copy one of the template's tokens; the
    same text type as ``text`` (in a plain ``str`` every occurrence is the template's). Raises
    ``TemplateTokenError`` when the template wrote another number of them."""
    found = re.finditer(re.escape(token), text)
    spans = text.template_tokens if isinstance(text, RenderedText) else [m.span() for m in found]
    plain = str(text)
    expanding = [i for i, (a, b) in enumerate(spans) if plain[a:b] == token]
    if len(expanding) != len(counts):
        raise TemplateTokenError(
            f"the chat template wrote {len(expanding)} {token!r} tokens for {len(counts)} "
            "expansions"
        )
    copies = dict(zip(expanding, counts, strict=True))
    pieces: list[str] = []
    moved: list[Span] = []
    length = cursor = 0
    for index, (start, end) in enumerate(spans):
        pieces.append(plain[cursor:start])
        length += start - cursor
        for _ in range(copies.get(index, 1)):
            pieces.append(plain[start:end])
            moved.append((length, length + end - start))
            length += end - start
        cursor = end
    pieces.append(plain[cursor:])
    expanded = "".join(pieces)
    return RenderedText(expanded, moved) if isinstance(text, RenderedText) else expanded


def plain_repr(value: Any) -> str | None:
    """``repr(value)`` when ``value`` is built of exactly ``dict`` (with ``str`` keys), ``list``,
    ``str``, ``int``, ``float``, ``bool`` and ``None`` — no subclass, no tuple — else None. On such
    values the text is exact: two values with the same text are equal, of the same types and in
    the same key order, so a template renders them alike (a cache key)."""
    return repr(value) if _plain(value) else None


def _plain(value: Any) -> bool:
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return True
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if kind is list:
        return all(map(_plain, value))
    return False


class BoundedCache(Generic[K, V]):
    """A thread-safe least-recently-used map from exact keys to values, bounded by its number of
    entries and by the summed size its callers give the entries (characters and token ids); the
    least recently used go first. A value larger than the whole bound is not kept."""

    def __init__(self, entries: int, units: int) -> None:
        self.entries = entries
        self.units = units
        self.held = 0  # the summed size of the entries kept
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many entries are kept."""
        return len(self._items)

    def get(self, key: K) -> V | None:
        """The value kept for ``key`` (now the most recently used), or None."""
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V, units: int) -> None:
        """Keep ``value`` for ``key`` (``units`` its size), dropping the least recently used
        entries beyond the bounds."""
        if units > self.units:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.held -= old[1]
            self._items[key] = (value, units)
            self.held += units
            while len(self._items) > self.entries or self.held > self.units:
                _, (_, dropped) = self._items.popitem(last=False)
                self.held -= dropped


class SpecialTokenText:
    """One tokenizer's special tokens as text: escaping, locating and encoding around them.

    Thread-safe: the state is built at construction (the encoding copy of the tokenizer on first
    need) and only read afterwards.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        added = {t.content: (i, t) for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        self.ids: dict[str, int] = {content: i for content, (i, _) in added.items() if content}
        self.special_ids: frozenset[int] = frozenset(self.ids.values())
        self._lstrip = frozenset(c for c, (_, t) in added.items() if t.lstrip)
        self._rstrip = frozenset(c for c, (_, t) in added.items() if t.rstrip)
        ordered = sorted(self.ids, key=len, reverse=True)  # leftmost-longest, as tokenizers match
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._prefixes = frozenset(c[:k] for c in self.ids for k in range(1, len(c)))
        self._suffixes = frozenset(c[k:] for c in self.ids for k in range(1, len(c)))
        self._longest = max(map(len, self.ids), default=0)
        self._first_chars = frozenset(c[0] for c in self.ids)
        self._last_chars = frozenset(c[-1] for c in self.ids)
        # repr keeps a printable character other than quotes and backslash as it is
        edges = self._first_chars | self._last_chars
        self._edges = None if any(not c.isprintable() or c in "'\"\\" for c in edges) else edges
        self._encodings: BoundedCache[tuple[str, tuple[Span, ...], bool], tuple[int, ...]] = (
            BoundedCache(ENCODINGS_CACHED, ENCODING_UNITS_CACHED)
        )
        self._nonce = "g" + secrets.token_hex(8)  # a letter: no case change leaves it whole
        self._anchor = f"\ue000grove{self._nonce}\ue001"  # unguessable: text cannot hold it
        specials = "" if self._pattern is None else f"|{self._pattern.pattern}"
        self._scanner = re.compile(f"GroveText{self._nonce}N(?P<marker>[0-9]+)Z{specials}")

    def find(self, text: str) -> tuple[Span, ...]:
        """The spans where the tokenizer's matching finds special-token text in ``text``."""
        if self._pattern is None:
            return ()
        return tuple(m.span() for m in self._pattern.finditer(text))

    def escape(self, value: Any, table: list[str], *, keep_role: bool = False) -> Any:
        """``value`` with every string's special-token text replaced by markers; the texts
        replaced are appended to ``table`` (a marker names its index). ``keep_role`` leaves the
        ``role`` of a message (a mapping at this level) as it is."""
        if isinstance(value, str):
            return self._escape_text(value, table)
        if isinstance(value, int | float) or value is None:  # before the slower ABC check
            return value
        if isinstance(value, dict | Mapping):
            return {
                self.escape(k, table): v if keep_role and k == "role" else self.escape(v, table)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.escape(v, table, keep_role=keep_role) for v in value]
        return value

    def may_escape(self, dumped: str) -> bool:
        """Whether :meth:`escape` may change a value whose :func:`plain_repr` is ``dumped``:
        False only when no character that starts or ends a special token's text is in it (an
        escape changes a string only where one is)."""
        if self._edges is None:
            return True
        return any(c in dumped for c in self._edges)

    def restore(self, escaped: str, table: Sequence[str]) -> RenderedText:
        """The rendering ``escaped`` with the escaped texts put back, and the spans of the special
        tokens the template wrote (every special-token text left in ``escaped``)."""
        pieces: list[str] = []
        spans: list[Span] = []
        length = 0
        at = 0
        for found in self._scanner.finditer(escaped):
            pieces.append(escaped[at : found.start()])
            length += found.start() - at
            if found.group("marker") is not None:
                index = int(found.group("marker"))
                if index >= len(table):
                    raise TemplateTokenError("the rendering holds a marker Grove did not write")
                piece = table[index]
            else:
                piece = found.group(0)
                spans.append((length, length + len(piece)))
            pieces.append(piece)
            length += len(piece)
            at = found.end()
        pieces.append(escaped[at:])
        text = "".join(pieces)
        if self._nonce in text:
            raise TemplateTokenError(
                "the chat template changed escaped message text (an escape marker survives)"
            )
        return RenderedText(text, spans)

    def rendered(self, text: str) -> RenderedText:
        """A rendering of input that held no special-token text: all of it is the template's."""
        return RenderedText(text, self.find(text))

    def encode(self, text: RenderedText, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``: the template's special tokens as their ids, everything else as
        ordinary text (module docstring, step 4). Kept per exact text, spans and flag (bounded:
        :data:`ENCODINGS_CACHED`), so renderings shared by calls are encoded once."""
        key = (str.__str__(text), text.template_tokens, add_special_tokens)
        cached = self._encodings.get(key)
        if cached is None:
            cached = tuple(self._encode(text, add_special_tokens=add_special_tokens))
            self._encodings.put(key, cached, len(text) + len(cached))
        return list(cached)

    def _encode(self, text: RenderedText, *, add_special_tokens: bool) -> list[int]:
        if self.find(text) == text.template_tokens:
            ids = self.plain_encode(str(text), add_special_tokens=add_special_tokens)
            framing = [*self._frame[0], *self._frame[1]] if add_special_tokens else []
            expected = len(text.template_tokens) + self._count(framing)
            if self._count(ids) == expected:
                return ids
        ids = []
        at = 0
        for start, end in text.template_tokens:
            token = str.__getitem__(text, slice(start, end))
            piece = str.__getitem__(text, slice(at, start))
            if token in self._lstrip:
                piece = piece.rstrip()
            ids += self._ordinary(piece, first=at == 0)
            ids.append(self.ids[token])
            at = end
            if token in self._rstrip:
                rest = str.__getitem__(text, slice(at, None))
                at += len(rest) - len(rest.lstrip())
        ids += self._ordinary(str.__getitem__(text, slice(at, None)), first=at == 0)
        return self._framed(ids) if add_special_tokens else ids

    def plain_encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """``tokenizer.encode(text)`` (every special-token text matched): straight from the
        tokenizers backend where transformers' fast tokenizer would only hand the text to it, its
        backend already set as that encode sets it (no truncation, no padding, special tokens
        matched)."""
        backend = self._plain_backend
        if (
            backend is not None
            and backend.truncation is None
            and backend.padding is None
            and not backend.encode_special_tokens
            and not self.tokenizer.split_special_tokens
        ):
            return backend.encode(text, add_special_tokens=add_special_tokens).ids
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def plain_decode(self, token_ids: Sequence[int]) -> str:
        """``tokenizer.decode(token_ids)`` keeping special tokens and spaces as they are: straight
        from the tokenizers backend where transformers' fast tokenizer decode (neither method
        overridden) would only hand the ids to it."""
        kind = type(self.tokenizer)
        backend = getattr(self.tokenizer, "_tokenizer", None)
        if (
            kind.decode is PreTrainedTokenizerBase.decode
            and kind._decode is PreTrainedTokenizerFast._decode
            and isinstance(backend, Tokenizer)
        ):
            return backend.decode(list(token_ids), skip_special_tokens=False)
        text = self.tokenizer.decode(
            list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        assert isinstance(text, str)  # one list of ids decodes to one string
        return text

    @functools.cached_property
    def _plain_backend(self) -> Tokenizer | None:
        """The tokenizer's own backend where its encode (transformers' fast tokenizer, none of
        the methods on the way overridden) only calls the backend."""
        kind, backend = type(self.tokenizer), getattr(self.tokenizer, "_tokenizer", None)
        base, fast = PreTrainedTokenizerBase, PreTrainedTokenizerFast
        same = (
            kind.encode is base.encode
            and kind._get_padding_truncation_strategies is base._get_padding_truncation_strategies
            and kind._encode_plus is fast._encode_plus
            and getattr(kind, "set_truncation_and_padding", None) is fast.set_truncation_and_padding
        )
        if same and isinstance(backend, Tokenizer):
            return backend
        return None

    def _count(self, ids: Sequence[int]) -> int:
        """How many of ``ids`` are special tokens."""
        return sum(map(self.special_ids.__contains__, ids))

    def _escape_text(self, text: str, table: list[str]) -> str:
        """``text`` with its whole special-token occurrences, a leading proper suffix of one and a
        trailing proper prefix of one each replaced by a marker."""
        cuts = list(self.find(text))
        reach = min(len(text), self._longest - 1)
        if (
            not cuts
            and self._last_chars.isdisjoint(text[:reach])
            and self._first_chars.isdisjoint(text[len(text) - reach :])
        ):
            return text  # the common case: nothing to escape, no piece of a token at either end
        # A leading suffix ends with a token's last character, a trailing prefix starts with a
        # token's first: only those lengths are looked up.
        lead = next(
            (
                k
                for k in range(reach, 0, -1)
                if text[k - 1] in self._last_chars and text[:k] in self._suffixes
            ),
            0,
        )
        trail = next(
            (
                k
                for k in range(reach, 0, -1)
                if text[-k] in self._first_chars and text[-k:] in self._prefixes
            ),
            0,
        )
        if lead:
            cuts.append((0, lead))
        if trail:
            cuts.append((len(text) - trail, len(text)))
        if not cuts:
            return text
        merged: list[list[int]] = []
        for start, end in sorted(cuts):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        out = []
        at = 0
        for start, end in merged:
            out.append(text[at:start])
            out.append(f"GroveText{self._nonce}N{len(table)}Z")
            table.append(text[start:end])
            at = end
        out.append(text[at:])
        return "".join(out)

    def _ordinary(self, piece: str, *, first: bool) -> list[int]:
        """``piece`` encoded as text, no special token matched (``first``: it starts the text)."""
        if not piece:
            return []
        backend = self._text_backend
        if backend is None:  # a tokenizer without a tokenizers backend
            ids = list(
                self.tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=True)
            )
        elif first:
            ids = backend.encode(piece, add_special_tokens=False).ids
        else:
            anchored = backend.encode(self._anchor + piece, add_special_tokens=False).ids
            if not anchored or anchored[0] != backend.token_to_id(self._anchor):
                raise TemplateTokenError("the tokenizer copy did not keep its anchor token")
            ids = anchored[1:]
        forged = sorted(self.special_ids.intersection(ids))
        if forged:
            raise TemplateTokenError(
                f"the tokenizer encodes message text as special tokens {forged} even with "
                "special-token matching off (its vocabulary spells them)"
            )
        return ids

    @functools.cached_property
    def _text_backend(self) -> Tokenizer | None:
        """A copy of the tokenizer's backend that encodes special-token text as text, with an
        anchor token of its own (module docstring, step 4); None without a backend."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if not isinstance(backend, Tokenizer):
            return None
        copy = Tokenizer.from_str(backend.to_str())
        copy.encode_special_tokens = True
        copy.add_tokens([AddedToken(self._anchor, special=False, normalized=False)])
        return copy

    @functools.cached_property
    def _frame(self) -> tuple[list[int], list[int]]:
        """The ids the tokenizer adds before and after a text when asked for special tokens."""
        bare = list(self.tokenizer.encode("x", add_special_tokens=False))
        framed = list(self.tokenizer.encode("x", add_special_tokens=True))
        for start in range(len(framed) - len(bare) + 1):
            if framed[start : start + len(bare)] == bare:
                return framed[:start], framed[start + len(bare) :]
        raise TemplateTokenError("cannot tell where the tokenizer adds its special tokens")

    def _framed(self, ids: list[int]) -> list[int]:
        before, after = self._frame
        return [*before, *ids, *after]
