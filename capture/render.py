"""Message normalization, chat-template rendering, render-option digests and replay summaries.

Normalization (version :data:`NORMALIZATION_VERSION`, rules in ``docs/normalization.md``) turns the
items a client sends — Chat Completions messages or Responses input items — into one canonical
message list. Everything downstream reads only that list: the chat template renders it, admission
digests it (``ledger/admission.py``), and replay summaries chain its digests. Two requests that
differ only in what normalization drops (item ids, statuses, ``None`` values, key order, the
spelling of tool-call arguments) therefore render, digest and admit identically.

A call's *replay summary* (``docs/normalization.md``, "Replay summary") is what a later request is
matched against without keeping the messages: normalization version, item count (its request plus
its own output), the source digest chained over those items, the same chain with null and empty
assistant tool-call content identified, and the digest of the effective render options.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import jinja2
from tokenizers import decoders
from transformers import PreTrainedTokenizerBase

from grove.capture.errors import NormalizationError, RenderError
from grove.capture.template_tokens import (
    BoundedCache,
    RenderedText,
    SpecialTokenText,
    TemplateTokenError,
    plain_repr,
)
from grove.ledger.admission import (
    ASSISTANT_ROLE,
    PREFIX_DIGEST_SEED,
    AdmissionItem,
    prefix_digests,
)
from grove.ledger.events import ReplaySummary

__all__ = [
    "NORMALIZATION_VERSION",
    "NormalizedRequest",
    "RenderOptions",
    "RenderedText",
    "Renderer",
    "ReplaySummary",
    "admission_items",
    "normalize_messages",
    "render_options_digest",
    "replay_summary",
]

NORMALIZATION_VERSION: Final = 4
_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool"})
_DROPPED_ITEM_KEYS: Final = frozenset({"id", "status", "type", "provider_data"})
_MESSAGE_ITEM_KEYS: Final = frozenset({"role", "content"})
_CLIENT_TOOL_CALL_KEYS: Final = frozenset({"index"})
"""Kept by the official client's stream helper: a tool call's position among the stream's deltas."""
_CLIENT_FUNCTION_KEYS: Final = frozenset({"parsed_arguments"})
"""Added by the official client's parsing helpers: its own parse of ``arguments``."""
_TEXT_PART_TYPES: Final = frozenset({"text", "input_text", "output_text"})
_ITEM_DIGEST_TAG: Final = f"grove.item.v{NORMALIZATION_VERSION}\n".encode()
_OPTIONS_DIGEST_TAG: Final = b"grove.render_options.v1\n"
_SCALARS: Final = (str, int, float)
RENDERS_CACHED: Final = 256  # renderings a Renderer keeps (a prompt group's roots render alike)
RENDER_UNITS_CACHED: Final = 1 << 22  # characters they and their inputs' texts hold at most
_UNSTABLE_TEMPLATE_NAMES: Final = ("strftime_now", "lipsum", "random")
"""Names through which a template can render differently from the same input (the date, jinja's
random text and choice): a template that mentions one is rendered every time."""


@dataclass(frozen=True)
class NormalizedRequest:
    """A request's items after normalization, in order; treat the message dicts as read-only.

    Producer: :func:`normalize_messages`; consumers: :class:`Renderer`, :func:`admission_items`,
    ``grove.capture.splice.plan_call``. ``echoed_ids[i]`` are the provider ids the client sent on
    the source items of ``messages[i]`` (dropped from the message itself); both tuples have one
    entry per normalized message.
    """

    messages: tuple[dict[str, Any], ...]
    echoed_ids: tuple[tuple[str, ...], ...]
    normalization_version: int = NORMALIZATION_VERSION

    def __post_init__(self) -> None:
        if len(self.messages) != len(self.echoed_ids):
            raise ValueError(
                "NormalizedRequest needs one echoed-id tuple per message: got "
                f"{len(self.echoed_ids)} for {len(self.messages)} messages"
            )


