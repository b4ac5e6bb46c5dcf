"""Request conversion: a Chat Completions or Responses body turned into one model call.

Pure apart from tokenizing stop strings: every refusal that depends only on the request is raised
here (``grove.capture.refusals.Refused``), before the lifecycle sees the call, so a refused request
writes nothing (``docs/gateway.md``, "Refusals").

Tools. Function tools of either API become one form, ``{"type": "function", "function":
{"name", "description", "parameters", "strict", ...}}`` (``None`` values dropped), so the same
tools render and digest alike on both endpoints; any other tool type is refused. ``tool_choice``
``auto`` (or none given) renders the tools and parses tool calls from the generation; ``none``
renders no tools and parses none (the prompt is the one the model would see without tools, and
the answer can hold no call); ``required`` and a named function render the tools and force a
call by grammar. Structured output (``response_format``, the Responses ``text.format``) and a
forced tool choice become the sampling's output constraint (``capture/constraints.py``), which
the engine decodes under. ``parallel_tool_calls`` is enforced under a constraint only; otherwise
every call the model wrote is returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from grove.capture.chat_api import ChatCompletionRequest
from grove.capture.constraints import (
    ContentSpec,
    chat_content_spec,
    output_constraint,
    responses_content_spec,
)
from grove.capture.engine import OutputConstraint, SamplingParams
from grove.capture.lifecycle import ModelCall
from grove.capture.messages_api import (
    MessagesRequest,
    messages_items,
    messages_tool_choice,
    messages_tools,
)
from grove.capture.refusals import Refused
from grove.capture.render import Renderer, RenderOptions
from grove.capture.responses_api import LOGPROBS_INCLUDE, ResponsesRequest

__all__ = ["ConvertedCall", "RequestConverter", "chat_tools", "responses_tools", "tool_choice"]

_FUNCTION_KEYS: Final = ("name", "description", "parameters", "strict")


@dataclass(frozen=True)
class ConvertedCall:
    """A request converted for the lifecycle: the model call, whether max tokens was given, and
    whether the answer carries logprobs (chat ``logprobs``, or the Responses logprobs include)."""

    call: ModelCall
    explicit_max_tokens: bool
    logprobs: bool = False


class RequestConverter:
    """Converts request bodies for one served model (its name, default max tokens, tokenizer)."""

    def __init__(self, model_name: str, default_max_tokens: int, renderer: Renderer) -> None:
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self.renderer = renderer

    def chat_call(self, request: ChatCompletionRequest, call_id: str | None) -> ConvertedCall:
        """The model call a Chat Completions request asks for; refusals raised here."""
        self._check_model(request.model)
        if request.n is not None and request.n != 1:
            raise Refused(
                400,
                "unsupported_n",
                f"n must be 1, got {request.n}: each choice is its own model call; send "
                "separate requests",
                "n",
            )
        _check_top_logprobs(request.top_logprobs)
        max_tokens = request.max_tokens
        if request.max_completion_tokens is not None:
            if max_tokens is not None and max_tokens != request.max_completion_tokens:
                raise Refused(
                    400,
                    "conflicting_max_tokens",
                    f"max_tokens ({max_tokens}) and max_completion_tokens "
                    f"({request.max_completion_tokens}) disagree; send one of them",
                    "max_completion_tokens",
                )
            max_tokens = request.max_completion_tokens
        options, constraint = self._shape(
            chat_tools(request.tools),
            request.tool_choice,
            request.parallel_tool_calls,
            request.reasoning_effort,
            chat_content_spec(request.response_format),
            "response_format",
        )
        items = [message.model_dump(exclude_unset=True) for message in request.messages]
        sampling = self._sampling(
            max_tokens, request.temperature, request.top_p, request.seed, request.stop, constraint
        )
        return ConvertedCall(
            ModelCall(items, options, sampling, call_id),
            max_tokens is not None,
            logprobs=bool(request.logprobs),
        )

    def responses_call(self, request: ResponsesRequest, call_id: str | None) -> ConvertedCall:
        """The model call a Responses request asks for; refusals raised here."""
        self._check_model(request.model)
        if request.previous_response_id is not None or request.conversation is not None:
            param = "previous_response_id" if request.previous_response_id else "conversation"
            raise Refused(
                400,
                "unsupported_provider_state",
                f"{param} is not supported: Grove keeps no provider-managed conversation state; "
                "send the whole input (earlier output items included) with every request",
                param,
            )
        if request.background:
            raise Refused(
                400,
                "unsupported_background",
                "background responses are not supported: each call is answered when captured",
                "background",
            )
        if request.truncation == "auto":
            raise Refused(
                400,
                "unsupported_truncation",
                "truncation='auto' is not supported: prompts are never truncated; shorten the "
                "input yourself (measure it with POST /v1/attempts/{capture_key}/measure)",
                "truncation",
            )
        _check_top_logprobs(request.top_logprobs)
        include = request.include or []
        unsupported = [value for value in include if value != LOGPROBS_INCLUDE]
        if unsupported:
            raise Refused(
                400,
                "unsupported_include",
                f"include {unsupported[0]!r} cannot be provided: Grove runs no hosted tools and "
                f"keeps no encrypted reasoning; the one value it can include is "
                f"{LOGPROBS_INCLUDE!r} (send include=[] or leave it out)",
                "include",
            )
        items: list[dict[str, Any]] = []
        if request.instructions is not None:
            items.append({"role": "system", "content": request.instructions})
        if isinstance(request.input, str):
            items.append({"role": "user", "content": request.input})
        else:
            items.extend(request.input)
        effort = (request.reasoning or {}).get("effort")
        options, constraint = self._shape(
            responses_tools(request.tools),
            request.tool_choice,
            request.parallel_tool_calls,
            effort if isinstance(effort, str) else None,
            responses_content_spec(request.text),
            "text",
        )
        sampling = self._sampling(
            request.max_output_tokens, request.temperature, request.top_p, None, None, constraint
        )
        return ConvertedCall(
            ModelCall(items, options, sampling, call_id),
            request.max_output_tokens is not None,
            logprobs=LOGPROBS_INCLUDE in include,
        )

    def messages_call(self, request: MessagesRequest, call_id: str | None) -> ConvertedCall:
        """The model call an Anthropic Messages request asks for (``capture/messages_api.py``
        maps its blocks onto Chat messages); refusals raised here."""
        self._check_model(request.model)
        choice, parallel = messages_tool_choice(request.tool_choice)
        options, constraint = self._shape(
            chat_tools(messages_tools(request.tools)), choice, parallel, None, None, "tool_choice"
        )
        thinking = self._thinking_kwargs(request.thinking, request.max_tokens, options)
        if thinking:
            options = replace(options, template_kwargs={**options.template_kwargs, **thinking})
        sampling = self._sampling(
            request.max_tokens,
            request.temperature,
            request.top_p,
            None,
            request.stop_sequences,
            constraint,
        )
        if request.top_k:
            sampling = replace(sampling, top_k=request.top_k)
        return ConvertedCall(ModelCall(messages_items(request), options, sampling, call_id), True)

    def _thinking_kwargs(
        self, thinking: Mapping[str, Any] | None, max_tokens: int, options: RenderOptions
    ) -> dict[str, bool]:
        """The template switch a Messages ``thinking`` sets: ``enable_thinking`` where the chat
        template has it; enabled thinking on a template without it is refused."""
        if thinking is None:
            return {}
        kind, budget = thinking.get("type"), thinking.get("budget_tokens")
        switch = "enable_thinking" in self.renderer.chat_template(options)
        if kind == "disabled" and set(thinking) == {"type"}:
            return {"enable_thinking": False} if switch else {}
        if kind != "enabled" or set(thinking) - {"type", "budget_tokens"}:
            raise Refused(
                400,
                "invalid_request",
                "thinking must be {'type': 'enabled', 'budget_tokens': N} or {'type': "
                f"'disabled'}}, got {dict(thinking)!r}",
                "thinking",
            )
        if not isinstance(budget, int) or isinstance(budget, bool) or not 0 < budget < max_tokens:
            raise Refused(
                400,
                "invalid_request",
                f"thinking.budget_tokens must be an integer from 1 to max_tokens - 1 "
                f"({max_tokens - 1}), got {budget!r}: max_tokens bounds the whole generation, "
                "thinking included",
                "thinking",
            )
        if not switch:
            raise Refused(
                400,
                "unsupported_thinking",
                f"thinking cannot be enabled: the chat template of {self.model_name!r} has no "
                "enable_thinking switch; leave thinking out",
                "thinking",
            )
        return {"enable_thinking": True}

    def _shape(
        self,
        tools: tuple[dict[str, Any], ...] | None,
        choice: str | Mapping[str, Any] | None,
        parallel_tool_calls: bool | None,
        reasoning_effort: str | None,
        content: ContentSpec | None,
        content_param: str,
    ) -> tuple[RenderOptions, OutputConstraint | None]:
        """The render options and the output constraint of a request, either API."""
        constraint = output_constraint(
            content, tools, choice, parallel_tool_calls, content_param=content_param
        )
        options = RenderOptions(
            model=self.model_name,
            tools=tool_choice(tools, choice),
            tool_choice=choice,
            reasoning_effort=reasoning_effort,
        )
        return options, constraint

    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise Refused(
                404,
                "model_not_found",
                f"The model {model!r} is not served here; this gateway serves {self.model_name!r}",
                "model",
            )

    def _sampling(
        self,
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        seed: int | None,
        stop: str | list[str] | None,
        constraint: OutputConstraint | None,
    ) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.default_max_tokens if max_tokens is None else max_tokens,
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            seed=seed,
            stop_token_ids=self._stop_token_ids(stop),
            constraint=constraint,
        )

    def _stop_token_ids(self, stop: str | list[str] | None) -> tuple[int, ...]:
        """Stop strings as token ids: each must be exactly one token of the vocabulary."""
        texts = [stop] if isinstance(stop, str) else (stop or [])
        ids = []
        for text in texts:
            tokens = self.renderer.encode(text)
            if len(tokens) != 1:
                raise Refused(
                    400,
                    "unsupported_stop",
                    f"Each stop string must be one token of the model's vocabulary (Grove stops "
                    f"on token ids, never on text): {text!r} is {len(tokens)} tokens",
                    "stop",
                )
            ids.append(tokens[0])
        return tuple(ids)


def chat_tools(tools: Sequence[Mapping[str, Any]] | None) -> tuple[dict[str, Any], ...] | None:
    """Chat Completions tools in Grove's one form; a tool other than a function is refused."""
    if tools is None:
        return None
    converted = []
    for index, tool in enumerate(tools):
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, Mapping):
            raise _unsupported_tool(index, tool)
        converted.append(_function_tool(index, function))
    return tuple(converted)


