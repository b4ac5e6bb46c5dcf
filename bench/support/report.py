"""How a bench prints its figures."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["print_figures"]


def print_figures(figures: Mapping[str, Any], *, as_json: bool) -> None:
    """One JSON object with ``as_json``, else one ``name value`` line per figure."""
    if as_json:
        print(json.dumps(figures))
        return
    for name, value in figures.items():
        print(f"{name:32} {value}")
