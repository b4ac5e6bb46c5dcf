"""The attempt's fixed options (capture/fixed_options.py): the model, the chat template, the
template and processor kwargs and the tokenization flags stay those of the attempt; tools, tool
choice and reasoning effort may change per call."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest

from grove.capture.embedded import CHATML_TEMPLATE, EMBEDDED_MODEL_NAME
from grove.capture.errors import AttemptOptionsChangedError
from grove.capture.fixed_options import FIXED_OPTIONS_KEY, check_fixed_options, fixed_options
from grove.capture.render import RenderOptions
from grove.ledger.attempt import AttemptState
from tests.fixtures.attempts import attempt_state, intended

OPTIONS = RenderOptions(model=EMBEDDED_MODEL_NAME, template_kwargs={"enable_thinking": True})
TEMPLATE_SHA = hashlib.sha256(CHATML_TEMPLATE.encode()).hexdigest()


def attempt(*first_call: dict[str, Any]) -> AttemptState:
    """Attempt ``att-1`` opened on the embedded model and template, with a first call whose
    intent records ``first_call[0]`` as its fixed options (none: no call yet)."""
    calls = [intended("c0", "first_call", {FIXED_OPTIONS_KEY: record}) for record in first_call]
    return attempt_state(
        "att-1", *calls, model_fingerprint=EMBEDDED_MODEL_NAME, template_fingerprint=TEMPLATE_SHA
    )


def fixed(**changes: Any) -> dict[str, Any]:
    """The fixed options of ``OPTIONS`` with ``changes``, under the embedded template."""
    return fixed_options(dataclasses.replace(OPTIONS, **changes), CHATML_TEMPLATE)


def test_fixed_options_record_the_model_the_template_digest_kwargs_and_flags():
    assert fixed() == {
        "model": EMBEDDED_MODEL_NAME,
        "chat_template_sha256": TEMPLATE_SHA,
        "template_kwargs": {"enable_thinking": True},
        "processor_kwargs": {},
        "add_generation_prompt": True,
        "add_special_tokens": False,
    }


def test_fixed_options_are_recorded_as_the_ledger_reads_them_back():
    assert fixed(template_kwargs={"stops": ("a", "b")})["template_kwargs"] == {"stops": ["a", "b"]}


def test_the_first_call_fixes_the_options_the_attempt_did_not_record():
    check_fixed_options(fixed(template_kwargs={"enable_thinking": False}), attempt())


def test_a_call_with_the_attempts_options_passes():
    check_fixed_options(fixed(), attempt(fixed()))


@pytest.mark.parametrize(
    "per_call",
    [
        {"tools": ({"type": "function", "function": {"name": "f"}},)},
        {"tool_choice": "none"},
        {"reasoning_effort": "high"},
    ],
    ids=["tools", "tool_choice", "reasoning_effort"],
)
def test_per_call_options_may_change_within_the_attempt(per_call: dict[str, Any]):
    check_fixed_options(fixed(**per_call), attempt(fixed()))


def test_a_call_for_another_model_is_refused_naming_the_model():
    with pytest.raises(AttemptOptionsChangedError) as refused:
        check_fixed_options(fixed(model="other-model"), attempt(fixed()))
    error = refused.value
    assert (error.option, error.got, error.expected) == (
        "model",
        "other-model",
        EMBEDDED_MODEL_NAME,
    )
    assert "fixed by attempt.opened model_fingerprint" in str(error)
    assert "or open a new attempt for the new configuration" in str(error)


def test_a_call_with_another_chat_template_is_refused_naming_the_template():
    other = fixed_options(OPTIONS, CHATML_TEMPLATE + "{# another #}")
    with pytest.raises(AttemptOptionsChangedError, match=r"this call's chat template \(sha256"):
        check_fixed_options(other, attempt())


@pytest.mark.parametrize(
    ("change", "option"),
    [
        ({"template_kwargs": {"enable_thinking": False}}, "template_kwargs"),
        ({"processor_kwargs": {"max_pixels": 1024}}, "processor_kwargs"),
        ({"add_special_tokens": True}, "add_special_tokens"),
        ({"add_generation_prompt": False}, "add_generation_prompt"),
    ],
)
def test_a_call_that_changes_a_fixed_option_of_the_first_call_is_refused_naming_it(
    change: dict[str, Any], option: str
):
    with pytest.raises(AttemptOptionsChangedError) as refused:
        check_fixed_options(fixed(**change), attempt(fixed()))
    assert (refused.value.option, refused.value.fixed_by) == (option, "its first call c0")
    assert refused.value.expected == fixed()[option]
