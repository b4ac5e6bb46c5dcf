"""The reply checks both vLLM engines (text completions and the vision ``generate`` endpoint)
apply to a success body: exactly one choice, and a finish reason Grove records."""

from __future__ import annotations

import pytest

from grove.capture.engine import SamplingParams
from grove.capture.vllm import EngineResponseError, checked_finish, only_choice

URL = "http://vllm:8000/v1/completions"


@pytest.mark.parametrize(
    "body",
    [{"choices": []}, {"choices": [{}, {}]}, {"choices": ["text"]}, {"choices": None}, []],
)
def test_a_body_without_exactly_one_choice_object_is_refused(body: object) -> None:
    with pytest.raises(EngineResponseError, match=r"a generation has exactly one choice"):
        only_choice(URL, body, "a generation")


def test_the_one_choice_is_returned() -> None:
    assert only_choice(URL, {"choices": [{"index": 0}]}, "a completion") == {"index": 0}


def test_an_unknown_finish_reason_is_refused() -> None:
    with pytest.raises(EngineResponseError, match=r"finish_reason is one of \['length', 'stop'\]"):
        checked_finish(URL, {"finish_reason": "abort"}, SamplingParams(max_tokens=4), 2)


def test_a_length_finish_short_of_max_tokens_is_refused() -> None:
    # 3 tokens under max_tokens=4: the server lowered max_tokens to fit its context.
    with pytest.raises(EngineResponseError, match=r"a length finish has max_tokens=4 tokens.*3"):
        checked_finish(URL, {"finish_reason": "length"}, SamplingParams(max_tokens=4), 3)


def test_a_stop_or_a_full_length_finish_is_returned() -> None:
    sampling = SamplingParams(max_tokens=4)

    assert checked_finish(URL, {"finish_reason": "stop"}, sampling, 1) == "stop"
    assert checked_finish(URL, {"finish_reason": "length"}, sampling, 4) == "length"
