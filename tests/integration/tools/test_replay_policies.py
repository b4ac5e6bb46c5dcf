"""``grove replay --verify`` re-runs a selection only with a built-in policy or one registered on
its command line; a policy the ledger names is never imported (docs/gateway.md, "Attempts")."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grove.capture.attempt_settings import AttemptSettings
from grove.services.serve import LedgerSelector
from grove.training.selection import BUILTIN_POLICIES, PolicyRegistry

from ..gateway.support import serve
from ..gateway.test_completions import USER, ask, reply
from .grove_cli import Outcome, run_grove
from .ledgers import run_json

pytestmark = pytest.mark.xdist_group("grove-demo-ledger")


def first_call(records: Any, result: Any) -> tuple[list[Any], str]:
    """The policy the module below defines, handed to the server without importing the module."""
    return [records[0]], records[0].response_id


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, str]]:
    """(database url, blob url, policy name): one attempt selected by a custom policy whose
    module is importable but was never imported."""
    module = f"grove_replay_policy_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """
            def first(records, result):
                return [records[0]], records[0].response_id
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"{module}:first"
    registry = PolicyRegistry({**BUILTIN_POLICIES, name: first_call})
    database, blobs = f"sqlite:///{tmp_path / 'ledger.db'}", str(tmp_path / "blobs")
    with serve(
        database,
        blobs,
        selector=LedgerSelector(registry),
        attempts=AttemptSettings(registry.names, name, forest_mode=True),
    ) as gateway:
        gateway.open()
        completion, _ = ask(gateway.client(), [USER])
        answer = gateway.http.post(
            "/v1/attempts/att-1/result", json={"reward": 1.0, "output": [reply(completion)]}
        )
        assert answer.status_code == 200, answer.text
    yield database, blobs, name


def verify(database: str, blobs: str, *args: str) -> Outcome:
    return run_grove(
        "replay", "att-1", "--verify", "--json", "--database-url", database, "--blob-url", blobs,
        *args,
    )  # fmt: skip


def selection_check(outcome: Outcome) -> dict[str, Any]:
    (check,) = [c for c in run_json(outcome.stdout)["checks"] if c["decision"] == "selection"]
    return check


def test_verify_skips_a_policy_that_is_not_registered_and_does_not_import_it(ledger):
    database, blobs, name = ledger

    outcome = verify(database, blobs)

    assert outcome.code == 0, outcome.stderr
    check = selection_check(outcome)
    assert check["outcome"] == "skipped"
    assert f"names policy {name!r}, which is neither built in nor registered here" in check["note"]
    assert name.split(":")[0] not in sys.modules


def test_verify_re_runs_a_policy_given_on_the_command_line(ledger):
    database, blobs, name = ledger

    outcome = verify(database, blobs, "--selection-policy", name)

    assert outcome.code == 0, outcome.stderr
    assert selection_check(outcome)["outcome"] == "same"


def test_a_selection_policy_that_does_not_resolve_is_a_usage_error(ledger):
    database, blobs, _ = ledger

    outcome = verify(database, blobs, "--selection-policy", "no_such_grove_module:select")

    assert outcome.code == 2
    assert "unknown_module" in outcome.stderr
