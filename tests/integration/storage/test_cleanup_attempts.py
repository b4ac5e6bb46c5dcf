"""Staging cleanup on real stores (a local directory and S3 on moto) against a real ledger.

Each test records attempts through ``AttemptLog`` and writes their blobs as capture does (blob
first, then ``call.committed``), then cleans one attempt (``clean_attempt``, what ``grove train``
runs after a step) or the whole store (``collect_garbage``, ``grove gc``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.events import (
    AttemptOpened,
    BatchPublished,
    CallCommitted,
    CallFailed,
    CallIntended,
    LedgerPosition,
    ReplaySummary,
    RolloutFinalized,
    RolloutSelected,
)
from grove.ledger.store import EventStore
from grove.storage import BlobRef, BlobStore, open_blob_store, staging_key
from grove.training.cleanup import clean_attempt, collect_garbage
from tests.integration.tools.grove_cli import run_grove

SUMMARY = ReplaySummary(
    normalization_version=1,
    item_count=1,
    source_digest="0" * 64,
    canonical_source_digest="0" * 64,
    render_options_digest="1" * 64,
)
WINDOW_S = 300.0


@dataclass
class Ledger:
    """A ledger and a blob store, and the attempts written to them."""

    store: EventStore
    blobs: BlobStore
    log: AttemptLog

    def open(self, key: str) -> None:
        """Open attempt ``key`` (its rollout id is the key too)."""
        self.log.open(
            AttemptOpened(
                capture_key=key,
                rollout_id=key,
                prompt_group=f"{key}-g",
                rollout_index=0,
                policy_version=0,
                model_fingerprint="m",
                template_fingerprint="t",
            )
        )

    def call(self, key: str, call_id: str, *, write: bool = True, commit: bool = True) -> str:
        """Intend a call; write its blob (``write``) and commit it (``commit``): a call written
        but not committed is one whose writer crashed or still runs. Returns its blob key."""
        self.log.intend(
            key,
            CallIntended(
                call_id=call_id,
                decision="root",
                root_reason="initial",
                replay_summary=SUMMARY,
                prompt_tokens=3,
            ),
        )
        blob_key = staging_key(key, call_id)
        if not write:
            return blob_key
        ref = self.blobs.put(blob_key, f"delta of {key}/{call_id}".encode())
        if commit:
            self.log.commit(
                key,
                CallCommitted(
                    call_id=call_id,
                    prev_len=0,
                    delta_len=4,
                    cum_len=4,
                    prompt_delta_len=3,
                    generated_len=1,
                    blob_key=ref.key,
                    blob_sha256=ref.sha256,
                    blob_bytes=ref.size,
                    chain_digest="b" * 64,
                    finish_reason="stop",
                    response_id=f"resp-{call_id}",
                    output_fingerprint="c" * 64,
                    replay_summary=SUMMARY,
                ),
            )
        return blob_key

    def finish(self, key: str, selected: tuple[str, ...], *, trainable: bool | None) -> None:
        """Settle (pending calls stay pending), select ``selected``, and finalize: trainable,
        masked, or (None) not yet."""
        self.log.settle(key, timeout_s=0.0)
        self.log.select(
            key,
            RolloutSelected(
                policy="returned_history",
                call_ids=selected,
                terminal_response_id=f"resp-{selected[-1]}",
                reward=1.0,
            ),
        )
        if trainable is not None:
            self.log.finalize(
                key,
                RolloutFinalized(
                    rollout_id=key,
                    trainable=trainable,
                    masked_reason=None if trainable else "capture_pending",
                    paths=(selected,) if trainable else (),
                ),
            )

    def publish(self, *rollout_ids: str, dropped: tuple[str, ...] = ()) -> None:
        """Publish the next step of the ``training`` stream with ``rollout_ids``, and the
        rollouts of the prompt groups it dropped (``dropped``)."""
        step = self.store.stream_version("training")
        event = BatchPublished(
            step=step,
            rollout_ids=rollout_ids,
            row_ids=tuple(f"{r}/0" for r in rollout_ids),
            ledger_position=LedgerPosition(position=0),
            dropped_rollout_ids=dropped,
        )
        self.store.append("training", [event], expected_version=step)

    def cleaned(self, key: str) -> tuple[str, ...]:
        """The keys the attempt's ``attempt.cleaned`` events name."""
        return self.log.load(key).cleaned_keys

    def ref(self, key: str, call_id: str) -> BlobRef:
        """The blob reference ``call.committed`` recorded for a call."""
        committed = self.log.load(key).calls[call_id].committed
        assert committed is not None
        return BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)


