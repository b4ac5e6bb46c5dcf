"""One error tree: every error Grove raises descends from ``GroveError``, and the command line
gives each one an exit status (``grove/errors.py``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from grove.capture.errors import InvalidSamplingError
from grove.capture.vllm import EngineRejectedError, EngineUnavailableError
from grove.client import GatewayServerError, GroveClientError
from grove.config import ConfigurationError
from grove.errors import EXIT_STATUS, GROVE_ERRORS, JobError, exit_status
from grove.ledger.database import DatabaseError, UnsupportedDatabaseURL
from grove.ledger.errors import DatabaseUnavailable, SchemaNotReady
from grove.storage.errors import InvalidKeyError, StorageUnavailableError
from grove.training.errors import SelectionError
from grove.training.selection import SelectionPolicyFailed
from grove_errors import GroveError

PACKAGES = (
    "grove_errors",
    "grove.ledger",
    "grove.storage",
    "grove.capture",
    "grove.training",
    "grove",
)

OUTSIDE_THE_TREE = {
    # answered as an error body inside the gateway, never raised out of it
    "grove.capture.refusals.Refused",
    # answered as an error body by the body-limits middleware, never raised out of it
    "grove.capture.limits.LimitExceeded",
}


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _defined_exceptions() -> list[type[BaseException]]:
    """Every public exception class defined in Grove's packages (migrations/ holds none)."""
    found = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        modules = [package] + [
            info.name for info in pkgutil.walk_packages(root.__path__, f"{package}.")
        ]
        for module_name in modules:
            module = importlib.import_module(module_name)
            found.extend(
                value
                for name, value in vars(module).items()
                if inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module_name
                and not name.startswith("_")
            )
    return found


def test_every_public_error_grove_defines_descends_from_grove_error():
    outside = {_name(cls) for cls in _defined_exceptions() if not issubclass(cls, GroveError)}
    assert outside == OUTSIDE_THE_TREE


@pytest.mark.parametrize("root", GROVE_ERRORS, ids=lambda cls: cls.__name__)
def test_each_layer_root_is_a_branch_of_grove_error_drawn_in_its_docstring(root: type):
    assert issubclass(root, GroveError) and root is not GroveError
    assert f".{root.__name__} " in (GroveError.__doc__ or "")


def test_the_roots_keep_the_builtin_bases_callers_catch():
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(InvalidKeyError, ValueError)
    assert issubclass(SelectionError, ValueError)


@pytest.mark.parametrize("name", sorted(EXIT_STATUS))
def test_each_exit_status_names_an_error_class_of_the_tree(name: str):
    module, _, cls = name.rpartition(".")
    assert issubclass(getattr(importlib.import_module(module), cls), GroveError)


@pytest.mark.parametrize(
    "error",
    [
        DatabaseUnavailable("postgresql://ledger", "connection refused"),
        StorageUnavailableError("get", "staging/a/b", "s3://bucket", "timed out"),
        EngineUnavailableError("http://vllm:8000/v1/models", "ConnectError"),
        GatewayServerError("POST", "/v1/attempts/a/result", 500, "internal_error", "id 1"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_service_that_did_not_answer_exits_75_so_the_command_can_be_retried(error: GroveError):
    assert exit_status(error) == 75


@pytest.mark.parametrize(
    "error",
    [
        SchemaNotReady("sqlite:///ledger.db", "no such table"),
        InvalidKeyError("../x", "no traversal"),
        InvalidSamplingError("top_p", 2.0, "0 < top_p <= 1"),
        EngineRejectedError("http://vllm:8000", 400, "bad token"),
        SelectionError("unknown_response", "no call answered resp-1"),
        ConfigurationError("demo.yaml", ["grpo.typo: unknown key"]),
        JobError("the harness failed"),
        GroveClientError("POST", "/v1/attempts", 400, "unregistered_selection_policy", "x"),
        DatabaseError("sqlite:///ledger.db", "ProgrammingError", "syntax error"),
        SelectionPolicyFailed("mod:policy", KeyError("calls")),
    ],
    ids=lambda error: type(error).__name__,
)
def test_every_other_grove_error_exits_1(error: GroveError):
    assert exit_status(error) == 1


def test_an_unsupported_database_url_is_a_usage_error_exiting_2():
    assert exit_status(UnsupportedDatabaseURL("mysql://host/db", "not supported")) == 2


def test_the_client_branch_is_drawn_in_the_roots_docstring():
    assert ".GroveClientError " in (GroveError.__doc__ or "")
    assert issubclass(GatewayServerError, GroveClientError)


def test_a_subclass_takes_its_closest_listed_base_exit_status():
    class Flaky(StorageUnavailableError):
        pass

    assert exit_status(Flaky("put", None, "s3://bucket", "503")) == 75


def test_an_error_outside_the_tree_has_no_exit_status():
    with pytest.raises(TypeError, match="KeyError is not a GroveError"):
        exit_status(KeyError("x"))  # type: ignore[arg-type]
