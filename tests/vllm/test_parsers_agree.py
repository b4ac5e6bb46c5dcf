"""Grove's parser of generated markup against vLLM's own ``hermes`` tool-call parser and its
``qwen3`` and ``deepseek_r1`` reasoning parsers, on the tokens of the served model.

Grove parses every generation itself, on both engines (``capture/toolcalls.py``; vLLM is asked for
token ids through its completions endpoint, where its chat parsers never run). These tests show
where the two agree — well-formed tool calls and closed reasoning, and the markup's token ids — and
pin the departures ``docs/engines.md`` ("Tool calls and reasoning") states, so a vLLM upgrade that
changes them is noticed. Run by ``make test-vllm``; the probe runs in ``.venv-vllm``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest

from grove.capture.embedded import build_tokenizer
from grove.capture.toolcalls import parse_output
from tests.vllm.server import VENV

pytestmark = pytest.mark.vllm

PROBE: Final = Path(__file__).with_name("parser_probe.py")
CALL: Final = '<tool_call>{"name": "lookup", "arguments": {"key": "caf\u00e9", "n": 2}}</tool_call>'
SECOND: Final = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
TEXTS: Final = {
    "call": CALL,
    "content_then_calls": f"Let me check.\n{CALL}\n{SECOND}",
    "closed_reasoning": "<think>look it up first</think>The answer is 4.",
    "plain": "The answer is 4.",
    "text_after_call": f"{CALL} and then some words",
    "unclosed_call": '<tool_call>{"name": "lookup", "arguments": {}}',
    "bad_json": "<tool_call>{name: lookup}</tool_call>",
}
MARKUP: Final = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>")


@pytest.fixture(scope="module")
def vllm_view(tiny_model_dir: Path) -> dict[str, Any]:
    """What vLLM's parsers and tokenizer make of ``TEXTS`` and ``MARKUP`` (one probe run)."""
    tokenizer = build_tokenizer()
    request = {
        "texts": list(TEXTS.values()),
        "markup": list(MARKUP),
        "token_ids": [tokenizer.encode(text, add_special_tokens=False) for text in TEXTS.values()],
    }
    done = subprocess.run(
        [str(VENV / "bin" / "python"), str(PROBE), str(tiny_model_dir)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    answer = json.loads(done.stdout)
    answer["parsed"] = dict(zip(TEXTS, answer["parsed"], strict=True))
    return answer


def _grove_calls(text: str) -> list[dict[str, Any]]:
    parsed = parse_output(text, tool_calls=True)
    return [{"name": c.name, "arguments": json.loads(c.arguments)} for c in parsed.tool_calls]


def test_markup_is_one_token_each_with_the_same_id_in_vllms_tokenizer(
    vllm_view: dict[str, Any],
) -> None:
    tokenizer = build_tokenizer()
    grove = {text: tokenizer.encode(text, add_special_tokens=False) for text in MARKUP}
    assert vllm_view["markup"] == grove
    assert all(len(ids) == 1 for ids in grove.values())


def test_vllms_tokenizer_decodes_groves_tokens_to_the_same_text(
    vllm_view: dict[str, Any],
) -> None:
    assert vllm_view["decoded"] == list(TEXTS.values())


@pytest.mark.parametrize("name", ["call", "content_then_calls", "bad_json"])
def test_hermes_finds_the_tool_calls_and_content_grove_finds(
    vllm_view: dict[str, Any], name: str
) -> None:
    text = TEXTS[name]
    vllm = vllm_view["parsed"][name]
    grove = parse_output(text, tool_calls=True)
    assert vllm["tool_calls"] == _grove_calls(text)
    assert vllm["content"] == grove.content


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_closed_reasoning_splits_alike(vllm_view: dict[str, Any], parser: str) -> None:
    grove = parse_output(TEXTS["closed_reasoning"], tool_calls=False)
    assert vllm_view["parsed"]["closed_reasoning"]["reasoning"][parser] == [
        grove.reasoning,
        grove.content,
    ]


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_text_without_think_tags_is_reasoning_to_vllm_and_content_to_grove(
    vllm_view: dict[str, Any], parser: str
) -> None:
    """vLLM's parsers assume the template opened ``<think>`` in the prompt; Grove's ChatML
    template does not (the model writes the tag), so untagged text is the answer."""
    text = TEXTS["plain"]
    assert vllm_view["parsed"]["plain"]["reasoning"][parser] == [text, None]
    grove = parse_output(text, tool_calls=False)
    assert (grove.reasoning, grove.content) == (None, text)


def test_text_after_a_call_is_dropped_by_hermes_and_kept_as_content_by_grove(
    vllm_view: dict[str, Any],
) -> None:
    text = TEXTS["text_after_call"]
    vllm = vllm_view["parsed"]["text_after_call"]
    assert (vllm["tool_calls"], vllm["content"]) == (_grove_calls(CALL), None)
    grove = parse_output(text, tool_calls=True)
    assert (grove.tool_calls, grove.content) == ((), text)


def test_an_unclosed_call_is_a_call_to_hermes_and_content_to_grove(
    vllm_view: dict[str, Any],
) -> None:
    text = TEXTS["unclosed_call"]
    vllm = vllm_view["parsed"]["unclosed_call"]
    assert vllm["tool_calls"] == [{"name": "lookup", "arguments": {}}]
    grove = parse_output(text, tool_calls=True)
    assert (grove.tool_calls, grove.content) == ((), text)
