"""The embedded VL engine decodes under a grammar as the text engine does: a JSON-object
constraint makes the tiny random VLM answer one JSON object, then end its turn."""

from __future__ import annotations

import json

from grove.capture.embedded_vlm import EmbeddedVLMEngine, build_vlm_tokenizer
from grove.capture.engine import OutputConstraint, SamplingParams

PROMPT_TEXT = "<|im_start|>user\nA JSON object?<|im_end|>\n<|im_start|>assistant\n"


def test_a_json_object_constraint_makes_the_vl_engine_answer_one_json_object() -> None:
    tokenizer = build_vlm_tokenizer()
    engine = EmbeddedVLMEngine.build(tokenizer, seed=3)
    prompt = tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)
    sampling = SamplingParams(
        max_tokens=64, seed=0, constraint=OutputConstraint(content="json_object")
    )
    generation = engine.generate(prompt, sampling)
    text = tokenizer.decode(generation.content_token_ids, clean_up_tokenization_spaces=False)
    assert generation.finish_reason == "stop"
    assert isinstance(json.loads(text), dict)
