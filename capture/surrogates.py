"""Lone UTF-16 surrogates: finding one anywhere in a parsed request body, which the gateway refuses.

JSON may spell a surrogate half alone (``"\\ud800"``); Python's parser then yields a ``str``
holding it, which cannot be encoded as UTF-8. Such a string cannot be tokenized, stored in the
ledger (PostgreSQL's JSONB refuses it, and no payload with one serializes) or answered. The gateway
therefore checks each parsed body once, before its fields are validated and before anything is
written (``capture/wire.py``: every request model runs :func:`lone_surrogate_at`), and answers 400.

The walk is iterative (an explicit stack, never recursion), over dict keys, dict values and list
items, in constant space per node (a node keeps a link to its parent, not its path). A string is
checked only when it is not ASCII (``str.isascii`` is a fast scan), by encoding it. Pairs of
surrogates in JSON (``"\\ud83d\\ude00"``) are decoded by the parser into one character and pass.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["MAX_PATH_CHARS", "lone_surrogate_at"]

MAX_PATH_CHARS: Final = 200
"""The longest path a refusal names (a hostile body may nest deeply, with long keys)."""


def lone_surrogate_at(value: Any) -> str | None:
    """The dotted path (``messages.0.content``; ``""`` for ``value`` itself) of a string
    in the parsed JSON ``value`` that holds a lone surrogate, or None when there is none. A path
    longer than :data:`MAX_PATH_CHARS` keeps its last characters, after ``...``."""
    stack: list[tuple[_Link, Any]] = [(None, value)]
    while stack:
        link, item = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return _path(link)
        elif isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(key, str) and not _encodable(key):
                    return _path(link)
                stack.append(((link, str(key)), inner))
        elif isinstance(item, list):
            stack.extend(((link, str(index)), inner) for index, inner in enumerate(item))
    return None


_Link = tuple[Any, str] | None
"""A node's place: ``(parent's link, key or index)``, None at the top. Built per node in constant
space; the dotted path is spelled out only for the node that is reported."""


def _path(link: _Link) -> str:
    parts: list[str] = []
    size = 0
    while link is not None and size <= MAX_PATH_CHARS:
        link, part = link
        parts.append(part)
        size += len(part) + 1
    path = ".".join(reversed(parts))
    if link is not None or len(path) > MAX_PATH_CHARS:
        return "..." + path[-MAX_PATH_CHARS:]
    return path


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
