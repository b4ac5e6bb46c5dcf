"""A million-call ledger: per-attempt costs on PostgreSQL at 10k, 100k and 1M captured calls.

Usage: ``python -m bench.scale [--quick] [--json] [--sizes 10000,100000] [--rounds 3] [--url URL]``

Each size gets a fresh database (dropped at the end) and a fresh local blob directory. The
databases live on a throwaway cluster of the bench's own (``initdb``; ``fsync=off``, which only
speeds the build), or on the server at ``--url``: the gap-free reader reads below the oldest
transaction running anywhere on its server, so on a server other clients keep busy, the
projector and ``grove lineage``'s catch-up wait for them, and the figures measure that wait.
The ledger is built through the import path (``bench/support/scale_ledger.py`` draws the shapes:
groups of 8 rollouts, 5-40 calls each, compaction roots, rejections, engine failures;
``EventStore.import_events`` copies them in, the projection rows follow by ``COPY``). Every
ledger is built first; then the timings run in ``--rounds`` rounds that visit the sizes in a
rotated order, so that load from elsewhere on the machine falls on all of them alike:

- ``lineage_ms_p50`` / ``lineage_ms_p99``: the lineage query of one attempt (``grove lineage``'s
  ``calls`` query, ``grove.tools.lineage.QUERIES``) for sampled attempts across the ledger, warm;
  ``lineage_plan`` is its ``EXPLAIN`` (``lineage_plan_index_only``: no sequential scan of a
  table that grows with the ledger);
- ``grove_lineage_ms``: ``grove lineage``'s work for one attempt (``attempt_lineages``: catch-up,
  every query, the divergence read), median over the sample;
- ``replay_ms``: ``grove replay --verify`` of one attempt (``grove.tools.replay.replay`` with the
  blob store: admissions, selection, finalization from the blobs, publication), median over the
  attempts whose blobs exist;
- ``projector_step_ms``: each round, a step's worth of newly selected attempts (4 groups of 8)
  arrives at the ledger's end; a projector that has read everything before them finalizes them
  (blobs read and verified) and publishes the step; median over the rounds;
- ``postgres_bytes_per_call``: the database's size over the calls (``pg_database_size`` less the
  size of an empty migrated database), with each table's and index's share;
  ``blob_bytes_per_call``: the blob store's bytes per committed call (the recorded sizes).

``growth_largest_over_smallest`` is the largest ratio of any per-attempt figure (the five
above) between the largest and the smallest ledger of the run; the aim is <= 1.5, and
``lineage_ms_p99`` < 10 at 1M calls. ``--quick`` stops at 100k calls. Timings are wall clock on a
shared machine: medians and percentiles over many attempts and rounds, after one warm-up pass.
Last, the smallest ledger's bulk projection rows are checked row for row against the fold
(``grove.ledger.catch_up.rebuild``; ``projection_rows_checked``). Results: ``docs/scale.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import torch
from sqlalchemy import text
from sqlalchemy.engine import make_url

from bench.support.scale_ledger import (
    GROUPS_PER_STEP,
    ROLLOUTS_PER_GROUP,
    AttemptWriter,
    LedgerBuilder,
    Placed,
)
from bench.support.scale_rows import TABLE_COLUMNS, ProjectionRows
from grove.ledger import migrate
from grove.ledger.catch_up import rebuild
from grove.ledger.events import LedgerPosition
from grove.ledger.store import EventStore, ImportEvent
from grove.storage import BlobStore, open_blob_store
from grove.tools.lineage import QUERIES, attempt_lineages
from grove.tools.replay import replay
from grove.training.projector import Projector, ProjectorSettings
from tests.fixtures.postgres import ThrowawayCluster

SIZES = (10_000, 100_000, 1_000_000)
CALLS_PER_ATTEMPT = 23  # the mean of 5-40 calls, plus retries: only to plan chunks
CHUNK_GROUPS = 8 * GROUPS_PER_STEP  # groups per import transaction (whole steps)
TRAINING_STREAM = "training-bench"
LINEAGE_SAMPLE = 200
TOOL_SAMPLE = 24
FIGURES = ("lineage_ms_p50", "lineage_ms_p99", "grove_lineage_ms", "replay_ms", "projector_step_ms")


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Database:
    """A database created for one ledger on the server of ``admin_url``, dropped by ``drop``."""

    def __init__(self, admin_url: str, name: str) -> None:
        self.admin_url = admin_url
        self.name = name
        self.url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        with psycopg.connect(_dsn(admin_url), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # a generated name: letters, digits, _

    def drop(self) -> None:
        """Drop the database (closing anything still connected)."""
        with psycopg.connect(_dsn(self.admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


# -- building ------------------------------------------------------------------------------------


def _copy_projections(store: EventStore, rows: ProjectionRows, skip_streams: set[str]) -> None:
    tables = rows.tables()
    tables["grove_proj_streams"] = [
        r for r in tables["grove_proj_streams"] if r[0] not in skip_streams
    ]
    with store.engine.begin() as conn:
        driver = conn.connection.driver_connection
        with driver.cursor() as cursor:
            for table, values in tables.items():
                columns = ", ".join(TABLE_COLUMNS[table])
                with cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                    for value in values:
                        copy.write_row(value)


def _import(store: EventStore, placed: Sequence[Placed], skip_streams: set[str]) -> None:
    """Import the events (one transaction), check they landed where placed, add their rows."""
    store.import_events(
        ImportEvent(
            p.stream_id,
            p.stream_version,
            p.event.type,
            p.event.schema_version,
            p.event.model_dump(mode="json"),
        )
        for p in placed
    )
    with store.engine.connect() as conn:
        last = conn.execute(text("SELECT max(position) FROM grove_events")).scalar_one()
    if last != placed[-1].position:
        raise RuntimeError(
            f"events landed up to position {last}, placed up to {placed[-1].position}"
        )
    rows = ProjectionRows()
    rows.fold(placed)
    _copy_projections(store, rows, skip_streams)


def _mark(store: EventStore) -> LedgerPosition:
    with store.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT transaction_id, position FROM grove_events "
                "ORDER BY transaction_id DESC, position DESC LIMIT 1"
            )
        ).one()
    return LedgerPosition(transaction_id=row.transaction_id, position=row.position)


def _set_checkpoints(store: EventStore, mark: LedgerPosition) -> None:
    """Every projection's checkpoint at ``mark``: the events before it are folded (the bulk
    rows), as an append's inline fold leaves them."""
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM grove_projection_checkpoints"))
        for name in ("attempts", "calls", "rollouts", "contradictions"):
            conn.execute(
                text(
                    "INSERT INTO grove_projection_checkpoints (projection, transaction_id, "
                    "position) VALUES (:name, :xid, :position)"
                ),
                {"name": name, "xid": mark.transaction_id, "position": mark.position},
            )