def normalize_messages(items: Sequence[Mapping[str, Any]]) -> NormalizedRequest:
    """Normalize Chat Completions messages and/or Responses input items (``docs/normalization.md``).

    Drops item ids (kept as echoed ids, with an Agents SDK ``provider_data.response_id``),
    statuses, client metadata (``provider_data``; everything but role and content of a typed
    Responses message item; a tool call's ``index`` and ``function.parsed_arguments``) and
    ``None`` values; sorts keys; parses JSON tool-call arguments;
    joins all-text content parts; maps Responses reasoning, function-call and
    function-call-output items to assistant and tool messages, folding consecutive assistant
    output items into one assistant message. Idempotent.
    """
    messages: list[dict[str, Any]] = []
    echoed: list[tuple[str, ...]] = []
    foldable = False  # the last message was built from Responses output items and may take more
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise NormalizationError(index, "an item must be a JSON object", item)
        ids = _echoed_ids(item)
        kind = item.get("type")
        if kind in (None, "message"):
            fields = (
                item if kind is None else {k: item[k] for k in _MESSAGE_ITEM_KEYS & item.keys()}
            )
            message = _chat_message(index, fields)
            output = kind == "message" and message["role"] == ASSISTANT_ROLE
            fold = output and foldable and not {"content", "tool_calls"} & messages[-1].keys()
        elif kind == "reasoning":
            message = {"role": ASSISTANT_ROLE, "reasoning_content": _reasoning_text(index, item)}
            output, fold = True, False
        elif kind == "function_call":
            call = _tool_call(index, _responses_function_call(index, item))
            message = {"role": ASSISTANT_ROLE, "tool_calls": [call]}
            output, fold = True, foldable
        elif kind == "function_call_output":
            message = _function_call_output(index, item)
            output = fold = False
        else:
            raise NormalizationError(
                index,
                "a Responses item type must be message, reasoning, function_call or "
                "function_call_output",
                kind,
            )
        if fold:
            _fold_into(messages[-1], message)
            echoed[-1] += tuple(i for i in ids if i not in echoed[-1])
        else:
            messages.append(message)
            echoed.append(ids)
        foldable = output
    return NormalizedRequest(
        messages=tuple(_sorted_keys(m) for m in messages), echoed_ids=tuple(echoed)
    )


def admission_items(request: NormalizedRequest) -> tuple[AdmissionItem, ...]:
    """The request's items as admission sees them: role, strict and canonical digest, echoed ids."""
    items = []
    for message, ids in zip(request.messages, request.echoed_ids, strict=True):
        digest = _item_digest(message)
        canonical = _tool_content_canonical(message)
        canonical_digest = digest if canonical is message else _item_digest(canonical)
        items.append(AdmissionItem(message["role"], digest, canonical_digest, ids))
    return tuple(items)


@dataclass(frozen=True)
class RenderOptions:
    """Everything besides the messages that decides the rendered prompt; digested per request.

    Producer: the gateway (from the model configuration and the request body); consumers:
    :class:`Renderer` and :func:`render_options_digest`. ``chat_template`` None means the
    tokenizer's own template; ``tools`` None means no tools. Mappings must hold JSON values.
    """

    model: str
    chat_template: str | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    tools: tuple[Mapping[str, Any], ...] | None = None
    tool_choice: str | Mapping[str, Any] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    reasoning_effort: str | None = None
    processor_kwargs: Mapping[str, Any] = field(default_factory=dict)


def render_options_digest(options: RenderOptions, chat_template: str) -> str:
    """The sha256 of the effective render options, with ``chat_template`` the template text used."""
    record = {
        "model": options.model,
        "chat_template_sha256": hashlib.sha256(chat_template.encode()).hexdigest(),
        "template_kwargs": dict(options.template_kwargs),
        "tools": None if options.tools is None else [dict(t) for t in options.tools],
        "tool_choice": options.tool_choice,
        "add_generation_prompt": options.add_generation_prompt,
        "add_special_tokens": options.add_special_tokens,
        "reasoning_effort": options.reasoning_effort,
        "processor_kwargs": dict(options.processor_kwargs),
    }
    try:
        text = _canonical_json(record)
    except (TypeError, ValueError) as exc:
        raise RenderError(options.model, f"render options must be JSON values: {exc}") from None
    return hashlib.sha256(_OPTIONS_DIGEST_TAG + text.encode()).hexdigest()


