"""A custom selection policy with a bug, which a training run's configuration names as
``module:function``."""

from __future__ import annotations

from typing import Any


def misparse(records: list[Any], result: dict[str, Any]) -> tuple[list[Any], str | None]:
    """Fail as a policy with a bug does, with a ``ValueError`` (the class a result refusal has
    too): it parses a number out of text that holds none."""
    return list(records)[: int(result.get("keep", "no_such_number"))], None


def refuse_every_result(records: list[Any], result: dict[str, Any]) -> tuple[list[Any], str | None]:
    """Refuse the result as a policy may on purpose: a ``SelectionError`` (the client's to fix)."""
    from grove.training.errors import SelectionError

    raise SelectionError("invalid_result", "this policy selects nothing from any result")
