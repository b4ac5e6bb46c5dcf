"""``grove fork KEY CALL_ID``: a recorded call sampled again on its exact prompt tokens, beside its
recorded answer with each token's logprob then and now and its TMPE (docs/fork.md, "Debugging a
call: grove fork").

Most tests read the ledger of ``grove demo --steps 1`` (``ledgers.py``): its step-0 calls were
sampled by the warm-started embedded model (``--checkpoint none``), and its run wrote the
checkpoint of step 1 (the default, ``latest``). A fork's call is recorded through the real
gateway with the official openai client, on every ledger database and blob backend.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from grove.demo.agent_corpus import LOOKUP_TOOL
from grove.engines.models import load_model
from grove.ledger.attempt import AttemptLog
from grove.ledger.events import AttemptOpened
from grove.ledger.store import EventStore
from grove.storage import BlobRef, open_blob_store
from grove.tools.fork import read_recorded_call
from grove.training.checkpoint import CheckpointMetadata, save_checkpoint
from tests.fixtures.attempts import intended

from ..gateway.support import serve
from ..gateway.test_completions import USER, ask, observe, reply
from .grove_cli import Outcome, run_grove
from .ledgers import DemoLedger, run_json

pytestmark = pytest.mark.xdist_group("grove-demo-ledger")

TOLERANCE = 1e-5
"""|now - then| of a logprob, and |TMPE - 1|, under the weights that sampled the tokens: the
trainer's tests' bound for float32 logprobs of a KV-cached generation against one teacher-forced
pass (tests/unit/trainer/test_trainer.py)."""

TINY_CONFIG = "seed: 0\nmodel:\n  path: embedded\n"
"""The model the test gateway serves (``support.engine``: the embedded model of seed 0)."""


def fork(demo: DemoLedger, *args: str) -> Outcome:
    return run_grove("fork", *args, "--workdir", str(demo.workspace.workdir))


def error_line(outcome: Outcome) -> str:
    """The one ``error: …`` line a refused command printed on stderr (after any progress)."""
    assert outcome.code == 1 and outcome.stdout == "", outcome
    assert "Traceback" not in outcome.stderr
    (line,) = [line for line in outcome.stderr.splitlines() if line.startswith("error: ")]
    return line


def selected_continuation(demo: DemoLedger) -> str:
    """A selected continuation of the showcase attempt (its blob and its chain's remain)."""
    state = demo.state(demo.showcase_key)
    assert state.selection is not None
    return next(c for c in state.selection.call_ids if state.calls[c].parent_call_id is not None)


@pytest.fixture(scope="module")
def call_id(demo: DemoLedger) -> str:
    return selected_continuation(demo)


@pytest.fixture(scope="module")
def as_sampled(demo: DemoLedger, call_id: str) -> dict[str, Any]:
    """``--json`` under the weights that sampled the demo's step 0 (the configured model)."""
    outcome = fork(demo, demo.showcase_key, call_id, "--n", "2", "--checkpoint", "none", "--json")
    assert outcome.code == 0, outcome.stderr
    return run_json(outcome.stdout)


def blob_of(demo: DemoLedger, capture_key: str, call_id: str) -> Any:
    committed = demo.state(capture_key).calls[call_id].committed
    assert committed is not None
    ref = BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
    return committed, open_blob_store(demo.workspace.blob_url).get_delta(ref)


def test_fork_prints_n_samples_beside_the_recorded_answer(
    demo: DemoLedger, call_id: str, as_sampled: dict[str, Any]
):
    outcome = fork(demo, demo.showcase_key, call_id, "--n", "3", "--checkpoint", "none")
    assert outcome.code == 0, outcome.stderr
    assert f"call {call_id} of attempt {demo.showcase_key}" in outcome.stdout
    assert "recorded answer (" in outcome.stdout
    assert as_sampled["recorded"]["text"] in outcome.stdout
    samples = [line for line in outcome.stdout.splitlines() if line.startswith("sample ")]
    assert [line.split(" (")[0] for line in samples] == ["sample 1", "sample 2", "sample 3"]
    assert "sample 3/3 (seed 2)" in outcome.stderr  # progress goes to stderr


def test_the_recorded_tokens_and_then_logprobs_are_the_blobs(
    demo: DemoLedger, call_id: str, as_sampled: dict[str, Any]
):
    committed, delta = blob_of(demo, demo.showcase_key, call_id)
    recorded = as_sampled["recorded"]
    assert recorded["tokens"] == delta.generated.tolist()
    assert recorded["logprobs_then"] == delta.logprobs.tolist()
    assert as_sampled["prompt_tokens"] == committed.prev_len + committed.prompt_delta_len


def test_under_the_weights_that_sampled_it_now_is_then_and_tmpe_is_one(
    as_sampled: dict[str, Any],
):
    recorded = as_sampled["recorded"]
    assert as_sampled["weights"]["checkpoint"] is None
    assert recorded["policy_version"] == 0
    assert recorded["logprobs_now"] == pytest.approx(recorded["logprobs_then"], abs=TOLERANCE)
    assert recorded["tmpe"] == pytest.approx(1.0, abs=TOLERANCE)


def test_under_a_trained_checkpoint_tmpe_moves_away_from_one(demo: DemoLedger, call_id: str):
    outcome = fork(demo, demo.showcase_key, call_id, "--n", "1", "--json")  # latest: step 1
    assert outcome.code == 0, outcome.stderr
    report = run_json(outcome.stdout)
    assert report["weights"]["step"] == 1
    assert Path(report["weights"]["checkpoint"]).name == "step_00000001"
    then, now = report["recorded"]["logprobs_then"], report["recorded"]["logprobs_now"]
    assert max(abs(a - b) for a, b in zip(then, now, strict=True)) > 100 * TOLERANCE
    assert report["recorded"]["tmpe"] > 1.0 + 100 * TOLERANCE


def test_json_holds_the_recorded_answer_and_each_sample(
    demo: DemoLedger, call_id: str, as_sampled: dict[str, Any]
):
    tokenizer = load_model("embedded").tokenizer
    assert set(as_sampled) == {
        "capture_key",
        "call_id",
        "parent_call_id",
        "source_capture_key",
        "prompt_tokens",
        "weights",
        "sampling",
        "recorded",
        "samples",
    }
    assert (as_sampled["capture_key"], as_sampled["call_id"]) == (demo.showcase_key, call_id)
    assert as_sampled["sampling"] == {"n": 2, "seed": 0, "temperature": 1.0, "max_tokens": 256}
    recorded = as_sampled["recorded"]
    assert set(recorded) == {
        "tokens",
        "text",
        "finish_reason",
        "policy_version",
        "constrained",
        "logprobs_then",
        "logprobs_now",
        "tmpe",
    }
    assert recorded["text"] == tokenizer.decode(recorded["tokens"])
    assert len(recorded["logprobs_now"]) == len(recorded["tokens"])
    assert [s["seed"] for s in as_sampled["samples"]] == [0, 1]
    for sample in as_sampled["samples"]:
        assert set(sample) == {"seed", "tokens", "text", "finish_reason", "logprobs", "attempt"}
        assert sample["attempt"] is None  # not recorded
        assert sample["text"] == tokenizer.decode(sample["tokens"])
        assert len(sample["logprobs"]) == len(sample["tokens"]) >= 1
        assert all(value <= 0.0 for value in sample["logprobs"])


def test_sample_i_is_the_sample_of_seed_plus_i(
    demo: DemoLedger, call_id: str, as_sampled: dict[str, Any]
):
    args = ("--n", "1", "--seed", "1", "--checkpoint", "none", "--json")
    outcome = fork(demo, demo.showcase_key, call_id, *args)
    assert outcome.code == 0, outcome.stderr
    assert run_json(outcome.stdout)["samples"] == as_sampled["samples"][1:]


def _blob_files(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_fork_writes_nothing_to_the_ledger_or_the_blob_store(demo: DemoLedger, call_id: str):
    store = EventStore.open(demo.workspace.database_url, pool=False)
    blobs = Path(demo.workspace.blob_url)
    try:
        events, files = store.count(), _blob_files(blobs)
        outcome = fork(demo, demo.showcase_key, call_id, "--n", "2", "--checkpoint", "none")
        assert outcome.code == 0, outcome.stderr
        assert (store.count(), _blob_files(blobs)) == (events, files)
    finally:
        store.close()


def test_an_unknown_call_is_refused_naming_the_attempts_calls(demo: DemoLedger):
    outcome = fork(demo, demo.showcase_key, "no-such-call")
    calls = ", ".join(demo.state(demo.showcase_key).calls)
    assert error_line(outcome).startswith(
        f"error: Attempt '{demo.showcase_key}' has no call 'no-such-call' (its calls: {calls})"
    )


def test_an_unknown_attempt_is_refused(demo: DemoLedger):
    outcome = fork(demo, "no-such-attempt", "c0")
    assert error_line(outcome).startswith(
        "error: There is no attempt 'no-such-attempt' in this ledger"
    )


def test_a_pending_call_is_refused(demo: DemoLedger, ledger_url: str):
    store = EventStore.open(ledger_url, pool=False)
    try:
        log = AttemptLog(store)
        opened = AttemptOpened(
            capture_key="pending-1",
            rollout_id="pending-1",
            prompt_group="g-pending",
            rollout_index=0,
            policy_version=0,
            model_fingerprint="m",
            template_fingerprint="t",
        )
        log.open(opened)
        log.intend("pending-1", intended("c0", "first_call"))  # never committed
        events = store.count()
    finally:
        store.close()
    outcome = run_grove(
        "fork",
        "pending-1",
        "c0",
        "--database-url",
        ledger_url,
        "--blob-url",
        demo.workspace.blob_url,
        "--workdir",
        str(demo.workspace.workdir),
    )
    assert error_line(outcome).startswith(
        "error: Call 'c0' of attempt 'pending-1' is pending, so it has no stored answer"
    )
    store = EventStore.open(ledger_url, pool=False)
    try:
        assert store.count() == events
    finally:
        store.close()


def test_a_call_whose_blob_was_cleaned_up_is_refused_naming_the_blob(demo: DemoLedger):
    state = demo.state(demo.showcase_key)
    rejected = next(c.call_id for c in state.calls.values() if c.failure is not None)
    outcome = fork(demo, demo.showcase_key, rejected, "--checkpoint", "none")
    key = f"staging/{demo.showcase_key}/{rejected}"
    assert error_line(outcome).startswith(
        f"error: The blob of call '{rejected}' of attempt '{demo.showcase_key}' ({key}) cannot "
        "be read: Missing blob"
    )


def test_a_checkpoint_of_another_model_is_refused(demo: DemoLedger, call_id: str, tmp_path: Path):
    other = load_model("embedded", architecture="moe").model
    path = save_checkpoint(
        tmp_path / "checkpoints",
        model=other,
        optimizer=torch.optim.AdamW(other.parameters()),
        scheduler=None,
        metadata=CheckpointMetadata(
            step=3,
            forest_mode=True,
            execution_row_multiple=1,
            selection_policy="returned_history",
            config_digest="d",
            projector_position={},
        ),
    )
    config = demo.workspace.workdir / "runs" / demo.run_id / "config.json"
    outcome = fork(
        demo, demo.showcase_key, call_id, "--config", str(config), "--checkpoint", str(path)
    )
    assert error_line(outcome).startswith(
        f"error: Checkpoint {path} is not a checkpoint of the model {config} names "
        "(grove/embedded-tiny)"
    )


def test_a_forks_call_is_sampled_on_its_source_chain_then_its_own_delta(
    database_url: str, blob_url: str, tmp_path: Path
):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    with serve(database_url, blob_url) as gateway:
        client = gateway.client("src")
        gateway.open("src")
        first, _ = ask(client, [USER], extra_headers={"x-grove-call-id": "c1"})
        history = [USER, reply(first)]
        opened = gateway.http.post(
            "/v1/attempts",
            json={
                "capture_key": "fork-1",
                "rollout_id": "r-fork-1",
                "prompt_group": "g-fork",
                "rollout_index": 0,
                "fork_from": {"capture_key": "src", "call_id": "c1"},
            },
            headers={"X-Grove-Source-Attempt-Token": gateway.token("src")},  # the source's
        )
        assert opened.status_code == 200, opened.text
        ask(gateway.client("fork-1"), [*history, observe("apples=4")], extra_headers={})
        call = next(iter(gateway.state("fork-1").calls.values()))
        views = gateway.service.views
        chain = views.chain_tokens(views.view("fork-1"), call.call_id)
        generated, logprobs = gateway.generated("fork-1", call.call_id)
    outcome = run_grove(
        "fork",
        "fork-1",
        call.call_id,
        "--n",
        "1",
        "--config",
        str(config),
        "--checkpoint",
        "none",
        "--json",
        "--database-url",
        database_url,
        "--blob-url",
        blob_url,
        "--workdir",
        str(tmp_path / "work"),
    )
    assert outcome.code == 0, outcome.stderr
    report = json.loads(outcome.stdout)
    assert (report["parent_call_id"], report["source_capture_key"]) == ("c1", "src")
    assert report["prompt_tokens"] == len(chain) - len(generated)
    assert report["recorded"]["tokens"] == generated
    assert report["recorded"]["logprobs_then"] == logprobs
    assert report["recorded"]["tmpe"] == pytest.approx(1.0, abs=TOLERANCE)


def record(demo: DemoLedger, ledger_url: str, blobs: Path, *args: str) -> Outcome:
    """``grove fork … --record`` on a copy of the demo ledger and blobs, with the demo's tool."""
    tools = blobs.parent / "tools.json"
    tools.write_text(json.dumps([LOOKUP_TOOL]))
    return run_grove(
        "fork",
        *args,
        "--record",
        "--tools",
        str(tools),
        "--database-url",
        ledger_url,
        "--blob-url",
        str(blobs),
        "--workdir",
        str(demo.workspace.workdir),
    )


@pytest.fixture
def blob_copy(demo: DemoLedger, tmp_path: Path) -> Path:
    return Path(shutil.copytree(demo.workspace.blob_url, tmp_path / "blobs"))


def test_record_keeps_each_sample_as_a_fork_of_the_calls_parent_on_the_calls_prompt(
    demo: DemoLedger, call_id: str, as_sampled: dict[str, Any], ledger_url: str, blob_copy: Path
):
    key = demo.showcase_key
    args = (key, call_id, "--n", "2", "--checkpoint", "none", "--json")
    outcome = record(demo, ledger_url, blob_copy, *args)
    assert outcome.code == 0, outcome.stderr
    samples = run_json(outcome.stdout)["samples"]
    keys = [f"{key}-fork-{call_id}-0", f"{key}-fork-{call_id}-1"]
    assert [s["attempt"] for s in samples] == keys
    # the same draws as without --record (same weights, same seeds)
    assert [{**s, "attempt": None} for s in samples] == as_sampled["samples"]
    parent = demo.state(key).calls[call_id].parent_call_id
    store = EventStore.open(ledger_url, pool=False)
    blobs = open_blob_store(str(blob_copy))
    try:
        original = read_recorded_call(store, blobs, key, call_id)
        for attempt, sample in zip(keys, samples, strict=True):
            state = AttemptLog(store).load(attempt)
            assert state.opened is not None and state.opened.fork_from is not None
            source = state.opened.fork_from
            assert (source.source_capture_key, source.source_call_id) == (key, parent)
            assert state.settled is not None and state.selection is None  # never trains
            (again,) = state.calls.values()
            assert (again.parent_call_id, again.intended.source_capture_key) == (parent, key)
            recorded = read_recorded_call(store, blobs, attempt, again.call_id)
            assert recorded.prompt == original.prompt
            assert list(recorded.generated) == sample["tokens"]
    finally:
        store.close()


def test_record_keeps_a_roots_sample_as_an_attempt_of_its_own(
    demo: DemoLedger, ledger_url: str, blob_copy: Path
):
    key = demo.showcase_key
    root = next(c for c in demo.state(key).calls.values() if c.parent_call_id is None).call_id
    outcome = record(demo, ledger_url, blob_copy, key, root, "--n", "1", "--json")
    assert outcome.code == 0, outcome.stderr
    (sample,) = run_json(outcome.stdout)["samples"]
    store = EventStore.open(ledger_url, pool=False)
    blobs = open_blob_store(str(blob_copy))
    try:
        state = AttemptLog(store).load(sample["attempt"])
        assert state.opened is not None and state.opened.fork_from is None
        (again,) = state.calls.values()
        assert (again.parent_call_id, again.intended.root_reason) == (None, "first_call")
        recorded = read_recorded_call(store, blobs, sample["attempt"], again.call_id)
        assert recorded.prompt == read_recorded_call(store, blobs, key, root).prompt
    finally:
        store.close()


def test_record_without_the_calls_tools_is_refused_and_writes_nothing(
    demo: DemoLedger, call_id: str, ledger_url: str, blob_copy: Path
):
    store = EventStore.open(ledger_url, pool=False)
    try:
        events = store.count()
        outcome = run_grove(
            "fork",
            demo.showcase_key,
            call_id,
            "--record",
            "--database-url",
            ledger_url,
            "--blob-url",
            str(blob_copy),
            "--workdir",
            str(demo.workspace.workdir),
        )
        assert error_line(outcome).startswith(
            f"error: Call '{call_id}' of attempt '{demo.showcase_key}' was rendered under other "
            "options than model 'grove/embedded-tiny' with no tools"
        )
        assert store.count() == events
    finally:
        store.close()


def test_record_refuses_a_seed_it_recorded_already_and_writes_nothing(
    demo: DemoLedger, call_id: str, ledger_url: str, blob_copy: Path
):
    args = (demo.showcase_key, call_id, "--n", "1", "--seed", "3", "--checkpoint", "none")
    assert record(demo, ledger_url, blob_copy, *args).code == 0
    store = EventStore.open(ledger_url, pool=False)
    try:
        events = store.count()
        outcome = record(demo, ledger_url, blob_copy, *args)
        assert error_line(outcome).startswith(
            f"error: Attempt '{demo.showcase_key}-fork-{call_id}-3' already records the sample "
            "of seed 3"
        )
        assert store.count() == events
    finally:
        store.close()


def test_a_corrupt_blob_in_the_calls_chain_is_refused_naming_it(
    demo: DemoLedger, call_id: str, blob_copy: Path
):
    key = demo.showcase_key
    parent = demo.state(key).calls[call_id].parent_call_id
    blob = blob_copy / "staging" / key / str(parent)
    damaged = bytearray(blob.read_bytes())
    damaged[-1] ^= 0xFF  # same size, another sha256
    blob.write_bytes(bytes(damaged))
    outcome = run_grove(
        "fork", key, call_id, "--blob-url", str(blob_copy), "--workdir", str(demo.workspace.workdir)
    )
    line = error_line(outcome)
    assert line.startswith(
        f"error: The blob of call '{parent}' of attempt '{key}' (staging/{key}/{parent}) cannot "
        "be read: "
    )
    assert "sha256" in line


def test_an_unknown_run_is_refused_listing_the_runs(demo: DemoLedger, call_id: str):
    outcome = fork(demo, demo.showcase_key, call_id, "--run", "no-such-run")
    assert error_line(outcome).startswith(
        f"error: no run 'no-such-run' in {demo.workspace.workdir / 'runs'}; runs there: "
        f"{demo.run_id}"
    )


def test_tools_without_record_is_a_usage_error(demo: DemoLedger, call_id: str, tmp_path: Path):
    outcome = fork(demo, demo.showcase_key, call_id, "--tools", str(tmp_path / "tools.json"))
    assert outcome.code == 2
    assert "--tools goes with --record" in outcome.stderr
