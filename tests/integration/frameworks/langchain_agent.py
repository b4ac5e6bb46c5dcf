"""LangChain pieces the LangChain and LangGraph tests share: the weather tool and a
``ChatOpenAI`` configured for the gateway (base URL, key, the attempt's header, model name).

The scripted model's tool calls (``PARIS_CALL``, ``ROME_CALL``) are written in the embedded chat
template's markup, name first, as models write them.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.gateway import CAPTURE_KEY_HEADER
from tests.integration.gateway.support import MODEL, Gateway

from .weather import WEATHER_IN

SYSTEM = SystemMessage("You answer questions about the weather.")
PARIS_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
ROME_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return WEATHER_IN[city]


def chat_model(gateway: Gateway, capture_key: str, **options: Any) -> ChatOpenAI:
    """``ChatOpenAI`` configured for the gateway: base URL, key, the attempt's header, model."""
    return ChatOpenAI(
        base_url=f"{gateway.base_url}/v1",
        api_key="unused",
        model=MODEL,
        default_headers={
            CAPTURE_KEY_HEADER: capture_key,
            ATTEMPT_TOKEN_HEADER: gateway.token(capture_key),
        },
        max_retries=0,
        **options,
    )
