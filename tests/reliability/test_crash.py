"""Crash: the gateway and the training worker die by SIGKILL at seeded points, trial after trial,
on one workspace; afterwards nothing acknowledged is lost and nothing trains twice or in part.

Each trial plays one prompt group (two rollouts of three calls, some answers rejected and
resampled) through a ``grove serve`` process, then trains it with the worker process; the kill
lands in one of them (``crashpoints.py``), or, for ``gateway_sigkill``, the test kills the gateway
itself after a seeded delay. A rollout the dead gateway interrupted is, by a seeded choice,
*ended* (the controller settles the attempt without waiting and the harness posts the history it
had: the projector masks it when a call was left pending) or *abandoned* (never selected, so
never finalized) and played again under a fresh capture key. After every trial a restarted
worker must train to the end: training resumes.

At the end the whole ledger is checked (``invariants.py``), orphan blobs (stored, never
committed) are found and collected with the keys the ledger knows, every committed blob is read
back with its digest, and a fresh worker retrains every published step from scratch: its model
must equal, bit for bit, the one the interrupted run ended with.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.storage import BlobRef, collect_orphans, find_orphans, open_blob_store, staging_key
from grove.training.checkpoint import (
    CheckpointMetadata,
    latest_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from grove.workspace import Workspace
from tests.fixtures.s3 import S3Server

from .crashpoints import GATEWAY_POINTS, WORKER_POINTS, install
from .figures import FiguresFile
from .harness import GatewayLost, Harness
from .invariants import (
    LedgerView,
    checkpoint_problems,
    lost_acknowledgements,
    publication_problems,
    repeated_intents,
    rollout_outcomes,
    version_gaps,
)
from .processes import Child, Launcher, fork_server, s3_environment
from .worker import ROLLOUTS_PER_GROUP

EXTERNAL = "gateway_sigkill"
POINTS = (*GATEWAY_POINTS, EXTERNAL, *WORKER_POINTS)
MOST = {
    **dict.fromkeys(GATEWAY_POINTS, 2 * ROLLOUTS_PER_GROUP),  # calls of this process
    EXTERNAL: 1500,  # milliseconds after the group starts
    "after_finalize": ROLLOUTS_PER_GROUP,
    "after_publish": 1,
    "checkpoint_write": 7,  # fsyncs: 5 files, the manifest, the directory after the rename
}


@dataclass(frozen=True)
class Trial:
    """One kill: where (``point``), when (the ``count``-th time the process gets there, or the
    delay in ms for ``gateway_sigkill``), and what the harness does with an interrupted rollout
    (``recovery``: ``end`` or ``abandon``)."""

    number: int
    point: str
    count: int
    recovery: str

    @property
    def crash(self) -> str | None:
        """The crash point to arm in the process (``GROVE_CRASH_AT``)."""
        return None if self.point == EXTERNAL else f"{self.point}:{self.count}"


def plan(seed: int, trials: int) -> list[Trial]:
    """``trials`` trials cycling through every point, counts and recoveries drawn from ``seed``."""
    rng = random.Random(seed)
    return [
        Trial(
            n,
            point := POINTS[n % len(POINTS)],
            rng.randint(50 if point == EXTERNAL else 1, MOST[point]),
            rng.choice(("end", "abandon")),
        )
        for n in range(trials)
    ]


@dataclass
class Campaign:
    """One workspace, its gateway and worker processes, and what the trials did to them."""

    launcher: Launcher
    workspace: Workspace
    checkpoints: Path
    seed: int
    exec_external: bool = False
    gateway: Child | None = None
    harness: Harness | None = None
    kills: Counter[str] = field(default_factory=Counter)
    ended: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        migrate.upgrade(self.workspace.database_url)
        self.store = EventStore.open(self.workspace.database_url)
        self.log = AttemptLog(self.store)  # the controller's own connection

    # -- the gateway -------------------------------------------------------------------------

    def start_gateway(self, trial: Trial | None = None) -> Child:
        if self.gateway is not None:
            self.gateway.stop()
        if trial is not None and trial.point == EXTERNAL and self.exec_external:
            self.gateway = self.launcher.exec_grove_serve(self.workspace)
        else:
            crash = None if trial is None else trial.crash
            self.gateway = self.launcher.gateway(self.workspace, crash=crash)
        assert self.gateway.base_url is not None
        if self.harness is None:
            self.harness = Harness(self.gateway.base_url, seed=self.seed)
        else:
            self.harness.connect(self.gateway.base_url)
        return self.gateway

    def buried(self, gateway: Child, trial: Trial) -> None:
        """``gateway`` died by SIGKILL in ``trial``: count the kill."""
        code = gateway.wait(60)
        assert code == -9, f"the gateway ended with {code}, not SIGKILL:\n{gateway.log_tail()}"
        self.kills[trial.point] += 1
        if self.gateway is gateway:
            self.gateway = None

    # -- one trial ---------------------------------------------------------------------------

    def run(self, trial: Trial) -> None:
        group = f"g{trial.number:03d}"
        armed = trial.point in GATEWAY_POINTS or trial.point == EXTERNAL
        if armed or self.gateway is None:
            self.start_gateway(trial if armed else None)
        target = self.gateway
        assert target is not None
        killer = None
        if trial.point == EXTERNAL:
            killer = threading.Timer(trial.count / 1000, target.sigkill)
            killer.start()
        for index in range(ROLLOUTS_PER_GROUP):
            self.play(group, index, trial)
        if killer is not None:
            killer.join()
            if self.gateway is target:
                self.buried(target, trial)  # the kill landed between requests
        assert not armed or target.exit_code() == -9, f"trial {trial} never killed the gateway"
        if trial.point in WORKER_POINTS:
            worker = self.launcher.worker(self.workspace, self.checkpoints, crash=trial.crash)
            code = worker.wait()
            assert code == -9, f"trial {trial}: the worker ended with {code}\n{worker.log_tail()}"
            self.kills[trial.point] += 1
        self.train()

    def play(self, group: str, index: int, trial: Trial) -> None:
        """Play rollout ``index`` of ``group`` to its result, whatever the gateway does."""
        rollout_id = f"{group}-r{index}"
        for attempt in range(4):
            key = rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}"
            if self.gateway is None:
                self.start_gateway()
            assert self.harness is not None
            try:
                progress = self.harness.play(key, rollout_id, group, index)
                assert self.harness.post_result(progress), f"{key}: result refused"
                return
            except GatewayLost as lost:
                assert self.gateway is not None
                self.buried(self.gateway, trial)
                self.start_gateway()
                if trial.recovery == "end" and self.end(lost):
                    return
                self.abandoned.append(key)
        raise AssertionError(f"rollout {rollout_id} was interrupted 4 times")

    def end(self, lost: GatewayLost) -> bool:
        """End an interrupted rollout: settle it now, post the history the harness had."""
        progress = lost.progress
        if not progress.answers or self.log.load(progress.capture_key).opened is None:
            return False
        self.log.settle(progress.capture_key, timeout_s=0.0)
        assert self.harness is not None
        if not self.harness.post_result(progress):
            return False
        self.ended.append(progress.capture_key)
        return True

    def train(self, checkpoints: Path | None = None) -> int:
        """A worker trains every step it can; returns the step it reached."""
        worker = self.launcher.worker(self.workspace, checkpoints or self.checkpoints)
        code = worker.wait()
        assert code == 0, f"training did not resume:\n{worker.log_tail()}"
        return json.loads(worker.log.read_text().strip().splitlines()[-1])["step"]

    def close(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self.harness is not None:
            self.harness.close()
        self.store.close()


def crash_log(launcher: Launcher) -> list[dict]:
    if not launcher.crash_log.exists():
        return []
    return [json.loads(line) for line in launcher.crash_log.read_text().splitlines()]


def run_campaign(
    tmp_path: Path,
    database_url: str,
    blob_url: str,
    *,
    seed: int,
    trials: int,
    exec_external: bool,
    env: dict[str, str],
) -> dict:
    """Run ``trials`` trials on one workspace, check everything, return the figures."""
    started = time.monotonic()
    workspace = Workspace.resolve(tmp_path / "work", database_url, blob_url)
    launcher = Launcher(tmp_path, env)
    campaign = Campaign(launcher, workspace, tmp_path / "checkpoints", seed, exec_external)
    schedule = plan(seed, trials)
    try:
        for trial in schedule:
            campaign.run(trial)
        if campaign.gateway is not None:
            campaign.gateway.stop()
            campaign.gateway = None
        # The controller gives up on abandoned attempts: settled, they free their storage.
        unsettled = [
            k for k, s in LedgerView.read(campaign.store).attempts.items() if not s.settled
        ]
        for key in unsettled:
            campaign.log.settle(key, timeout_s=0.0)
        final_step = campaign.train()
        view = LedgerView.read(campaign.store)

        # Nothing acknowledged is lost; the ledger is whole.
        acks = campaign.harness.acks if campaign.harness else []
        assert lost_acknowledgements(view, acks) == []
        assert repeated_intents(view) == []
        assert version_gaps(view) == []
        assert [k for k, s in view.attempts.items() if s.contradictions] == []
        # Each rollout trains once, whole; incomplete ones never train; checkpoints agree.
        assert publication_problems(view) == []
        outcomes, problems = rollout_outcomes(view)
        assert problems == []
        # An attempt the gateway died opening never reached the ledger: nothing to select.
        opened_abandoned = [key for key in campaign.abandoned if key in view.attempts]
        assert outcomes["never_selected"] == len(opened_abandoned)
        assert final_step == len(view.batches)
        assert checkpoint_problems(campaign.checkpoints, view) == []
        leftovers = list(campaign.checkpoints.glob(".step_*"))  # killed writers' partial files
        assert leftovers == []

        # Orphans: blobs stored for calls that never committed; found, removed, nothing else.
        blobs = open_blob_store(blob_url)
        known = {
            c.committed.blob_key: c.committed
            for s in view.attempts.values()
            for c in s.calls.values()
            if c.committed is not None
        }
        uncommitted = {
            staging_key(key, c.call_id)
            for key, s in view.attempts.items()
            for c in s.calls.values()
            if c.committed is None
        }
        orphans = find_orphans(blobs, known_keys=known)
        put_then_killed = {c["blob_key"] for c in crash_log(launcher) if "blob_key" in c}
        assert set(orphans) <= uncommitted
        assert put_then_killed <= set(orphans)
        assert collect_orphans(blobs, known_keys=known) == orphans
        assert blobs.list_keys() == sorted(known)
        for committed in known.values():  # every committed blob reads back with its digest
            blobs.get(BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes))

        # Training resumed to the state of an uninterrupted run over the same batches.
        reference = tmp_path / "reference-checkpoints"
        assert campaign.train(reference) == final_step
        interrupted, straight = (
            latest_checkpoint(campaign.checkpoints),
            latest_checkpoint(reference),
        )
        assert interrupted is not None and straight is not None
        a = load_file(interrupted / "model.safetensors")
        b = load_file(straight / "model.safetensors")
        assert a.keys() == b.keys() and all(a[name].equal(b[name]) for name in a)

        assert sum(campaign.kills.values()) == trials
        return {
            "trials": trials,
            "kills": dict(campaign.kills),
            "acknowledgements_checked": len(acks),
            "events_checked": len(view.events),
            "attempts": len(view.attempts),
            "interrupted_ended": len(campaign.ended),
            "interrupted_abandoned": len(campaign.abandoned),
            "outcomes": dict(outcomes),
            "steps_trained": final_step,
            "checkpoints_verified": len(list(campaign.checkpoints.glob("step_*"))),
            "checkpoint_temp_dirs_left": len(leftovers),
            "orphan_blobs_removed": len(orphans),
            "committed_blobs_verified": len(known),
            "lost": 0,
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        campaign.close()


def test_sqlite_survives_48_seeded_kills_and_loses_nothing(tmp_path: Path, figures: FiguresFile):
    result = run_campaign(
        tmp_path,
        f"sqlite:///{tmp_path / 'ledger.db'}",
        str(tmp_path / "blobs"),
        seed=48,
        trials=48,
        exec_external=False,
        env={},
    )
    figures.record("crash/sqlite-local", result)


@pytest.mark.postgres
@pytest.mark.s3
def test_postgresql_and_s3_survive_8_seeded_kills_and_lose_nothing(
    tmp_path: Path, postgres_url: str, s3_server: S3Server, figures: FiguresFile
):
    env = s3_environment(s3_server)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        result = run_campaign(
            tmp_path,
            postgres_url,
            s3_server.fresh_url(),
            seed=8,
            trials=8,
            exec_external=True,
            env=env,
        )
    figures.record("crash/postgresql-s3", result)


def write_checkpoint(root: str, crash: str | None) -> None:
    """Save a checkpoint of step 1 of a small model under ``root``, with ``crash`` armed."""
    install(crash)
    model = torch.nn.Linear(4, 4)
    save_checkpoint(
        root,
        model=model,
        optimizer=torch.optim.AdamW(model.parameters()),
        scheduler=None,
        metadata=CheckpointMetadata(
            step=1,
            forest_mode=True,
            execution_row_multiple=1,
            selection_policy="returned_history",
            config_digest="digest",
        ),
    )


def test_a_step_written_again_after_its_writer_was_killed_leaves_no_partial_checkpoint(
    tmp_path: Path,
):
    killed = fork_server().Process(
        target=write_checkpoint, args=(str(tmp_path), "checkpoint_write:3")
    )
    killed.start()
    killed.join(60)
    assert killed.exitcode == -9
    (partial,) = tmp_path.glob(".step_00000001.tmp-*")  # two files synced, no manifest
    assert not (partial / "manifest.json").exists()
    assert latest_checkpoint(tmp_path) is None
    write_checkpoint(str(tmp_path), None)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000001"]
    assert verify_checkpoint(tmp_path / "step_00000001").step == 1
