"""Resuming a rollout whose harness died in flight, as a fork of its last committed call
(``docs/fork.md``, "Resume"): an external harness (``tests/e2e/resumable_harness.py``) plays two
turns through the real gateway and is SIGKILLed while its attempt is open; a new process reads
the token the harness saved, opens a fork of the attempt's last committed call with
``grove.client`` and finishes the rollout from the conversation the opening answers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grove.training.finalization import decide
from tests.e2e.resumable_harness import KEY, RESUMED
from tests.integration.gateway.support import Gateway, serve

ROOT = Path(__file__).resolve().parents[2]


def _harness(command: str, gateway: Gateway, state: Path) -> subprocess.Popen[str]:
    url = f"{gateway.base_url}/v1"
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.resumable_harness", command, url, str(state)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_until_waiting(process: subprocess.Popen[str], state: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the harness exited: {process.stderr.read()[-2000:]}")
        if state.exists():
            saved = json.loads(state.read_text() or "{}")
            if saved.get("waiting"):
                return dict(saved)
        time.sleep(0.1)
    raise AssertionError("the harness did not play its two turns within 120 s")


@pytest.fixture
def resumed(tmp_path: Path) -> Iterator[tuple[Gateway, dict[str, Any], dict[str, Any]]]:
    """A harness killed in flight and resumed: the gateway, what the killed harness saved, and
    the fork's opening answer."""
    state = tmp_path / "state.json"
    with serve(f"sqlite:///{tmp_path / 'ledger.db'}", str(tmp_path / "blobs")) as gateway:
        killed = _harness("play", gateway, state)
        saved = _wait_until_waiting(killed, state)
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(timeout=30) == -signal.SIGKILL
        resuming = _harness("resume", gateway, state)
        out, err = resuming.communicate(timeout=120)
        assert resuming.returncode == 0, err[-2000:]
        yield gateway, saved, json.loads(out)


def test_a_killed_harness_leaves_its_attempt_open_with_its_calls_committed(resumed):
    gateway, _, _ = resumed
    killed = gateway.state(KEY)
    assert killed.selection is None and not killed.admissions_closed
    assert [c.status.value for c in killed.calls.values()] == ["committed", "committed"]


def test_the_resumed_fork_continues_the_last_committed_call(resumed):
    gateway, _, fork = resumed
    last = list(gateway.state(KEY).calls)[-1]
    assert (fork["source_capture_key"], fork["source_call_id"]) == (KEY, last)
    [call] = gateway.state(RESUMED).calls.values()
    assert (call.parent_call_id, call.intended.source_capture_key) == (last, KEY)
    assert call.committed.prev_len == gateway.state(KEY).calls[last].committed.cum_len


def test_the_resumed_fork_gets_the_conversation_the_killed_harness_had(resumed):
    _, saved, fork = resumed
    assert fork["messages"] == saved["history"]


def test_the_resumed_rollout_trains_only_what_it_generated_after_the_resume(resumed):
    gateway, _, _ = resumed
    state = gateway.state(RESUMED)
    assert state.selection is not None and state.selection.reward == 1.0
    decision = decide(state, gateway.service.blobs, forest_training=True, max_row_tokens=None)
    [row] = decision.rows
    source = list(gateway.state(KEY).calls.values())[-1].committed
    own = next(iter(state.calls.values())).committed
    # the source chain (its cum_len tokens) is context; the fork's observation too; only the
    # fork's generated tokens carry loss
    assert len(row.token_ids) == source.cum_len + own.delta_len
    assert (
        row.loss_mask.tolist()
        == [False] * (source.cum_len + own.prompt_delta_len) + [True] * own.generated_len
    )
