"""vLLM's own tool-call and reasoning parsers, run on texts Grove generated (in ``.venv-vllm``).

Run by ``tests/vllm/test_parsers_agree.py`` with the vLLM python, not imported by Grove:
``python tests/vllm/parser_probe.py MODEL_DIR < request.json``. The request holds ``texts`` (each
parsed by the ``hermes`` tool parser and the ``qwen3`` and ``deepseek_r1`` reasoning parsers, as
``vllm serve --tool-call-parser hermes --reasoning-parser …`` would), ``markup`` (strings whose
token ids vLLM's tokenizer reports) and ``token_ids`` (sequences it decodes, special tokens kept).
The answer, one JSON object on stdout, holds what each parser and the tokenizer gave.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.reasoning import ReasoningParserManager
from vllm.tokenizers import get_tokenizer
from vllm.tool_parsers import ToolParserManager

REASONING_PARSERS = ("qwen3", "deepseek_r1")
TOOL_PARSER = "hermes"


def probe(model_dir: str, request: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's parsers and tokenizer make of the request's texts, markup and token ids."""
    tokenizer = get_tokenizer(model_dir)
    chat = ChatCompletionRequest(
        model="probe",
        messages=[{"role": "user", "content": "probe"}],
        tools=[{"type": "function", "function": {"name": "lookup", "parameters": {}}}],
    )
    tools = ToolParserManager.get_tool_parser(TOOL_PARSER)(tokenizer)
    reasoning = {
        name: ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
        for name in REASONING_PARSERS
    }
    parsed = []
    for text in request["texts"]:
        extracted = tools.extract_tool_calls(text, chat)
        parsed.append(
            {
                "tool_calls": [
                    {"name": c.function.name, "arguments": json.loads(c.function.arguments)}
                    for c in extracted.tool_calls
                ],
                "content": extracted.content,
                "reasoning": {
                    name: list(parser.extract_reasoning(text, chat))
                    for name, parser in reasoning.items()
                },
            }
        )
    return {
        "parsed": parsed,
        "markup": {
            text: tokenizer.encode(text, add_special_tokens=False) for text in request["markup"]
        },
        "decoded": [
            tokenizer.decode(ids, skip_special_tokens=False) for ids in request["token_ids"]
        ],
    }


if __name__ == "__main__":
    json.dump(probe(sys.argv[1], json.load(sys.stdin)), sys.stdout)