@pytest.fixture
def ledger(blob_url: str, tmp_path: Path) -> Iterator[Ledger]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate.upgrade(url)
    store = EventStore.open(url)
    try:
        yield Ledger(store, open_blob_store(blob_url), AttemptLog(store))
    finally:
        store.close()


def _published_attempt(ledger: Ledger, key: str = "a-pub") -> dict[str, str]:
    """A published rollout: c1 selected, c2 a rejected resample, and a blob ``zz`` no event
    names (a write whose intent never happened)."""
    ledger.open(key)
    keys = {c: ledger.call(key, c) for c in ("c1", "c2")}
    ledger.log.fail(key, CallFailed(call_id="c2", reason="rejected_by_harness"))
    keys["zz"] = ledger.blobs.put(staging_key(key, "zz"), b"stray").key
    ledger.finish(key, ("c1",), trainable=True)
    ledger.publish(key)
    return keys


def _clean(ledger: Ledger, key: str, **kwargs) -> tuple[str, ...]:
    result = clean_attempt(
        ledger.store,
        ledger.blobs,
        key,
        published_rollouts={key},
        window_s=kwargs.pop("window_s", WINDOW_S),
        **kwargs,
    )
    return result.plan.remove


def test_cleaning_a_published_attempt_deletes_its_unselected_blobs_and_orphans_exactly(ledger):
    keys = _published_attempt(ledger)

    removed = _clean(ledger, "a-pub")

    assert removed == (keys["c2"], keys["zz"])
    assert ledger.blobs.list_keys("staging/") == [keys["c1"]]
    assert ledger.cleaned("a-pub") == (keys["c2"], keys["zz"])
    assert ledger.blobs.get(ledger.ref("a-pub", "c1")) == b"delta of a-pub/c1"  # still verifies


def test_cleaning_again_removes_nothing_and_records_nothing(ledger):
    _published_attempt(ledger)
    _clean(ledger, "a-pub")
    version = ledger.store.stream_version("a-pub")

    assert _clean(ledger, "a-pub") == ()
    assert ledger.store.stream_version("a-pub") == version


def test_a_pending_calls_blob_survives_cleanup_until_teardown_after_the_settle_window(ledger):
    ledger.open("a-mask")
    selected = ledger.call("a-mask", "c1")
    pending = ledger.call("a-mask", "c2", commit=False)  # written, never acknowledged
    ledger.finish("a-mask", ("c1",), trainable=False)  # masked: capture pending

    assert _clean(ledger, "a-mask") == (selected,)
    assert ledger.blobs.list_keys("staging/") == [pending]

    later = datetime.now(UTC) + timedelta(seconds=WINDOW_S + 1)
    assert _clean(ledger, "a-mask", now=later) == (pending,)
    assert ledger.blobs.list_keys("staging/") == []
    assert ledger.cleaned("a-mask") == (selected, pending)
    if ledger.blobs.backend == "local":  # torn down whole: the partition's directory too
        assert not Path(ledger.blobs.path(pending)).parent.exists()


def test_a_late_write_of_a_failed_call_waits_for_teardown_like_a_pending_one(ledger):
    ledger.open("a-fail")
    ledger.call("a-fail", "c1")
    ledger.call("a-fail", "c2", write=False)
    ledger.log.fail("a-fail", CallFailed(call_id="c2", reason="storage_error"))
    late = ledger.blobs.put(staging_key("a-fail", "c2"), b"written after the failure").key
    ledger.finish("a-fail", ("c1",), trainable=True)

    assert _clean(ledger, "a-fail") == ()
    assert late in ledger.blobs.list_keys("staging/")
    assert _clean(ledger, "a-fail", window_s=0.0) == (late,)
    assert ledger.blobs.list_keys("staging/") == [staging_key("a-fail", "c1")]


def test_a_trainable_rollout_not_yet_published_keeps_every_blob(ledger):
    ledger.open("a-wait")
    keys = [ledger.call("a-wait", c) for c in ("c1", "c2")]
    ledger.finish("a-wait", ("c1",), trainable=True)

    result = clean_attempt(
        ledger.store, ledger.blobs, "a-wait", published_rollouts=set(), window_s=0.0
    )

    assert (result.plan.final, result.plan.remove) == (None, ())
    assert ledger.blobs.list_keys("staging/") == keys


