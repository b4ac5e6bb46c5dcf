"""Reading a configuration: a mapping or a YAML/JSON file, refused whole with every problem.

Overrides (``grove serve --port 8001``, ``grove serve --no-forest-training``) are dotted keys
(``engine.port``) set on the parsed data before it is validated, so an overridden value is checked
like one written in the file, and every default still comes from the schema alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from grove.config.schema import GroveConfig
from grove_errors import GroveError

__all__ = ["ConfigurationError", "load_config"]


class ConfigurationError(GroveError, ValueError):
    """The configuration was refused; ``problems`` lists every reason, one line each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        bullets = "\n".join(f"- {problem}" for problem in problems)
        super().__init__(f"Invalid Grove configuration ({source}):\n{bullets}")


def _problem_lines(error: ValidationError) -> list[str]:
    lines: list[str] = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"])
        problems = item.get("ctx", {}).get("problems")
        if problems:
            lines.extend(problems)
        elif item["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key (docs/train.md lists every key)")
        else:
            message = item["msg"].removeprefix("Value error, ")
            lines.append(f"{where}: {message}" if where else message)
    return lines


def _read(path: Path) -> Any:
    label = str(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigurationError(label, [f"cannot read the file: {error}"]) from error
    if path.suffix not in (".yaml", ".yml", ".json"):
        raise ConfigurationError(
            label, [f"unknown file type {path.suffix!r}: use .yaml, .yml or .json"]
        )
    try:
        data = yaml.safe_load(text) if path.suffix != ".json" else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as error:
        raise ConfigurationError(label, [f"cannot parse the file: {error}"]) from error
    return {} if data is None else data


def _overridden(data: Mapping[str, Any], overrides: Mapping[str, Any], label: str) -> dict:
    """``data`` with each dotted key of ``overrides`` set (sections created as needed)."""
    merged: dict[str, Any] = dict(data)
    for path, value in overrides.items():
        *sections, name = path.split(".")
        level = merged
        for section in sections:
            inner = level.get(section)
            if inner is None:
                inner = {}
            elif not isinstance(inner, Mapping):
                raise ConfigurationError(label, [f"{section}: must be a mapping, to set {path}"])
            level[section] = inner = dict(inner)
            level = inner
        level[name] = value
    return merged


def load_config(
    source: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> GroveConfig:
    """Parse a configuration from a mapping, or a ``.yaml``/``.yml``/``.json`` file; ``None`` gives
    the defaults. ``overrides`` maps dotted keys (``engine.port``) to values that replace the
    source's before validation. Relative paths, overrides' too, are taken from the file's directory
    (from the current directory for a mapping; the command line makes the paths it is given
    absolute first). Raises
    ``ConfigurationError`` listing every problem."""
    base_dir = Path.cwd()
    if source is None:
        data: Any = {}
        label = "defaults"
    elif isinstance(source, Mapping):
        data, label = source, "mapping"
    else:
        path = Path(source)
        data, label, base_dir = _read(path), str(path), path.resolve().parent
    if not isinstance(data, Mapping):
        raise ConfigurationError(
            label, [f"the top level must be a mapping, got {type(data).__name__}"]
        )
    if overrides:
        data = _overridden(data, overrides, label)
        label += " with the command line's overrides"
    try:
        return GroveConfig.model_validate(dict(data), context={"base_dir": str(base_dir)})
    except ValidationError as error:
        raise ConfigurationError(label, _problem_lines(error)) from error