class Renderer:
    """Renders normalized messages with a transformers tokenizer's chat template, and tokenizes.

    One per model; thread-safe as far as the tokenizer is. Text is tokenized without special
    tokens unless the options ask for them, and decoded without skipping or cleaning anything, so
    the boundary check in ``capture/splice.py`` compares exact text. Renderings are kept per exact
    input (bounded: :data:`RENDERS_CACHED`); the tokenizer's special tokens must not change after
    construction (as for :class:`SpecialTokenText`).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.special_text = SpecialTokenText(tokenizer)
        self._renders: BoundedCache[tuple[str, bool, str], RenderedText] = BoundedCache(
            RENDERS_CACHED, RENDER_UNITS_CACHED
        )

    def chat_template(self, options: RenderOptions) -> str:
        """The template text the options select: their own, else the tokenizer's."""
        template = options.chat_template or self.tokenizer.chat_template
        if not isinstance(template, str) or not template:
            detail = "no chat template: the tokenizer has none and the render options name none"
            raise RenderError(options.model, detail)
        return template

    def options_digest(self, options: RenderOptions) -> str:
        """The render-options digest of ``options`` with their effective template."""
        return render_options_digest(options, self.chat_template(options))

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        options: RenderOptions,
        *,
        add_generation_prompt: bool | None = None,
    ) -> str:
        """The template's text for ``messages``, as a :class:`RenderedText` that knows which
        special tokens the template wrote (``capture/template_tokens.py``); the generation prompt
        follows ``options`` unless ``add_generation_prompt`` overrides it (the splice renders
        prefixes without one). Raises ``RenderError`` where the template treats special-token
        text inside message text unlike other text.

        A rendering is kept, keyed by the template's text, the generation prompt and the exact
        text of the template's input (messages, tools, template kwargs; ``plain_repr``), when that
        input is plain JSON data and the template cannot render it differently twice
        (:data:`_UNSTABLE_TEMPLATE_NAMES`)."""
        generation = options.add_generation_prompt
        if add_generation_prompt is not None:
            generation = add_generation_prompt
        kwargs = dict(options.template_kwargs)
        if options.reasoning_effort is not None:
            kwargs["reasoning_effort"] = options.reasoning_effort
        tools = None if options.tools is None else [dict(t) for t in options.tools]
        plain = ([dict(m) for m in messages], tools, kwargs)
        dumped = plain_repr(list(plain))
        template = self.tokenizer.get_chat_template(self.chat_template(options))
        key = None
        if dumped is not None and not any(n in template for n in _UNSTABLE_TEMPLATE_NAMES):
            key = (template, generation, dumped)
            cached = self._renders.get(key)
            if cached is not None:
                return cached
        escape = dumped is None or self.special_text.may_escape(dumped)
        rendered = self._render(options, plain, generation, escape=escape)
        if key is not None and dumped is not None:
            self._renders.put(key, rendered, len(template) + len(dumped) + len(rendered))
        return rendered

    def _render(
        self,
        options: RenderOptions,
        plain: tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]],
        generation: bool,
        *,
        escape: bool,
    ) -> RenderedText:
        """Render ``plain`` (messages, tools, kwargs); ``escape`` False when no string of it can
        hold special-token text or a piece of one (nothing to escape, nothing to verify)."""
        special = self.special_text
        table: list[str] = []
        if escape:
            messages, tools, kwargs = plain
            escaped = (
                special.escape(messages, table, keep_role=True),
                special.escape(tools, table),
                {k: special.escape(v, table) for k, v in kwargs.items()},
            )
        if not table:
            return special.rendered(self._apply(options, *plain, generation))
        try:
            rendered = special.restore(self._apply(options, *escaped, generation), table)
        except TemplateTokenError as exc:
            raise RenderError(options.model, str(exc)) from None
        if rendered != self._apply(options, *plain, generation):
            raise RenderError(
                options.model,
                "the chat template renders special-token text inside message text differently "
                "from other text (it splits on it or changes it), so Grove cannot keep that "
                "text as text; remove it from the messages or use another template",
            )
        return rendered

    def _apply(
        self,
        options: RenderOptions,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        add_generation_prompt: bool,
    ) -> str:
        """The chat template applied as it stands: no escaping, no special-token spans."""
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                # transformers annotates tools as a list (invariant) of dict | Callable
                tools=tools,  # type: ignore[arg-type]
                chat_template=self.chat_template(options),
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **kwargs,
            )
        except jinja2.TemplateError as exc:
            raise RenderError(options.model, f"{type(exc).__name__}: {exc}") from None
        if not isinstance(text, str):
            raise RenderError(options.model, f"expected text, got {type(text).__name__}")
        return text

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special tokens are added only when asked. A
        :class:`RenderedText` keeps special-token text inside message text as text (only the
        template's own special tokens get their ids); a plain ``str`` is encoded as the tokenizer
        encodes it, every special-token text matched (stop strings name tokens so)."""
        if not isinstance(text, RenderedText):
            return self.special_text.plain_encode(text, add_special_tokens=add_special_tokens)
        try:
            return self.special_text.encode(text, add_special_tokens=add_special_tokens)
        except TemplateTokenError as exc:
            raise RenderError(str(self.tokenizer.name_or_path), str(exc)) from None

    def decode(self, token_ids: Sequence[int]) -> str:
        """The exact text of ``token_ids``: special tokens kept, no clean-up of spaces."""
        return self.special_text.plain_decode(token_ids)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one token stands for, even when it ends inside a multi-byte character
        (where ``decode([token_id])`` gives U+FFFD): an added token's text as UTF-8; a byte-level
        BPE token's symbols through the byte decoder; a byte-fallback piece ``<0xNN>`` its byte.
        Other tokenizers fall back to the UTF-8 of the decoded text."""
        added = self.tokenizer.added_tokens_decoder.get(token_id)
        if added is not None:
            return added.content.encode()
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            byte_of = _byte_decoder()
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            if isinstance(getattr(backend, "decoder", None), decoders.ByteLevel) and all(
                c in byte_of for c in piece
            ):
                return bytes(byte_of[c] for c in piece)
            fallback = _BYTE_FALLBACK.fullmatch(piece)
            if fallback is not None:
                return bytes([int(fallback.group(1), 16)])
        return self.decode([token_id]).encode()

    def tool_content_forms_render_identically(
        self, messages: Sequence[Mapping[str, Any]], options: RenderOptions
    ) -> bool:
        """Whether the template renders ``messages`` the same with every null-or-empty assistant
        tool-call content absent as with it empty: the proof admission needs before it may match
        the two forms (vacuously true when no message has such content)."""
        positions = {i for i, m in enumerate(messages) if _null_or_empty_tool_content(m)}
        if not positions:
            return True
        absent = [_tool_content_canonical(m) for m in messages]
        empty = [{**m, "content": ""} if i in positions else m for i, m in enumerate(absent)]
        return self.render(absent, options) == self.render(empty, options)


def replay_summary(
    items: Sequence[AdmissionItem],
    render_options_digest: str,
    chains: Sequence[tuple[str, str]] | None = None,
) -> ReplaySummary:
    """The replay summary of ``items`` (a request, or a request plus its output) under options;
    ``chains``: their prefix digests (``prefix_digests``) where the caller has them."""
    if chains is None:
        chains = list(prefix_digests(items))
    strict, canonical = chains[-1] if chains else (PREFIX_DIGEST_SEED, PREFIX_DIGEST_SEED)
    return ReplaySummary(
        normalization_version=NORMALIZATION_VERSION,
        item_count=len(items),
        source_digest=strict,
        canonical_source_digest=canonical,
        render_options_digest=render_options_digest,
    )


_BYTE_FALLBACK: Final = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's symbol-to-byte table (the inverse of GPT-2's ``bytes_to_unicode``):
    printable bytes stand for themselves, the others for code points from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_CANONICAL_JSON: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _canonical_json(value: Any) -> str:
    return _CANONICAL_JSON.encode(value)