class Built:
    """A built ledger: its store, blobs and attempts (those whose blobs exist apart)."""

    def __init__(self, store: EventStore, blobs: BlobStore, writer: AttemptWriter) -> None:
        self.store = store
        self.blobs = blobs
        self.writer = writer
        self.builder = LedgerBuilder(TRAINING_STREAM)
        self.calls = 0
        self.attempts: list[str] = []
        self.full_attempts: list[str] = []
        self.build_s = 0.0

    def add_tail(self, step: int) -> LedgerPosition:
        """Import a step's worth of selected, unfinalized attempts (``tail{step}-…``, blobs
        written) at the ledger's end; returns the mark before them."""
        mark = _mark(self.store)
        with self.store.engine.connect() as conn:  # others appended since (projectors)
            self.builder.position = conn.execute(
                text(
                    "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM "
                    "grove_events_position_seq"
                )
            ).scalar_one()
        for g in range(GROUPS_PER_STEP):
            self.builder.add_group(
                [
                    self.writer.attempt(f"tail{step}", g, r, full=True, finalize=False)
                    for r in range(ROLLOUTS_PER_GROUP)
                ]
            )
        _import(self.store, self.builder.take(), {TRAINING_STREAM})
        _set_checkpoints(self.store, _mark(self.store))
        return mark


