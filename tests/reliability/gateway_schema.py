"""The gateway's OpenAPI schema narrowed to what a harness sends, so that schemathesis's positive
generation mostly reaches the code behind validation instead of the refusals in front of it.

The served schema admits much that the gateway then refuses by rule: any model name (one is
served), any message role last (assistant prefill), any sampling value (the embedded engine samples
the raw distribution: temperature and top_p 1), any text as a capture key. ``narrowed`` keeps each
operation and its parameters and replaces the request bodies with their valid core: the served
model, short lower-case texts (prompts that fit the context), user and system messages (on
``/v1/messages``: user and assistant turns of text or text blocks only, a system text), sampling
the engine honours, a known selection policy, a finite reward. A little stays that the gateway
refuses after validation, as a harness's mistakes would be: an assistant message last (prefill),
a temperature the embedded engine cannot honour exactly. Negative generation still uses the
schema as served.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["narrowed"]

JSON = dict[str, Any]

TEXT: JSON = {"type": "string", "pattern": "^[a-z][a-z ]{0,15}$"}
NAME: JSON = {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,11}$"}


def _nullable(schema: JSON) -> JSON:
    return {"anyOf": [schema, {"type": "null"}]}


def _object(required: list[str], **properties: JSON) -> JSON:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _list(component: str, most: int) -> JSON:
    """A list of one to ``most`` values of schema ``component``."""
    items = {"$ref": f"#/components/schemas/{component}"}
    return {"type": "array", "items": items, "minItems": 1, "maxItems": most}


def _sampling(max_tokens: str) -> dict[str, JSON]:
    return {
        max_tokens: _nullable({"type": "integer", "minimum": 1, "maximum": 8}),
        "temperature": {"enum": [1, None, 0.7]},
        "top_p": {"enum": [1, None]},
        "stream": _nullable({"type": "boolean"}),
    }


def narrowed(served: JSON, model: str) -> JSON:
    """A copy of ``served`` whose request bodies are those a harness of ``model`` sends."""
    schema = copy.deepcopy(served)
    model_name: JSON = {"enum": [model]}
    schema["components"]["schemas"].update(
        ChatMessage=_object(
            ["role", "content"],
            role={"enum": ["system", "user", "assistant"]},
            content=TEXT,
        ),
        ChatCompletionRequest=_object(
            ["model", "messages"],
            model=model_name,
            messages=_list("ChatMessage", 3),
            n={"enum": [1, None]},
            seed=_nullable({"type": "integer", "minimum": 0, "maximum": 2**31}),
            logprobs=_nullable({"type": "boolean"}),
            user=_nullable(TEXT),
            **_sampling("max_tokens"),
        ),
        ResponsesRequest=_object(
            ["model", "input"],
            model=model_name,
            input=TEXT,
            instructions=_nullable(TEXT),
            store=_nullable({"type": "boolean"}),
            **_sampling("max_output_tokens"),
        ),
        MessagesTextBlock=_object(["type", "text"], type={"enum": ["text"]}, text=TEXT),
        MessagesTurn=_object(
            ["role", "content"],
            role={"enum": ["user", "assistant"]},
            content={"anyOf": [TEXT, _list("MessagesTextBlock", 2)]},
        ),
        MessagesRequest=_object(
            ["model", "messages", "max_tokens"],
            model=model_name,
            messages=_list("MessagesTurn", 3),
            system=_nullable(TEXT),
            metadata=_nullable(_object([], user_id=NAME)),
            **{
                **_sampling("max_tokens"),
                "max_tokens": {"type": "integer", "minimum": 1, "maximum": 8},
            },
        ),
        OpenAttemptRequest=_object(
            ["capture_key", "rollout_id", "prompt_group", "rollout_index"],
            capture_key=NAME,
            rollout_id=NAME,
            prompt_group=NAME,
            rollout_index={"type": "integer", "minimum": 0, "maximum": 7},
            policy_version={"type": "integer", "minimum": 0, "maximum": 3},
            forest_mode=_nullable({"type": "boolean"}),
            selection_policy={"enum": ["returned_history", None]},  # all_captured needs forest mode
            seed=_nullable({"type": "integer", "minimum": 0, "maximum": 2**31}),
        ),
        HarnessResult=_object(["reward"], reward={"type": "number", "minimum": -1, "maximum": 1}),
        RejectRequest=_object([], detail=TEXT),
    )
    return schema