def responses_tools(
    tools: Sequence[Mapping[str, Any]] | None,
) -> tuple[dict[str, Any], ...] | None:
    """Responses tools (``{"type": "function", "name", ...}``) in Grove's one form; hosted
    tools (web search, file search, computer use, ...) are refused."""
    if tools is None:
        return None
    converted = []
    for index, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise _unsupported_tool(index, tool)
        converted.append(_function_tool(index, {k: v for k, v in tool.items() if k != "type"}))
    return tuple(converted)


def tool_choice(
    tools: tuple[dict[str, Any], ...] | None, choice: str | Mapping[str, Any] | None
) -> tuple[dict[str, Any], ...] | None:
    """The tools the template renders under ``choice`` (None: no tools, and no tool calls are
    parsed): all of them, unless ``choice`` is ``none``. Whether a call is forced is the output
    constraint's business (``capture/constraints.py``), which refuses a choice it cannot honour."""
    if choice == "none":
        return None
    return tools or None


def _function_tool(index: int, function: Mapping[str, Any]) -> dict[str, Any]:
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise Refused(
            400,
            "invalid_tools",
            f"tools[{index}] needs a function name (a non-empty string), got {name!r}",
            "tools",
        )
    ordered = [k for k in _FUNCTION_KEYS if k in function]
    ordered += sorted(k for k in function if k not in _FUNCTION_KEYS)
    body = {k: function[k] for k in ordered if function[k] is not None}
    return {"type": "function", "function": body}


def _unsupported_tool(index: int, tool: Mapping[str, Any]) -> Refused:
    return Refused(
        400,
        "unsupported_tool",
        f"tools[{index}] has type {tool.get('type')!r}: Grove serves function tools only (the "
        "model writes the call, the harness runs it); hosted tools are not available",
        "tools",
    )


def _check_top_logprobs(top_logprobs: int | None) -> None:
    if top_logprobs:
        raise Refused(
            400,
            "unsupported_top_logprobs",
            f"top_logprobs must be 0 or absent, got {top_logprobs}: the engine reports the "
            "sampled token's logprob only (logprobs=true)",
            "top_logprobs",
        )