def test_gc_removes_orphans_and_finished_attempts_blobs_and_keeps_selected_and_pending(ledger):
    keys = _published_attempt(ledger)
    unknown = ledger.blobs.put(staging_key("never-opened", "c1"), b"no event names me").key
    ledger.open("a-open")  # a writer still running: intended, written, not yet committed
    in_flight = ledger.call("a-open", "c1", commit=False)

    dry = collect_garbage(ledger.store, ledger.blobs, window_s=WINDOW_S, dry_run=True)
    assert sorted(dry.removed) == sorted([keys["c2"], keys["zz"], unknown])
    assert len(ledger.blobs.list_keys("staging/")) == 5  # a dry run removes nothing

    report = collect_garbage(ledger.store, ledger.blobs, window_s=WINDOW_S)

    assert sorted(report.removed) == sorted(dry.removed)
    assert sorted(report.orphans) == sorted([keys["zz"], unknown])
    assert report.removed_bytes == len(b"delta of a-pub/c2strayno event names me")
    assert (report.kept, report.waiting) == (1, 1)
    assert ledger.blobs.list_keys("staging/") == [in_flight, keys["c1"]]
    assert ledger.store.stream_version("never-opened") == 0  # no event for an unknown attempt


def test_gc_removes_every_blob_of_a_trainable_rollout_whose_group_a_published_step_dropped(
    ledger,
):
    ledger.open("a-drop")
    keys = [ledger.call("a-drop", c) for c in ("c1", "c2")]
    ledger.finish("a-drop", ("c1", "c2"), trainable=True)
    assert collect_garbage(ledger.store, ledger.blobs, window_s=0.0).removed == []  # may train

    ledger.publish("a-trained", dropped=("a-drop",))
    report = collect_garbage(ledger.store, ledger.blobs, window_s=0.0)

    assert (sorted(report.removed), report.kept) == (keys, 0)
    assert ledger.cleaned("a-drop") == tuple(keys)
    assert ledger.blobs.list_keys("staging/") == []


def test_gc_on_a_crashed_writers_partition_removes_its_blob_only_after_the_settle_window(ledger):
    ledger.open("a-crash")
    crashed = ledger.call("a-crash", "c1", commit=False)  # the writer died before its commit

    assert collect_garbage(ledger.store, ledger.blobs, window_s=0.0).removed == []  # still open

    ledger.finish("a-crash", ("c1",), trainable=False)  # settled with c1 pending: masked
    assert collect_garbage(ledger.store, ledger.blobs, window_s=WINDOW_S).removed == []
    report = collect_garbage(ledger.store, ledger.blobs, window_s=0.0)

    assert report.removed == [crashed]
    assert ledger.blobs.list_keys("staging/") == []
    assert ledger.cleaned("a-crash") == (crashed,)


def test_grove_gc_prints_what_it_removed_and_json_counts_and_bytes(
    blob_url, database_url, tmp_path
):
    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    try:
        ledger = Ledger(store, open_blob_store(blob_url), AttemptLog(store))
        keys = _published_attempt(ledger)
    finally:
        store.close()
    where = ["--workdir", str(tmp_path), "--database-url", database_url, "--blob-url", blob_url]

    dry = run_grove("gc", "--dry-run", "--json", *where)
    text = run_grove("gc", *where)
    again = run_grove("gc", "--json", *where)

    assert (dry.code, text.code, again.code) == (0, 0, 0)
    assert json.loads(dry.stdout) == {
        "dry_run": True,
        "attempts": 1,
        "cleaned_attempts": 1,
        "removed_blobs": 2,
        "removed_bytes": len(b"delta of a-pub/c2") + len(b"stray"),
        "orphans": 1,
        "kept_selected": 1,
        "held_for_forks": 0,
        "waiting": 0,
        "failed": [],
    }
    assert text.stdout.startswith("removed 2 staging blobs (22 bytes) of 1 attempts, 1 of them")
    assert json.loads(again.stdout)["removed_blobs"] == 0
    assert open_blob_store(blob_url).list_keys("staging/") == [keys["c1"]]
