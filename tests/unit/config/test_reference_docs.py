"""``docs/train.md``'s configuration reference lists every key, once, with its default."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from grove.config import config_field_paths, load_config

TRAIN_DOCS = Path(__file__).resolve().parents[3] / "docs" / "train.md"
ROW = re.compile(r"^\| `(?P<key>[a-z_.]+)` \| `(?P<default>[^`]*)` \|", re.MULTILINE)


def _reference() -> str:
    text = TRAIN_DOCS.read_text()
    return text[text.index("## Configuration reference") :]


def _shown(value: Any) -> str:
    """A default as the reference writes it: strings bare, everything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def test_reference_lists_every_key_once_with_its_default() -> None:
    defaults = load_config()
    rows = [(m["key"], m["default"]) for m in ROW.finditer(_reference())]
    keys = [key for key, _ in rows]

    assert sorted(keys) == sorted(config_field_paths())  # every key, none twice, none stale
    for key, default in rows:
        value = functools.reduce(getattr, key.split("."), defaults)
        assert default == _shown(value), f"{key}: the reference says {default!r}"
