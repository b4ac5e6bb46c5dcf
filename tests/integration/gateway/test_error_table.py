"""One table maps every Grove error class the gateway can meet to its HTTP answer."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

from grove.capture import errors as capture_errors
from grove.capture import vllm
from grove.capture.wire import ERROR_STATUS, ErrorStatus, error_status
from grove.ledger import admission, attempt
from grove.ledger import errors as ledger_errors
from grove.storage import errors as storage_errors

MODULES = (capture_errors, vllm, ledger_errors, admission, attempt, storage_errors)


def exported_errors(module: ModuleType) -> list[type[Exception]]:
    return [
        value
        for name in module.__all__
        if inspect.isclass(value := getattr(module, name)) and issubclass(value, Exception)
    ]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_error_class_has_its_own_entry(module: ModuleType):
    missing = [cls.__name__ for cls in exported_errors(module) if cls not in ERROR_STATUS]
    assert missing == []


def test_bad_input_errors_are_answered_with_4xx():
    bad_input = (
        capture_errors.NormalizationError,
        capture_errors.InvalidSamplingError,
        capture_errors.PromptTooLongError,
        admission.AssistantPrefillError,
        admission.AmbiguousParentError,
        ledger_errors.StreamIdError,
        storage_errors.InvalidKeyError,
    )
    assert all(400 <= ERROR_STATUS[cls].status < 500 for cls in bad_input)


def test_an_unlisted_subclass_is_answered_as_its_closest_listed_class():
    class CustomPrefill(admission.AssistantPrefillError):
        pass

    assert error_status(CustomPrefill(2)) == ErrorStatus(400, "assistant_prefill")


def test_an_error_outside_grove_is_an_internal_error():
    assert error_status(KeyError("x")) == ErrorStatus(500, "internal_error")


def test_an_unreachable_vllm_server_is_answered_503_so_the_client_may_retry():
    unreachable = vllm.EngineUnavailableError("http://127.0.0.1:1/v1/completions", "ConnectError")
    assert error_status(unreachable) == ErrorStatus(503, "engine_unavailable")
