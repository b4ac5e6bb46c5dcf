"""Selection policies are the server's choice: an attempt names a built-in or a policy the server
registered, or none and gets the server's; never a module for the server to import
(docs/gateway.md, "Attempts")."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from grove.capture.attempt_settings import AttemptSettings
from grove.client import GroveClient
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.services.serve import ServerThread, build_gateway
from grove.training.errors import SelectionPolicyError
from grove.workspace import Workspace

from .conftest import Gateway
from .test_completions import USER, ask, reply

CUSTOM = "tests.unit.trainer.selection_policies:select_all"
FOREST_SERVER = AttemptSettings(selection_policy="all_captured", forest_mode=True)
"""A server that trains forests and selects with ``all_captured`` by default."""


def open_body(capture_key: str = "att-1", **fields: object) -> dict[str, object]:
    return {
        "capture_key": capture_key,
        "rollout_id": f"r-{capture_key}",
        "prompt_group": "g0",
        "rollout_index": 0,
        **fields,
    }


@pytest.fixture
def importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module a client could name; whether it was imported shows in ``sys.modules``."""
    name = f"grove_client_named_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("def select(records, result):\n    return records, None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_an_attempt_naming_an_unregistered_policy_is_refused_and_nothing_is_imported(
    local_gateway: Gateway, importable: str
):
    answer = local_gateway.http.post(
        "/v1/attempts", json=open_body(selection_policy=f"{importable}:select")
    )

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("unregistered_selection_policy", "selection_policy")
    assert f"'{importable}:select', which this server does not run" in error["message"]
    assert "returned_history, all_captured" in error["message"]
    assert local_gateway.written() == (0, 0)
    assert importable not in sys.modules


def test_an_attempt_that_names_no_policy_gets_the_servers_policy_and_forest_mode(
    serve_gateway: Callable[..., Gateway],
):
    gateway = serve_gateway(attempts=FOREST_SERVER)

    status = gateway.open()

    assert (status["selection_policy"], status["forest_mode"]) == ("all_captured", True)
    opened = gateway.state().opened
    assert (opened.selection_policy, opened.forest_mode) == ("all_captured", True)


def test_an_attempt_may_name_a_builtin_other_than_the_servers_own(
    serve_gateway: Callable[..., Gateway],
):
    gateway = serve_gateway(attempts=FOREST_SERVER)

    status = gateway.open(selection_policy="returned_history", forest_mode=False)

    assert (status["selection_policy"], status["forest_mode"]) == ("returned_history", False)


def test_a_forest_policy_is_refused_on_a_server_whose_forest_mode_is_off(local_gateway: Gateway):
    answer = local_gateway.http.post(
        "/v1/attempts", json=open_body(selection_policy="all_captured", forest_mode=True)
    )

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (
        "selection_policy_needs_forest_training",
        "selection_policy",
    )
    assert "'all_captured', which selects calls that train only as a forest" in error["message"]
    assert "this server's forest mode is off" in error["message"]
    assert local_gateway.written() == (0, 0)


def test_a_forest_policy_is_refused_for_an_attempt_that_turns_forest_mode_off(
    serve_gateway: Callable[..., Gateway],
):
    gateway = serve_gateway(attempts=FOREST_SERVER)

    answer = gateway.http.post("/v1/attempts", json=open_body(forest_mode=False))

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "selection_policy_needs_forest_training"
    assert "the attempt gives forest_mode: false" in error["message"]
    assert gateway.written() == (0, 0)


def test_returned_history_opens_without_forest_mode(local_gateway: Gateway):
    status = local_gateway.open(selection_policy="returned_history")

    assert (status["selection_policy"], status["forest_mode"]) == ("returned_history", False)


def test_a_server_whose_default_policy_needs_forest_training_needs_forest_mode():
    with pytest.raises(ValueError, match=r"'all_captured' needs forest training: turn forest"):
        AttemptSettings(selection_policy="all_captured", forest_mode=False)


