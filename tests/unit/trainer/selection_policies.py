"""Custom selection policies that configuration tests name as ``module:function``."""

from __future__ import annotations

from typing import Any

NOT_A_FUNCTION = 42


def select_all(records: list[Any], result: dict[str, Any]) -> tuple[list[Any], str | None]:
    """Select every record; the terminal is the last record's response."""
    return list(records), records[-1].response_id if records else None