def _item_digest(message: Mapping[str, Any]) -> str:
    return hashlib.sha256(_ITEM_DIGEST_TAG + _canonical_json(message).encode()).hexdigest()


def _null_or_empty_tool_content(message: Mapping[str, Any]) -> bool:
    """An assistant tool-call message whose content is absent (null) or empty."""
    return (
        message.get("role") == ASSISTANT_ROLE
        and bool(message.get("tool_calls"))
        and message.get("content", "") == ""
    )


def _tool_content_canonical(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """``message`` without its null-or-empty tool-call content; the same object otherwise."""
    if _null_or_empty_tool_content(message):
        return {k: v for k, v in message.items() if k != "content"}
    return message


def _echoed_ids(item: Mapping[str, Any]) -> tuple[str, ...]:
    """The provider ids an item carries: its ``id``, and the response id an OpenAI Agents SDK
    item keeps in ``provider_data`` (the completion that produced it)."""
    provider = item.get("provider_data")
    found = [item.get("id"), provider.get("response_id") if isinstance(provider, Mapping) else None]
    ids: list[str] = []
    for candidate in found:
        if isinstance(candidate, str) and candidate and candidate not in ids:
            ids.append(candidate)
    return tuple(ids)


def _fold_into(previous: dict[str, Any], message: Mapping[str, Any]) -> None:
    """Merge a Responses assistant output item into the assistant message it continues."""
    for key, value in message.items():
        if key == "tool_calls":
            previous["tool_calls"] = [*previous.get("tool_calls", ()), *value]
        elif key != "role":
            previous[key] = value


def _without_none(value: Any) -> Any:
    if isinstance(value, _SCALARS):  # checked first: abstract-class checks are slow
        return value
    if isinstance(value, dict | Mapping):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_none(v) for v in value]
    return value


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, dict | Mapping):
        return {k: _sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(v) for v in value]
    return value


