"""Structured output from each framework is refused, with the reason, and writes nothing.

Every framework's structured output asks for decoding constrained to a JSON schema: the
official client's ``parse``, LangChain's ``with_structured_output`` (``response_format``; or, with
``method="function_calling"``, a forced tool choice) and an Agents SDK agent's ``output_type``
(the Responses ``text`` format, or ``response_format`` on its chat model). Grove's engines sample
freely and cannot constrain, and Grove never passes free text off as constrained output, so each
is a 400 whose message says why (``capture.refusals.REFUSED_FIELD_REASONS``,
``docs/gateway.md``, "Agent frameworks"), raised before anything is recorded.
"""

from __future__ import annotations

import asyncio

import openai
import pytest
from agents import Agent, Runner
from langchain_core.messages import HumanMessage
from pydantic import BaseModel

from tests.integration.gateway.support import MODEL, Gateway

from .agents_sdk import chat_model as agents_chat_model
from .agents_sdk import client, responses_model
from .attempts import open_attempt
from .langchain_agent import chat_model

GRAMMAR = "needs decoding constrained to a schema"


class Weather(BaseModel):
    city: str
    degrees: int


def refused(gateway: Gateway, run) -> openai.BadRequestError:
    """The refusal ``run(capture_key)`` meets; the ledger and blob store are unchanged."""
    key = open_attempt(gateway, "structured")
    written = gateway.written()
    with pytest.raises(openai.BadRequestError) as refusal:
        run(key)
    assert gateway.written() == written
    return refusal.value


def test_the_official_clients_parse_is_refused_for_its_response_format(gateway: Gateway):
    def run(key: str) -> None:
        with gateway.client(key) as official:
            official.chat.completions.parse(
                model=MODEL,
                messages=[{"role": "user", "content": "Paris?"}],
                response_format=Weather,
            )

    error = refused(gateway, run)
    assert (error.code, error.param) == ("invalid_request", "response_format")
    assert GRAMMAR in error.message


def test_langchain_with_structured_output_is_refused_for_its_response_format(gateway: Gateway):
    def run(key: str) -> None:
        chat_model(gateway, key).with_structured_output(Weather).invoke([HumanMessage("Paris?")])

    error = refused(gateway, run)
    assert (error.code, error.param) == ("invalid_request", "response_format")
    assert GRAMMAR in error.message


def test_langchain_structured_output_by_function_calling_is_refused_for_forcing_the_tool(
    gateway: Gateway,
):
    def run(key: str) -> None:
        structured = chat_model(gateway, key).with_structured_output(
            Weather, method="function_calling"
        )
        structured.invoke([HumanMessage("Paris?")])

    error = refused(gateway, run)
    assert error.code == "unsupported_tool_choice"


@pytest.mark.parametrize(
    ("model", "field"),
    [(responses_model, "text"), (agents_chat_model, "response_format")],
    ids=["responses", "chat"],
)
def test_an_agents_sdk_output_type_is_refused_for_its_format(gateway: Gateway, model, field):
    async def run_agent(key: str) -> None:
        async with client(gateway, key) as openai_client:
            agent = Agent(name="weather", output_type=Weather, model=model(openai_client))
            await Runner.run(agent, "Paris?")

    def run(key: str) -> None:
        asyncio.run(run_agent(key))

    error = refused(gateway, run)
    assert (error.code, error.param) == ("invalid_request", field)
    assert GRAMMAR in error.message
