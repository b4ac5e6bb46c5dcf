"""The command line reports an error of every branch of Grove's tree as a clear message, without
a trace, and exits with its status: 75 when a service did not answer, else 1 (grove/errors.py)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from grove.engines.models import save_embedded_model

from .grove_cli import run_grove

UNREACHABLE_POSTGRES = "postgresql+psycopg://grove:secret@127.0.0.1:1/grove"


@pytest.fixture(autouse=True)
def _keep_sigterm() -> Iterator[None]:
    """``grove serve`` installs its SIGTERM handler before it fails; this process keeps its own."""
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def _configuration(tmp_path: Path) -> list[str]:
    (tmp_path / "bad.yaml").write_text("grpo:\n  typo: 1\n")
    return ["train", str(tmp_path / "bad.yaml"), "--workdir", str(tmp_path / "work")]


def _ledger(tmp_path: Path) -> list[str]:
    return ["lineage", "att-1", "--workdir", str(tmp_path / "work")]


def _ledger_unreachable(tmp_path: Path) -> list[str]:
    return ["db", "status", "--database-url", UNREACHABLE_POSTGRES]


def _storage(tmp_path: Path) -> list[str]:
    assert run_grove("db", "upgrade", "--workdir", str(tmp_path / "work")).code == 0
    return ["gc", "--workdir", str(tmp_path / "work"), "--blob-url", "ftp://host/blobs"]


def _training(tmp_path: Path) -> list[str]:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "manifest.json").write_text("{}")
    return ["export", str(tmp_path / "ckpt"), "--hf", str(tmp_path / "hf"), "--model", "embedded"]


def _capture_unreachable(tmp_path: Path) -> list[str]:
    model = save_embedded_model(tmp_path / "model")
    return [
        "serve", "--engine", "vllm", "--model", str(model), "--vllm-url", "http://127.0.0.1:1",
        "--workdir", str(tmp_path / "work"),
    ]  # fmt: skip


def _job(tmp_path: Path) -> list[str]:
    (tmp_path / "work").mkdir()
    page = str(tmp_path / "r.html")
    return ["report", "no-such-run", "--html", page, "--workdir", str(tmp_path / "work")]


CASES = [
    ("ConfigurationError", _configuration, 1, "Invalid Grove configuration"),
    ("LedgerError", _ledger, 1, "No ledger at"),
    ("LedgerError-unreachable", _ledger_unreachable, 75, "Cannot reach the ledger database"),
    ("StorageError", _storage, 1, "Invalid blob store URL 'ftp://host/blobs'"),
    ("TrainingError", _training, 1, "Checkpoint"),
    ("CaptureError-unreachable", _capture_unreachable, 75, "The vLLM server did not answer"),
    ("JobError", _job, 1, "no run 'no-such-run'"),
]


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_an_error_of_each_branch_is_one_message_and_its_exit_status(
    tmp_path: Path, argv: Callable[[Path], list[str]], status: int, message: str
):
    outcome = run_grove(*argv(tmp_path))
    assert (outcome.code, outcome.stdout) == (status, "")
    assert outcome.stderr.startswith(f"error: {message}"), outcome.stderr
    assert "Traceback" not in outcome.stderr


def test_an_unreachable_database_is_reported_without_its_password(tmp_path: Path):
    outcome = run_grove(*_ledger_unreachable(tmp_path))
    assert "secret" not in outcome.stderr
    assert "grove:***@127.0.0.1:1" in outcome.stderr


@pytest.mark.parametrize("command", ["lineage", "replay", "show", "gc"])
def test_a_reading_command_on_an_empty_workdir_creates_no_ledger(tmp_path: Path, command: str):
    work = tmp_path / "work"
    argv = {
        "lineage": ["lineage", "att-1"],
        "replay": ["replay", "att-1"],
        "show": ["show", "att-1", "--html", str(tmp_path / "page.html")],
        "gc": ["gc"],
    }[command]
    outcome = run_grove(*argv, "--workdir", str(work))
    assert outcome.code == 1
    assert outcome.stderr.startswith(f"error: No ledger at {work / 'ledger.db'}: ")
    assert not work.exists()
