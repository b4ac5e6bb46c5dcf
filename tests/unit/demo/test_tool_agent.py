"""The demo agent's tool and verifiers (``grove/demo/tool_agent.py``): plain functions of the
task."""

from __future__ import annotations

import pytest

from grove.demo.agent_corpus import lookup_result
from grove.demo.tool_agent import kept_facts, lookup, names_colour, requested_item

FACTS = {"fox": "red", "sky": "blue"}


def test_lookup_answers_an_items_colour_as_the_warm_start_corpus_writes_it() -> None:
    assert lookup(FACTS, "lookup", '{"item": "fox"}') == lookup_result("fox", "red") == "fox: red"


def test_lookup_of_an_item_outside_the_table_answers_unknown() -> None:
    assert lookup(FACTS, "lookup", '{"item": "owl"}') == "owl: unknown"


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("search", '{"item": "fox"}'),
        ("lookup", "not json"),
        ("lookup", '{"item": 3}'),
        ("lookup", "[]"),
    ],
)
def test_a_call_of_another_tool_or_with_bad_arguments_is_answered_so(
    name: str, arguments: str
) -> None:
    assert requested_item(name, arguments) is None
    assert lookup(FACTS, name, arguments) == f"no such call: {name} with {arguments}"


def test_an_answer_scores_when_the_colour_is_one_of_its_words() -> None:
    assert names_colour("The fox is Red.", "red")
    assert not names_colour("The fox is reddish.", "red")
    assert not names_colour("", "red")


def test_a_summary_scores_the_share_of_facts_it_keeps() -> None:
    facts = [("fox", "red"), ("sky", "blue")]

    assert kept_facts("The fox is red. The sky is blue.", facts) == 1.0
    assert kept_facts("The fox is red. The sky is grey.", facts) == 0.5
    assert kept_facts("anything", []) == 1.0
