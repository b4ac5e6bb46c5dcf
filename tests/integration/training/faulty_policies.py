"""A custom selection policy with a bug, which a training run's configuration names as
``module:function``."""

from __future__ import annotations

from typing import Any


def raise_key_error(records: list[Any], result: dict[str, Any]) -> tuple[list[Any], str | None]:
    """Fail as a policy with a bug does: a ``KeyError`` on a key the result does not hold."""
    return list(records), result["no_such_key"]