def build(url: str, blobs: BlobStore, calls: int, seed: int = 0) -> Built:
    """A ledger of about ``calls`` captured calls (whole groups, every ``GROUPS_PER_STEP``
    groups published), its projection rows and checkpoints, vacuumed and analyzed."""
    start = time.perf_counter()
    migrate.upgrade(url)
    store = EventStore.open(url)
    built = Built(store, blobs, AttemptWriter(seed, blobs))
    planned_groups = max(1, calls // (CALLS_PER_ATTEMPT * ROLLOUTS_PER_GROUP))
    full_groups = {0, planned_groups // 2}
    group = 0
    while built.calls < calls or group % GROUPS_PER_STEP:
        attempts = [
            built.writer.attempt("body", group, r, full=group in full_groups)
            for r in range(ROLLOUTS_PER_GROUP)
        ]
        built.calls += sum(a.calls for a in attempts)
        built.attempts += [a.capture_key for a in attempts]
        if group in full_groups:
            built.full_attempts += [a.capture_key for a in attempts]
        built.builder.add_group(attempts)
        group += 1
        if group % CHUNK_GROUPS == 0 or (built.calls >= calls and group % GROUPS_PER_STEP == 0):
            _import(store, built.builder.take(), {TRAINING_STREAM})
    _set_checkpoints(store, _mark(store))
    with store.engine.begin() as conn:
        conn.execute(
            text("INSERT INTO grove_proj_streams (stream_id, version) VALUES (:s, :v)"),
            {"s": TRAINING_STREAM, "v": built.builder.steps},
        )
    with psycopg.connect(_dsn(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    built.build_s = time.perf_counter() - start
    return built


# -- measuring -----------------------------------------------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _timed_ms(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return (time.perf_counter() - start) * 1000


def lineage_query_ms(store: EventStore, keys: Sequence[str]) -> list[float]:
    """The lineage query's time for each key, warm (one pass first)."""
    query = text(QUERIES["calls"])
    with store.engine.connect() as conn:
        for key in keys:
            conn.execute(query, {"key": key}).all()
        return [_timed_ms(lambda k=key: conn.execute(query, {"key": k}).all()) for key in keys]


def lineage_plan(store: EventStore, key: str) -> list[str]:
    """``EXPLAIN`` of the lineage query for ``key``, one line per plan line."""
    with store.engine.connect() as conn:
        rows = conn.execute(text("EXPLAIN " + QUERIES["calls"]), {"key": key}).all()
    return [row[0] for row in rows]


def projector_step_ms(built: Built, step: int) -> float:
    """A step's attempts arrive at the ledger's end (imported, untimed); a projector that has
    read everything before them finalizes them (blobs read and verified) and publishes them as
    one step."""
    mark = built.add_tail(step)
    settings = ProjectorSettings(
        rollouts_per_group=ROLLOUTS_PER_GROUP,
        groups_per_step=GROUPS_PER_STEP,
        training_stream=f"training-tail{step}",
        capture_prefix=f"tail{step}-",
    )
    projector = Projector(built.store, built.blobs, settings)
    # Following the ledger: it has read everything before the step's attempts (a projector
    # started now would first read the whole ledger once; docs/scale.md).
    projector._progress.mark = mark
    start = time.perf_counter()
    projector.poll()
    published = projector.batch_for_step(0)
    elapsed = (time.perf_counter() - start) * 1000
    if published is None or len(published.rollouts) != GROUPS_PER_STEP * ROLLOUTS_PER_GROUP:
        raise RuntimeError(f"the projector did not publish tail {step} as one step: {published}")
    return elapsed


class Samples:
    """One ledger's timings, gathered over the rounds."""

    def __init__(self, built: Built, seed: int = 0) -> None:
        self.built = built
        rng = random.Random(seed)
        self.keys = rng.sample(built.attempts, min(LINEAGE_SAMPLE, len(built.attempts)))
        self.lineage: list[float] = []
        self.grove_lineage: list[float] = []
        self.replay: list[float] = []
        self.projector: list[float] = []

    def warm(self) -> None:
        """Read what the round reads once, untimed (caches), and check replay finds nothing."""
        store, blobs = self.built.store, self.built.blobs
        lineage_query_ms(store, self.keys)
        attempt_lineages(store, self.keys[0])
        for key in self.built.full_attempts:
            checks = replay(store, key, blobs=blobs)
            if checks.differences:
                raise RuntimeError(f"replay --verify of {key} differs: {checks.as_dict()}")

    def round(self, step: int) -> None:
        """One round: every timing once."""
        store, blobs = self.built.store, self.built.blobs
        self.lineage += lineage_query_ms(store, self.keys)
        self.grove_lineage += [
            _timed_ms(lambda k=k: attempt_lineages(store, k)) for k in self.keys[:TOOL_SAMPLE]
        ]
        self.replay += [
            _timed_ms(lambda k=k: replay(store, k, blobs=blobs)) for k in self.built.full_attempts
        ]
        self.projector.append(projector_step_ms(self.built, step))

    def figures(self) -> dict[str, Any]:
        """The figures of the ledger."""
        built = self.built
        plan = lineage_plan(built.store, self.keys[0])
        sizes = database_sizes(built.store)
        return {
            "calls": built.calls,
            "attempts": len(built.attempts),
            "build_s": round(built.build_s, 1),
            "lineage_ms_p50": round(_percentile(self.lineage, 0.5), 3),
            "lineage_ms_p99": round(_percentile(self.lineage, 0.99), 3),
            "grove_lineage_ms": round(statistics.median(self.grove_lineage), 2),
            "replay_ms": round(statistics.median(self.replay), 2),
            "projector_step_ms": round(statistics.median(self.projector), 1),
            "lineage_plan_index_only": not any("Seq Scan" in line for line in plan),
            "lineage_plan": plan,
            "postgres_bytes": sizes["database"],
            "relation_bytes": sizes["relations"],
            "blob_bytes_per_call": blob_bytes_per_call(built.store),
        }


def database_sizes(store: EventStore) -> dict[str, Any]:
    """The database's size, and each Grove table's (heap and TOAST) and index's size, in
    bytes."""
    with store.engine.connect() as conn:
        database = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
        relations = conn.execute(
            text(
                "SELECT c.relname, CASE WHEN c.relkind = 'r' THEN pg_table_size(c.oid) "
                "ELSE pg_relation_size(c.oid) END FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i') "
                "AND c.relname LIKE '%grove%' ORDER BY 2 DESC"
            )
        ).all()
    return {"database": database, "relations": {name: size for name, size in relations}}


def blob_bytes_per_call(store: EventStore) -> int:
    """Recorded blob bytes over committed calls."""
    with store.engine.connect() as conn:
        total, count = conn.execute(
            text("SELECT sum(blob_bytes), count(blob_bytes) FROM grove_proj_calls")
        ).one()
    return round(total / count)


def empty_database_bytes(admin_url: str) -> int:
    """The size of a freshly migrated, empty ledger database (subtracted from every size)."""
    database = Database(admin_url, f"grove_scale_{uuid.uuid4().hex[:12]}")
    try:
        migrate.upgrade(database.url)
        with psycopg.connect(_dsn(database.url)) as conn:
            return conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    finally:
        database.drop()


PROJECTION_TABLES = (
    "grove_proj_attempts",
    "grove_proj_calls",
    "grove_proj_rollouts",
    "grove_proj_streams",
    "grove_proj_contradictions",
)


def _snapshot(store: EventStore) -> dict[str, set[tuple[Any, ...]]]:
    with store.engine.connect() as conn:
        return {
            table: {tuple(row) for row in conn.execute(text(f"SELECT * FROM {table}"))}
            for table in PROJECTION_TABLES  # constant names
        }


def check_projections(store: EventStore) -> int:
    """Rebuild the projections with the fold (``grove.ledger.catch_up.rebuild``) and check that
    the rows written in bulk are the fold's, row for row; returns how many rows were compared."""
    written = _snapshot(store)
    rebuild(store)
    folded = _snapshot(store)
    for table in PROJECTION_TABLES:
        extra, missing = written[table] - folded[table], folded[table] - written[table]
        if extra or missing:
            raise RuntimeError(
                f"{table}: the bulk rows differ from the fold's: {len(extra)} rows only in bulk "
                f"(e.g. {sorted(extra, key=repr)[:1]}), {len(missing)} only in the fold "
                f"(e.g. {sorted(missing, key=repr)[:1]})"
            )
    return sum(len(rows) for rows in written.values())


def run(sizes: Sequence[int], admin_url: str | None = None, rounds: int = 3) -> dict[str, Any]:
    """Build a ledger per size (each in a fresh database), then time them in alternating
    rounds (each round visits the sizes in a rotated order, so that load from elsewhere on the
    machine falls on all of them alike); check the smallest's bulk projection rows against the
    fold last. On a cluster of its own unless ``admin_url`` names a server."""
    torch.set_num_threads(1)
    ordered = sorted(set(sizes))
    cluster = None
    if admin_url is None:
        cluster = ThrowawayCluster()
        admin_url = cluster.url
    databases: list[Database] = []
    samples: dict[int, Samples] = {}
    with tempfile.TemporaryDirectory(prefix="grove-bench-scale-") as directory:
        try:
            empty = empty_database_bytes(admin_url)
            for size in ordered:
                databases.append(Database(admin_url, f"grove_scale_{uuid.uuid4().hex[:12]}"))
                blobs = open_blob_store(str(Path(directory) / str(size)))
                samples[size] = Samples(build(databases[-1].url, blobs, size))
            for size in ordered:
                samples[size].warm()
            for r in range(rounds):
                for size in ordered[r % len(ordered) :] + ordered[: r % len(ordered)]:
                    samples[size].round(r)
            results = {}
            for size in ordered:
                figures = samples[size].figures()
                database = figures.pop("postgres_bytes")
                figures["postgres_bytes_per_call"] = round((database - empty) / figures["calls"])
                results[str(size)] = figures
            results[str(ordered[0])]["projection_rows_checked"] = check_projections(
                samples[ordered[0]].built.store
            )
        finally:
            for sample in samples.values():
                sample.built.store.close()
            for database in databases:
                database.drop()
            if cluster is not None:
                cluster.stop()
    smallest, largest = results[str(ordered[0])], results[str(ordered[-1])]
    growth = {name: round(largest[name] / smallest[name], 3) for name in FIGURES}
    return {
        "sizes": results,
        "lineage_ms_p99": {size: r["lineage_ms_p99"] for size, r in results.items()},
        "replay_ms": {size: r["replay_ms"] for size, r in results.items()},
        "growth": growth,
        "growth_largest_over_smallest": max(growth.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="stop at 100k calls")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sizes", help="comma-separated ledger sizes in calls (overrides)")
    parser.add_argument(
        "--url",
        help="a server to create the databases on (default: a throwaway cluster of its own)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds over the sizes")
    arguments = parser.parse_args()
    sizes = SIZES[:2] if arguments.quick else SIZES
    if arguments.sizes:
        sizes = tuple(int(s) for s in arguments.sizes.split(","))
    result = run(sizes, arguments.url, arguments.rounds)
    if arguments.json:
        print(json.dumps(result))
        return
    for size, figures in result["sizes"].items():
        print(f"-- {size} calls")
        for name, value in figures.items():
            if name not in ("lineage_plan", "relation_bytes"):
                print(f"{name:28} {value}")
    print(f"{'growth':28} {result['growth']}")
    print(f"{'growth_largest_over_smallest':28} {result['growth_largest_over_smallest']}")


if __name__ == "__main__":
    main()