def test_opening_again_without_policy_is_idempotent_with_the_resolved_one(
    serve_gateway: Callable[..., Gateway],
):
    gateway = serve_gateway(attempts=AttemptSettings(forest_mode=True))
    first = gateway.open(selection_policy="returned_history", forest_mode=True)
    before = gateway.written()

    assert gateway.open() == first
    assert gateway.written() == before
    conflict = gateway.http.post("/v1/attempts", json=open_body(selection_policy="all_captured"))
    assert conflict.status_code == 409
    assert "selection_policy: got 'all_captured', recorded 'returned_history'" in conflict.text


def test_a_server_settings_default_must_be_one_of_its_policies():
    with pytest.raises(ValueError, match=r"default selection policy 'mine:select' must be one of"):
        AttemptSettings(selection_policy="mine:select")


@pytest.fixture
def custom_server(tmp_path: Path) -> Iterator[tuple[GroveClient, Workspace]]:
    """A gateway built with a custom policy in its configuration (``build_gateway``)."""
    workspace = Workspace.resolve(tmp_path / "work")
    app = build_gateway(workspace, selection_policy=CUSTOM, forest_mode=True, settle_timeout_s=5)
    with ServerThread(app) as server, GroveClient(f"{server.base_url}/v1") as grove:
        yield grove, workspace


def test_a_configured_custom_policy_is_the_default_and_selects_the_result(
    custom_server: tuple[GroveClient, Workspace],
):
    grove, _ = custom_server
    attempt = grove.open_attempt("att-1", rollout_id="r1", prompt_group="g0", rollout_index=0)
    completion = attempt.openai().chat.completions.create(
        model=grove.model(), messages=[USER], max_tokens=4
    )

    status = attempt.post_result({"reward": 1.0, "output": [reply(completion)]})

    assert (status["selection_policy"], status["forest_mode"]) == (CUSTOM, True)
    assert status["selection"]["policy"] == CUSTOM
    assert status["selection"]["call_ids"] == [status["calls"][0]["call_id"]]


def test_a_configured_custom_policy_may_be_named_beside_the_builtins(
    custom_server: tuple[GroveClient, Workspace],
):
    grove, workspace = custom_server
    grove.open_attempt(
        "att-1", rollout_id="r1", prompt_group="g0", rollout_index=0, selection_policy=CUSTOM
    )
    grove.open_attempt(
        "att-2",
        rollout_id="r2",
        prompt_group="g0",
        rollout_index=1,
        selection_policy="all_captured",
    )

    store = EventStore.open(workspace.database_url)
    try:
        log = AttemptLog(store)
        policies = [log.load(key).opened.selection_policy for key in ("att-1", "att-2")]
    finally:
        store.close()
    assert policies == [CUSTOM, "all_captured"]


def test_a_gateway_configured_with_an_unresolvable_policy_is_not_built(tmp_path: Path):
    with pytest.raises(SelectionPolicyError, match=r"unknown_module"):
        build_gateway(Workspace.resolve(tmp_path / "work"), selection_policy="no_such_grove_mod:f")


def test_a_custom_policy_the_server_did_not_register_is_refused(
    serve_gateway: Callable[..., Gateway],
):
    gateway = serve_gateway(attempts=AttemptSettings(forest_mode=True))

    answer = gateway.http.post("/v1/attempts", json=open_body(selection_policy=CUSTOM))

    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "unregistered_selection_policy"


def test_an_attempt_result_selects_with_the_policy_the_server_resolved(
    serve_gateway: Callable[..., Gateway],
):
    gateway = serve_gateway(attempts=FOREST_SERVER)
    gateway.open()
    completion, _ = ask(gateway.client(), [USER])

    answer = gateway.http.post(
        "/v1/attempts/att-1/result", json={"reward": 1.0, "terminal_response_id": completion.id}
    )

    assert answer.status_code == 200, answer.text
    assert answer.json()["selection"]["policy"] == "all_captured"
