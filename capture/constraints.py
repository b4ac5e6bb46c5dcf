"""Structured output requests: ``response_format``, ``text.format`` and ``tool_choice`` as one
``grove.capture.engine.OutputConstraint`` (``docs/gateway.md``, "Structured output").

Pure: request fields in, a constraint (or None: free sampling) out, every malformed or unsupported
value refused here (``grove.capture.refusals.Refused``), before anything is recorded.

1. **The content format.** Chat's ``response_format`` and the Responses ``text.format`` (the
   same object, flat): ``text`` (or none) leaves the content free; ``json_object`` makes it a JSON
   object; ``json_schema`` makes it JSON matching ``schema`` (an object), whatever ``strict``
   says; ``name``, ``strict`` and ``description`` are accepted, and the first two recorded. Other
   types are refused (``unsupported_response_format``), as is the Responses ``text.verbosity``.
2. **Tool choice**, over the function tools of the request: ``auto`` (or none) lets a constrained
   answer call a tool instead (content, or tool calls and nothing else); ``none`` does not;
   ``required`` forces one or more calls of any offered tool, a named function one or more calls
   of that tool, with no content, whatever the content format says (there is no content to
   format). ``parallel_tool_calls: false`` allows a single call.
3. **No constraint** when the content is free and no call is forced: the engine samples as usual.

A schema the grammar cannot enforce is refused (``unsupported_schema``, the keyword named), and
so is a ``$ref`` outside the schema (``http://``, ``file://``, anything not starting with ``#``).
The size of every schema is bounded before it gets here (``capture/limits.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from grove.capture.engine import ContentFormat, FunctionSchema, OutputConstraint
from grove.capture.grammar import GrammarError, grammar_text
from grove.capture.refusals import Refused

__all__ = ["ContentSpec", "chat_content_spec", "output_constraint", "responses_content_spec"]

_FORMAT_TYPES: Final = ("text", "json_object", "json_schema")
_SCHEMA_KEYS: Final = frozenset({"type", "name", "schema", "strict", "description"})

ContentSpec = tuple[ContentFormat, Mapping[str, Any] | None, str | None, bool | None]
"""A content format as parsed: (format, schema, name, strict); schema, name and strict only for
``json_schema``."""


def chat_content_spec(response_format: Mapping[str, Any] | None) -> ContentSpec | None:
    """Chat's ``response_format`` (``{"type": "json_schema", "json_schema": {...}}``) parsed;
    None when the content is free."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind != "json_schema":
        return _content_spec(response_format, "response_format")
    inner = response_format.get("json_schema")
    if not isinstance(inner, Mapping) or set(response_format) - {"type", "json_schema"}:
        raise _invalid(
            "response_format",
            "a json_schema response_format has type and json_schema (an object with schema, "
            f"and optionally name, strict, description); got keys {sorted(response_format)}",
        )
    return _content_spec({"type": kind, **inner}, "response_format")


def responses_content_spec(text: Mapping[str, Any] | None) -> ContentSpec | None:
    """The Responses ``text`` (``{"format": {...}}``) parsed; None when the content is free.
    ``verbosity`` is refused: it asks OpenAI's models to write more or less, which Grove cannot
    ask of a model."""
    if text is None:
        return None
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise _invalid("text", f"text holds format (and verbosity) only, got {unknown}")
    if text.get("verbosity") is not None:
        raise Refused(
            400,
            "unsupported_verbosity",
            f"text.verbosity {text['verbosity']!r} is not supported: it is a hint to OpenAI's "
            "models, and Grove samples the served model as it is; leave it out",
            "text",
        )
    spec = text.get("format")
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise _invalid("text", f"text.format is an object with a type, got {spec!r}")
    return _content_spec(spec, "text")


