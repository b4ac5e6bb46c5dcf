"""Sharded projection: ``grove project`` processes share finalization by prompt group, with
leases in PostgreSQL (advisory locks), and a shard's leases outlive it by nothing.

The main test plays 4 prompt groups of 2 rollouts (the recency agent's compaction, so rollouts
have two rows) and records the result of one rollout per group. Shard A starts, leases 2 groups
(``--max-groups 2``) and finalizes their ready rollouts; shard B then leases the other 2. A is
killed with SIGKILL while it holds its 2 leases; the server releases them. The other rollouts'
results are recorded: B finalizes its groups, gives them back as they complete, takes A's over,
and publishes the 2 steps. Every attempt is finalized once, every step published once, and the
ledger equals what one projector makes of the same attempts: the same ``rollout.finalized`` for
every attempt, and the same batch (row ids, padding, tensors) for every step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from sqlalchemy import text

from grove.config import load_config
from grove.ledger.leases import Leases, lease_key
from grove.ledger.store import EventStore, ImportEvent
from grove.services.project import projector_settings
from grove.storage import open_blob_store
from grove.training.projector import Projector, ProjectorSettings
from grove.training.projector_shards import ProjectorShard
from tests.reliability.conftest import capture_service
from tests.reliability.rollouts import play, record_result

pytestmark = pytest.mark.postgres

GROUPS, PER_GROUP, STEPS, MAX_GROUPS = 4, 2, 2, 2
RUN = {  # the training run's configuration, which every shard reads
    "grpo": {"num_generations_per_prompt": PER_GROUP, "num_prompts_per_step": 2},
    "policy": {"train_global_batch_size": 2 * PER_GROUP, "train_micro_batch_size": 1},
    "token_capture": {"forest_training": True},
    # every group is played under policy version 0, and step 1 trains two of them
    "async_rl": {"max_policy_lag": STEPS - 1},
}
SETTINGS: ProjectorSettings = projector_settings(load_config(RUN))


def _wait(what: str, done: Callable[[], bool], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s} s for {what}")
        time.sleep(0.05)


def _finalized(store: EventStore) -> list[str]:
    query = text("SELECT stream_id FROM grove_events WHERE event_type = 'rollout.finalized'")
    with store.engine.connect() as conn:
        return [row[0] for row in conn.execute(query)]


def _leased(store: EventStore, pid: int) -> set[int]:
    """The advisory-lock keys held by the shard whose process id is ``pid``."""
    query = text(
        "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l "
        "JOIN pg_stat_activity a USING (pid) "
        "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE :holder"
    )
    with store.engine.connect() as conn:
        keys = conn.execute(query, {"holder": f"grove-project % pid {pid}"}).scalars()
        return {k - (1 << 64) if k >= 1 << 63 else k for k in keys}


def _shard(tmp_path: Path, name: str, database_url: str, blob_url: str) -> subprocess.Popen:
    grove = str(Path(sys.executable).parent / "grove")
    log = (tmp_path / f"{name}.log").open("w")
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(RUN))  # JSON is YAML
    argv = [grove, "project", str(config), "--max-groups", str(MAX_GROUPS)]
    argv += ["--steps", str(STEPS), "--poll-interval", "0.05"]
    argv += ["--json", "--database-url", database_url, "--blob-url", blob_url]
    argv += ["--workdir", str(tmp_path / name)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env, text=True)


def test_shards_take_over_a_killed_shards_groups_and_publish_what_one_projector_does(
    tmp_path: Path, postgres_url: str
):
    blob_url = str(tmp_path / "blobs")
    capture = capture_service(postgres_url, blob_url)
    store = capture.log.store
    played = {}
    for g in range(GROUPS):
        for i in range(PER_GROUP):
            key = f"g{g}-a{i}"
            played[key] = play(capture, key, group=f"g{g}", index=i, select=i < PER_GROUP - 1)
    ready = [k for k in played if not k.endswith(f"a{PER_GROUP - 1}")]
    groups = {f"g{g}" for g in range(GROUPS)}
    keys = {lease_key(g): g for g in groups}

    first = _shard(tmp_path, "a", postgres_url, blob_url)
    second = None
    try:
        _wait("shard A's leases", lambda: len(_leased(store, first.pid)) == MAX_GROUPS)
        _wait("shard A's finalizations", lambda: len(_finalized(store)) == MAX_GROUPS)
        held_by_a = {keys[k] for k in _leased(store, first.pid)}
        second = _shard(tmp_path, "b", postgres_url, blob_url)
        _wait("shard B's finalizations", lambda: len(_finalized(store)) == len(ready))
        held_by_b = {keys[k] for k in _leased(store, second.pid)}
        assert held_by_a | held_by_b == groups and not held_by_a & held_by_b
        assert sorted(_finalized(store)) == sorted(ready)

        first.kill()  # SIGKILL: the shard runs none of its code
        assert first.wait(30) == -9
        _wait("the server to release A's leases", lambda: not _leased(store, first.pid))
        for key in sorted(set(played) - set(ready)):
            record_result(capture, key, played[key].result)
        out, _ = second.communicate(timeout=120)
        assert second.returncode == 0, (tmp_path / "b.log").read_text()
    finally:
        for shard in (first, second):
            if shard is not None and shard.poll() is None:
                shard.kill()
                shard.wait(30)
    report = json.loads(out)
    assert report["published"] == list(range(STEPS))
    finalizations = Counter(_finalized(store))
    assert finalizations == dict.fromkeys(played, 1)

    sharded = Projector(store, open_blob_store(blob_url), SETTINGS, finalize=False)
    store.wait_for_horizon()
    sharded.poll()
    assert sharded.published_steps == STEPS
    reference = _one_projector(store, tmp_path, blob_url)
    for step in range(STEPS):
        ours = sharded.batch_for_step(step)
        assert ours is not None and ours.rebuilt
        step_groups = list(dict.fromkeys(r.group_id for r in ours.rollouts))
        theirs = reference.batch_for_step(step, groups=step_groups)
        assert theirs is not None and not theirs.rebuilt
        assert [r.rollout_id for r in ours.rollouts] == [r.rollout_id for r in theirs.rollouts]
        for field in ("input_ids", "loss_mask", "generation_logprobs", "parent_indices"):
            assert torch.equal(getattr(ours.batch, field), getattr(theirs.batch, field)), field
    assert _finalization_payloads(store) == _finalization_payloads(reference.store)
    capture.log.store.close()
    reference.store.close()


def _one_projector(store: EventStore, tmp_path: Path, blob_url: str) -> Projector:
    """One projector on a copy of the attempts' events before any finalization (a SQLite
    ledger), having finalized every attempt itself."""
    from grove.ledger import migrate

    url = f"sqlite:///{tmp_path / 'reference.db'}"
    migrate.upgrade(url)
    copy = EventStore.open(url)
    events = []
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT stream_id, stream_version, event_type, schema_version, payload "
                "FROM grove_events WHERE event_type NOT IN ('rollout.finalized', "
                "'batch.published') ORDER BY position"
            )
        )
        for row in rows:
            events.append(ImportEvent(*row))
    copy.import_events(events)
    projector = Projector(copy, open_blob_store(blob_url), SETTINGS)
    projector.poll()
    return projector


def _finalization_payloads(store: EventStore) -> dict[str, dict]:
    query = text(
        "SELECT stream_id, payload FROM grove_events WHERE event_type = 'rollout.finalized'"
    )
    with store.engine.connect() as conn:
        rows = conn.execute(query)
        return {k: json.loads(p) if isinstance(p, str) else p for k, p in rows}  # SQLite: text


def test_a_group_leased_by_another_shard_waits_and_is_taken_once_given_back(
    tmp_path: Path, postgres_url: str
):
    blob_url = str(tmp_path / "blobs")
    capture = capture_service(postgres_url, blob_url)
    store = capture.log.store
    for i in range(PER_GROUP):
        play(capture, f"g0-a{i}", group="g0", index=i)
    blobs = open_blob_store(blob_url)
    other = Leases.open(store.engine, "another shard")
    shard = ProjectorShard(store, blobs, SETTINGS, Leases.open(store.engine, "this shard"))
    try:
        assert other.take("g0")
        store.wait_for_horizon()  # every event so far readable (docs/ledger.md)
        assert shard.poll() == 0
        assert _finalized(store) == []
        other.give_back("g0")
        assert shard.poll() == PER_GROUP
        store.wait_for_horizon()  # its finalizations readable, whatever else the server runs
        shard.poll()  # reads its finalizations back: the group is complete
        assert shard.leases.held == frozenset()
    finally:
        shard.close()
        other.close()
        store.close()


def test_a_shard_at_its_lease_limit_gives_back_an_idle_group_for_a_ready_one(
    tmp_path: Path, postgres_url: str
):
    blob_url = str(tmp_path / "blobs")
    capture = capture_service(postgres_url, blob_url)
    store = capture.log.store
    played = play(capture, "g0-a0", group="g0", index=0)
    for i in range(1, PER_GROUP):  # g0 stays incomplete: its other rollouts are not selected
        play(capture, f"g0-a{i}", group="g0", index=i, select=False)
    shard = ProjectorShard(
        store,
        open_blob_store(blob_url),
        SETTINGS,
        Leases.open(store.engine, "this shard"),
        max_groups=1,
        idle_s=0.0,
    )
    try:
        store.wait_for_horizon()
        assert shard.poll() == 1
        assert shard.leases.held == {"g0"}
        play(capture, "g1-a0", group="g1", index=0)
        store.wait_for_horizon()
        # g0 has no ready attempt once its finalization is read: given back for g1
        assert shard.poll() == 1
        assert shard.leases.held == {"g1"}
        assert sorted(_finalized(store)) == [played.capture_key, "g1-a0"]
    finally:
        shard.close()
        store.close()


def test_leases_refuse_a_sqlite_ledger(tmp_path: Path):
    from grove.ledger.leases import LeaseError

    store = EventStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with pytest.raises(LeaseError, match="leases are PostgreSQL advisory locks"):
            Leases.open(store.engine, "a shard")
    finally:
        store.close()
