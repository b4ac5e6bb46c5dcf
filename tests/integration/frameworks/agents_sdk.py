"""OpenAI Agents SDK pieces its tests share: the weather tool and the SDK's two OpenAI models
over an ``AsyncOpenAI`` client configured for the gateway (base URL, key, the attempt's header,
model name). Tracing is switched off on import: the SDK exports nothing.
"""

from __future__ import annotations

from typing import Any

from agents import (
    Model,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.gateway import CAPTURE_KEY_HEADER
from tests.integration.gateway.support import MODEL, Gateway

from .weather import WEATHER_IN

set_tracing_disabled(True)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return WEATHER_IN[city]


def client(gateway: Gateway, capture_key: str) -> AsyncOpenAI:
    """An ``AsyncOpenAI`` client for the attempt; close it in the event loop that used it."""
    return AsyncOpenAI(
        base_url=f"{gateway.base_url}/v1",
        api_key="unused",
        default_headers={
            CAPTURE_KEY_HEADER: capture_key,
            ATTEMPT_TOKEN_HEADER: gateway.token(capture_key),
        },
        max_retries=0,
    )


def responses_model(openai_client: AsyncOpenAI) -> Model:
    return OpenAIResponsesModel(model=MODEL, openai_client=openai_client)


def chat_model(openai_client: AsyncOpenAI, *, replay_reasoning: bool = True) -> Model:
    """The chat model; by default it sends reasoning back (``should_replay_reasoning_content``),
    which the SDK otherwise does for DeepSeek models only."""
    options: dict[str, Any] = {}
    if replay_reasoning:
        options["should_replay_reasoning_content"] = lambda context: True
    return OpenAIChatCompletionsModel(model=MODEL, openai_client=openai_client, **options)