def output_constraint(
    content: ContentSpec | None,
    tools: Sequence[Mapping[str, Any]] | None,
    choice: str | Mapping[str, Any] | None,
    parallel_tool_calls: bool | None,
    *,
    content_param: str,
) -> OutputConstraint | None:
    """The constraint of a request (module docstring); ``tools`` are the request's tools in
    Grove's one form (``grove.capture.conversion.chat_tools``); ``content_param`` names the field
    the content format came from, for refusals."""
    parallel = parallel_tool_calls is not False
    forced = _forced_tools(tools or (), choice)
    if forced:
        constraint = OutputConstraint(
            tools=forced, tool_calls="required", parallel_tool_calls=parallel
        )
    elif content is None:
        return None
    else:
        kind, schema, name, strict = content
        callable_tools = _functions(tools or ()) if choice in (None, "auto") else ()
        constraint = OutputConstraint(
            content=kind,
            schema=schema,
            name=name,
            strict=strict,
            tools=callable_tools,
            tool_calls="auto" if callable_tools else "none",
            parallel_tool_calls=parallel,
        )
    try:
        grammar_text(constraint)
    except GrammarError as error:
        param = "tools" if error.where.startswith("tools") else content_param
        raise Refused(400, "unsupported_schema", f"{error}; change the schema", param) from None
    return constraint


def _content_spec(spec: Mapping[str, Any], param: str) -> ContentSpec | None:
    kind = spec.get("type")
    if kind not in _FORMAT_TYPES:
        raise Refused(
            400,
            "unsupported_response_format",
            f"{param} type {kind!r} is not supported: Grove constrains the answer to "
            f"{list(_FORMAT_TYPES)} only",
            param,
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return ("json_object", None, None, None)
    unknown = sorted(set(spec) - _SCHEMA_KEYS)
    schema, name, strict = spec.get("schema"), spec.get("name"), spec.get("strict")
    if unknown or not isinstance(schema, Mapping):
        raise _invalid(
            param,
            "a json_schema format needs 'schema', a JSON schema object (and may have 'name', "
            f"'strict', 'description'); got schema {schema!r}"
            + (f" and unknown keys {unknown}" if unknown else ""),
        )
    if name is not None and not isinstance(name, str):
        raise _invalid(param, f"the json_schema name is a string, got {name!r}")
    if strict is not None and not isinstance(strict, bool):
        raise _invalid(param, f"the json_schema strict flag is a boolean, got {strict!r}")
    return ("json_schema", schema, name, strict)


def _forced_tools(
    tools: Sequence[Mapping[str, Any]], choice: str | Mapping[str, Any] | None
) -> tuple[FunctionSchema, ...]:
    """The tools a ``tool_choice`` forces a call of (none for ``auto`` and ``none``)."""
    if choice is None or choice in ("auto", "none"):
        return ()
    functions = _functions(tools)
    if choice == "required":
        if not functions:
            raise _invalid_choice("tool_choice 'required' needs tools: send the tools to call")
        return functions
    name = _named_function(choice)
    chosen = tuple(function for function in functions if function.name == name)
    if not chosen:
        offered = [function.name for function in functions]
        raise _invalid_choice(
            f"tool_choice names function {name!r}, which is not among the tools {offered}"
        )
    return chosen


def _named_function(choice: str | Mapping[str, Any]) -> str:
    """The function a named ``tool_choice`` picks: chat's ``{"type": "function", "function":
    {"name"}}`` or the Responses ``{"type": "function", "name"}``; other choices are refused."""
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        inner = choice.get("function")
        name = inner.get("name") if isinstance(inner, Mapping) else choice.get("name")
        if isinstance(name, str) and name:
            return name
    shown = choice if isinstance(choice, str) else dict(choice)
    raise Refused(
        400,
        "unsupported_tool_choice",
        f"tool_choice {shown!r} is not supported: send 'auto', 'none', 'required' or a "
        "function by name ({'type': 'function', 'function': {'name': ...}} on chat, "
        "{'type': 'function', 'name': ...} on responses)",
        "tool_choice",
    )


def _functions(tools: Sequence[Mapping[str, Any]]) -> tuple[FunctionSchema, ...]:
    """The request's function tools (Grove's one form) with their argument schemas."""
    functions = []
    for index, tool in enumerate(tools):
        function = tool["function"]
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise Refused(
                400,
                "invalid_tools",
                f"tools[{index}] parameters must be a JSON schema object, got {parameters!r}",
                "tools",
            )
        functions.append(FunctionSchema(function["name"], parameters))
    return tuple(functions)


def _invalid(param: str, rule: str) -> Refused:
    return Refused(400, "invalid_response_format", f"Invalid {param}: {rule}", param)


def _invalid_choice(rule: str) -> Refused:
    return Refused(400, "invalid_tool_choice", rule, "tool_choice")
