"""The policies a server runs: built-ins and registered ones, resolved at start, never by name."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from grove.training.errors import SelectionPolicyError
from grove.training.selection import (
    BUILTIN_POLICIES,
    PolicyRegistry,
    all_captured,
    returned_history,
)

from .test_selection import RECORDS


@pytest.fixture
def policy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable module with a policy (``sys.modules`` shows whether it was imported)."""
    name = f"grove_registry_policy_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            def first(records, result):
                return [records[0]], records[0].response_id
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_default_registry_holds_exactly_the_builtins() -> None:
    registry = PolicyRegistry.of()

    assert registry.names == ("returned_history", "all_captured")
    assert registry.default == "returned_history"
    assert dict(registry.policies) == dict(BUILTIN_POLICIES)


def test_a_registered_policy_is_resolved_when_the_registry_is_built(policy_module: str) -> None:
    registry = PolicyRegistry.of(f"{policy_module}:first")

    assert registry.names == ("returned_history", "all_captured", f"{policy_module}:first")
    assert registry.default == f"{policy_module}:first"
    assert policy_module in sys.modules


def test_a_registered_policy_selects_under_its_registered_name(policy_module: str) -> None:
    registry = PolicyRegistry.of(registered=[f"{policy_module}:first"])

    selection = registry.select(f"{policy_module}:first", RECORDS, {"reward": 1.0})

    assert (selection.policy, selection.call_ids) == (f"{policy_module}:first", ("c1",))


def test_a_registry_refuses_an_unregistered_policy_without_importing_it(policy_module: str) -> None:
    registry = PolicyRegistry.of()

    with pytest.raises(SelectionPolicyError, match=r"unregistered.*runs only") as raised:
        registry.resolve(f"{policy_module}:first")

    assert raised.value.spec == f"{policy_module}:first"
    assert policy_module not in sys.modules


def test_a_registry_refuses_a_name_that_is_not_a_string() -> None:
    with pytest.raises(SelectionPolicyError, match=r"unregistered"):
        PolicyRegistry.of().resolve(7)  # type: ignore[arg-type]


def test_a_registered_policy_that_does_not_resolve_fails_when_the_registry_is_built() -> None:
    with pytest.raises(SelectionPolicyError, match=r"unknown_module"):
        PolicyRegistry.of(registered=["no_such_grove_module:select"])


def test_a_registry_whose_default_is_not_among_its_policies_is_refused() -> None:
    with pytest.raises(SelectionPolicyError, match=r"unregistered"):
        PolicyRegistry({"returned_history": returned_history}, default="all_captured")


def test_builtin_names_resolve_to_the_builtins() -> None:
    registry = PolicyRegistry.of()

    assert registry.resolve("returned_history") is returned_history
    assert registry.resolve("all_captured") is all_captured
