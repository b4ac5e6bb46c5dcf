"""The demo's agent takes up a forked conversation (``grove/demo/tool_agent.py``, ``docs/fork.md``).

A scripted engine writes the model's turns. The source rollout asks about the fox (the model
looks it up, then answers) and the sky (it gives up). Each fork opens at one of its calls with
the source's token, and the agent, given ``task["fork"]`` as ``grove train`` gives it, finishes
where the conversation stands: it runs a lookup the source call asked for, or goes on to the
next question, or starts a new context from a summary; its reward counts only its own checks.
"""

from __future__ import annotations

from typing import Any

from grove.demo.agent_corpus import SUMMARY_REQUEST, notes_prompt, question
from grove.demo.tool_agent import play

from .conftest import Gateway
from .test_forks import _fork

TASK = {"questions": ["fox", "sky"], "facts": {"fox": "red", "sky": "blue"}}
LOOKUP_FOX = '<tool_call>{"name": "lookup", "arguments": {"item": "fox"}}</tool_call>'
OPTIONS = {"reject_fraction": 0.0, "max_response_retries": 0, "compact_at_tokens": 10_000}
OPTIONS["max_tokens"] = 30  # the lookup call is 28 tokens; the test gateway's context 256


def _play_source(gateway: Gateway, **options: Any) -> dict[str, Any]:
    gateway.open("src")
    return play(gateway.client("src"), dict(TASK), 0, **{**OPTIONS, **options})


def _play_fork(gateway: Gateway, call_id: str, **options: Any) -> tuple[dict, dict]:
    """Open ``fork`` from the source's ``call_id`` and play it as grove train would: the fork's
    opening answer and the agent's result."""
    opened = _fork(gateway, "fork", "src", call_id)
    assert opened.status_code == 200, opened.text
    source = opened.json()["fork_from"]
    fork = {"capture_key": "src", "call_id": call_id, "messages": source["messages"]}
    fork["cum_len"] = source["source_cum_len"]
    task = {**TASK, "fork": fork}
    return source, play(gateway.client("fork"), task, 1, **{**OPTIONS, **options})


def test_a_fork_of_a_lookup_runs_it_answers_and_goes_on(local_scripted_gateway: Gateway):
    gateway = local_scripted_gateway
    gateway.engine.say(LOOKUP_FOX, "The fox is red.", "I do not know.")
    _play_source(gateway)
    gateway.engine.say("It is red.", "The sky is blue.")
    source, result = _play_fork(gateway, "c0-0")
    history = result["output"]
    assert history[: len(source["messages"])] == source["messages"]
    lookup_id = source["messages"][-1]["tool_calls"][0]["id"]
    assert history[len(source["messages"])] == {
        "role": "tool",
        "tool_call_id": lookup_id,
        "content": "fox: red",
    }
    # fox: looked up (by the source call it continues), answered red; sky: answered blue only
    assert result["reward"] == 0.75
    first = gateway.state("fork").calls["f0-0"]
    assert (first.parent_call_id, first.intended.source_capture_key) == ("c0-0", "src")


def test_a_fork_of_an_answer_asks_the_next_question(local_scripted_gateway: Gateway):
    gateway = local_scripted_gateway
    gateway.engine.say(LOOKUP_FOX, "The fox is red.", "I do not know.")
    _play_source(gateway)
    gateway.engine.say("The sky is blue.")
    source, result = _play_fork(gateway, "c1-0")
    asked = result["output"][len(source["messages"])]
    assert asked == {"role": "user", "content": question("sky")}
    assert result["reward"] == 0.5  # the sky: not looked up, answered blue
    assert [c for c in gateway.state("fork").calls] == ["f0-0"]


def test_a_fork_of_a_summary_starts_a_new_context_from_its_notes(
    local_scripted_gateway: Gateway,
):
    gateway = local_scripted_gateway
    gateway.engine.say("The fox is red.", "fox is red", "I do not know.")
    _play_source(gateway, compact_at_tokens=1, max_compactions=1)
    assert [c for c in gateway.state("src").calls] == ["c0-0", "c1-0", "c2-0"]
    gateway.engine.say("The sky is blue.")
    source, result = _play_fork(gateway, "c1-0", compact_at_tokens=1, max_compactions=1)
    assert source["messages"][-2] == {"role": "user", "content": SUMMARY_REQUEST}
    assert result["output"][len(source["messages"])] == {
        "role": "user",
        "content": notes_prompt("fox is red", "sky"),
    }
    first = gateway.state("fork").calls["f0-0"]
    assert (first.intended.decision, first.intended.root_reason) == ("root", "history_rewritten")
    assert result["reward"] == 0.5


def test_a_forks_returned_history_selects_its_own_calls(local_scripted_gateway: Gateway):
    gateway = local_scripted_gateway
    gateway.engine.say(LOOKUP_FOX, "The fox is red.", "I do not know.")
    _play_source(gateway)
    gateway.engine.say("The fox is red.", "I do not know.")  # the source's very answers
    _, result = _play_fork(gateway, "c0-0")
    answer = gateway.http.post("/v1/attempts/fork/result", json=result)
    assert answer.status_code == 200, answer.text
    assert answer.json()["selection"]["call_ids"] == ["f0-0", "f1-0"]