def _chat_message(index: int, item: Mapping[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise NormalizationError(index, f"role must be one of {sorted(_ROLES)}", role)
    message = {
        k: _without_none(v)
        for k, v in item.items()
        if k not in _DROPPED_ITEM_KEYS and v is not None
    }
    if "reasoning" in message:
        reasoning = message.pop("reasoning")
        if message.setdefault("reasoning_content", reasoning) != reasoning:
            raise NormalizationError(
                index, "reasoning and reasoning_content must agree when both are given", reasoning
            )
    if "content" in message:
        message["content"] = _content(index, message["content"])
    if "tool_calls" in message:
        calls = message.pop("tool_calls")
        if not isinstance(calls, list):
            raise NormalizationError(index, "tool_calls must be a list", calls)
        if calls:
            message["tool_calls"] = [_tool_call(index, call) for call in calls]
    return message


def _content(index: int, content: Any) -> Any:
    """A string; or all-text parts joined into one; or the parts, None values dropped."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(p, Mapping) for p in content):
        raise NormalizationError(index, "content must be a string or a list of parts", content)
    parts = [_without_none(p) for p in content]
    if all(p.get("type") in _TEXT_PART_TYPES and isinstance(p.get("text"), str) for p in parts):
        return "".join(p["text"] for p in parts)
    return [_part(p) for p in parts]


def _part(part: dict[str, Any]) -> dict[str, Any]:
    """One part of a content list with any non-text part, in the Chat form: an ``input_text``
    part is a ``text`` part, an image (Chat ``image_url`` or Responses ``input_image`` with its
    URL) is ``{"type": "image_url", "image_url": {"url": ...}}`` with its ``detail`` unless
    ``auto`` (the default of both APIs); other parts as they are."""
    kind = part.get("type")
    if kind == "input_text" and set(part) == {"type", "text"}:
        return {"type": "text", "text": part["text"]}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        image = {"url": part["image_url"], "detail": part.get("detail")}
    elif kind == "image_url" and isinstance(part.get("image_url"), Mapping):
        image = dict(part["image_url"])
    else:
        return part
    if set(part) - {"type", "image_url", "detail"} or set(image) - {"url", "detail"}:
        return part  # fields Grove does not know: kept as sent
    if image.get("detail") in (None, "auto"):
        image.pop("detail", None)
    return {"type": "image_url", "image_url": image}


def _tool_call(index: int, call: Any) -> dict[str, Any]:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise NormalizationError(index, "a tool call must be an object with a function", call)
    call = {k: v for k, v in _without_none(call).items() if k not in _CLIENT_TOOL_CALL_KEYS}
    call["function"] = {k: v for k, v in call["function"].items() if k not in _CLIENT_FUNCTION_KEYS}
    arguments = call["function"].get("arguments")
    if isinstance(arguments, str):
        # Not JSON: kept verbatim, and rendered as the client sent it.
        with contextlib.suppress(json.JSONDecodeError):
            call["function"]["arguments"] = json.loads(arguments)
    return call


def _responses_function_call(index: int, item: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(item.get("name"), str):
        raise NormalizationError(index, "a function_call item needs a name", item.get("name"))
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": item["name"], "arguments": item.get("arguments")},
    }
    if item.get("call_id") is not None:
        call["id"] = item["call_id"]
    return call


def _function_call_output(index: int, item: Mapping[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": _content(index, item.get("output", ""))}
    if item.get("call_id") is not None:
        message["tool_call_id"] = item["call_id"]
    return message


def _reasoning_text(index: int, item: Mapping[str, Any]) -> str:
    """The reasoning content parts joined, else the summary parts joined by blank lines."""
    content = item.get("content") or ()
    summary = item.get("summary") or ()
    for parts, separator in ((content, ""), (summary, "\n\n")):
        if not isinstance(parts, list | tuple) or not all(
            isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in parts
        ):
            raise NormalizationError(index, "reasoning parts must be objects with text", parts)
        if parts:
            return separator.join(p["text"] for p in parts)
    return ""
