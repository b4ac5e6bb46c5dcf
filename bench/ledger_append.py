"""Ledger append throughput and gap-free reading, each beside its baseline in the same run.

Usage: ``python -m bench.ledger_append [--quick] [--json]``

Per database (PostgreSQL at ``GROVE_BENCH_DATABASE_URL`` or 127.0.0.1:5432, and SQLite):
- ``single_events_per_s``: ``EventStore.append`` of one event per transaction;
- ``batched_events_per_s``: ``EventStore.append`` of ``BATCH`` events per transaction (with
  validation, the idempotency and version checks, and the inline fold into the projection
  tables: the events are ``call.failed`` of a stream never opened, so the fold records each one
  as a contradiction, a second row per event); ``batched_events_per_s_no_fold`` the same appends
  without the fold;
- ``raw_copy_events_per_s``: the same event rows by raw ``COPY`` (PostgreSQL) or a raw
  ``executemany`` of the sqlite3 driver (SQLite), ``ROUND`` rows per transaction — the floor
  cost of getting the bytes into the table; ``raw_copy_folded_events_per_s``: the same, with
  the contradiction rows the fold records for those events written beside them (each event's
  row and its contradiction's row, in the same transaction) — the floor cost of the rows a
  folded append writes;
- ``batched_over_copy``: folded appends over the raw writing of the same rows (aim >= 0.5);
  ``batched_over_copy_no_fold``: unfolded appends over the raw event rows;
  ``batched_over_events_copy``: folded appends over the raw event rows alone (what the fold
  costs on top of everything else). The four alternate round by round (``ROUND`` events each),
  so a busy machine slows them alike.
- ``capture_call_us_plain`` / ``capture_call_us_inline``: one captured call's two appends
  (``call.intended``, ``call.committed`` on an open attempt), median microseconds, without and
  with the inline fold into the projection tables, alternating in the same process;
- ``applier_cpu_ms_per_append``: this thread's CPU milliseconds per one-event append of an
  ``attempt.opened`` (folded inline: the applier inserts the attempt's row), the fold's statement
  built once; ``applier_cpu_ms_per_append_uncached`` the same appends with that statement built
  anew for every event (as the fold did before), alternating round by round in the same process;
  ``applier_cpu_over_uncached`` the first over the second (CPU time, not wall: the machine's
  other work does not count);
Then 8 writer processes append while two readers tail the ledger: one keeps only the last
position (``missed_events_position_only``), one is Grove's (``missed_events_grove``, must be 0).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import psycopg
from sqlalchemy import Connection, select
from sqlalchemy.engine import make_url

from grove.ledger import event_appliers, migrate
from grove.ledger.database import open_engine
from grove.ledger.events import AttemptOpened, CallFailed, LedgerPosition
from grove.ledger.lifecycle import NEVER_OPENED, contradiction_entry
from grove.ledger.postgres import COPY_COLUMNS
from grove.ledger.schema import EVENTS, PROJ_CONTRADICTIONS
from grove.ledger.store import EventStore
from tests.integration.ledger.scenario import committed, intended, opened

BATCH = 500
ROUND = 5_000
_CONTRADICTION_NAMES = "capture_key, stream_version, position, event_type, call_id, contradiction"
PG_ADMIN = os.environ.get(
    "GROVE_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _event(i: int) -> CallFailed:
    return CallFailed(call_id=f"c{i}", reason="engine_error", detail="benchmark event payload")


def _rows(n: int, stream: str, after: int = 0) -> list[tuple]:
    payload = json.dumps(_event(0).model_dump(mode="json"), separators=(",", ":"))
    return [
        (uuid.uuid4().hex, stream, v, "call.failed", 1, payload)
        for v in range(after + 1, after + n + 1)
    ]


def _contradiction_rows(n: int, stream: str, after: int = 0) -> list[tuple]:
    """The contradiction rows the fold records for ``_rows(n, stream, after)``: each
    ``call.failed`` of a stream never opened (its version stands in for its position)."""
    events = [_event(v % BATCH) for v in range(after, after + n)]
    return [
        (stream, v, v, "call.failed", event.call_id, contradiction_entry(event, NEVER_OPENED))
        for v, event in enumerate(events, start=after + 1)
    ]


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1)


def _append_rates(url: str, singles: int, batched: int, raw_round) -> dict[str, float]:
    """One event per transaction, then rounds of batched appends (folded and not) alternating
    with ``raw_round(folded)``, the baseline's ``ROUND`` rows (with their contradiction rows when
    ``folded``), each round in the same order."""
    # Events are built before the clock starts: the raw baseline gets ready-made rows too.
    stores = {fold: EventStore(open_engine(url), project_inline=fold) for fold in (True, False)}
    events = [_event(i) for i in range(max(singles, BATCH))]
    start = time.perf_counter()
    for i in range(singles):
        stores[True].append("single", [events[i]], expected_version=i)
    single_s = time.perf_counter() - start
    seconds = {True: 0.0, False: 0.0, "raw": 0.0, "raw_folded": 0.0}
    versions = {True: 0, False: 0}
    for _ in range(batched // ROUND):
        for fold, store in stores.items():
            start = time.perf_counter()
            for _ in range(ROUND // BATCH):
                store.append(f"batched-{fold}", events[:BATCH], expected_version=versions[fold])
                versions[fold] += BATCH
            seconds[fold] += time.perf_counter() - start
        seconds["raw"] += raw_round(False)
        seconds["raw_folded"] += raw_round(True)
    for store in stores.values():
        store.close()
    count = batched // ROUND * ROUND
    return {
        "single_events_per_s": _rate(singles, single_s),
        "batched_events_per_s": _rate(count, seconds[True]),
        "batched_events_per_s_no_fold": _rate(count, seconds[False]),
        "raw_events_per_s": _rate(count, seconds["raw"]),
        "raw_folded_events_per_s": _rate(count, seconds["raw_folded"]),
    }


def _ratios(result: dict[str, object], raw_name: str) -> None:
    raw, raw_folded = result.pop("raw_events_per_s"), result.pop("raw_folded_events_per_s")
    result[f"raw_{raw_name}_events_per_s"] = raw
    result[f"raw_{raw_name}_folded_events_per_s"] = raw_folded
    folded, unfolded = result["batched_events_per_s"], result["batched_events_per_s_no_fold"]
    result["batched_over_copy"] = round(folded / raw_folded, 3)
    result["batched_over_copy_no_fold"] = round(unfolded / raw, 3)
    result["batched_over_events_copy"] = round(folded / raw, 3)


def _capture_costs(url: str, calls: int) -> dict[str, float]:
    """Median microseconds of one call's intent and commit appends, plain beside inline."""
    samples: dict[bool, list[float]] = {False: [], True: []}
    stores = {inline: EventStore(open_engine(url), project_inline=inline) for inline in samples}
    for inline, store in stores.items():
        store.append(f"cap-{inline}", [opened(f"cap-{inline}")], expected_version=0)
    for i in range(calls):
        for inline, store in stores.items():
            key, version = f"cap-{inline}", 1 + 2 * i
            pair = [intended(f"c{i}"), committed(key, f"c{i}")]
            start = time.perf_counter()
            store.append(key, [pair[0]], expected_version=version)
            store.append(key, [pair[1]], expected_version=version + 1)
            samples[inline].append(time.perf_counter() - start)
    for store in stores.values():
        store.close()
    return {
        f"capture_call_us_{'inline' if inline else 'plain'}": round(
            statistics.median(times) * 1e6, 1
        )
        for inline, times in samples.items()
    }


def _opened_built_per_event(conn: Connection, item: event_appliers.Folded) -> bool:
    """The opening's applier as it was: its statement built (and its cache key generated) for
    every event, then executed with the event's values."""
    statement = event_appliers._open_statement(event_appliers.dialect_insert(conn))
    event = item.event
    assert isinstance(event, AttemptOpened)  # the opening's applier folds openings only
    parameters = event_appliers._open_parameters(item, event)
    return conn.execute(statement, parameters).first() is not None


@contextmanager
def _openings_built_per_event() -> Iterator[None]:
    """The inline fold applies ``attempt.opened`` with ``_opened_built_per_event`` meanwhile."""
    appliers = event_appliers.APPLIERS
    built_once = appliers[AttemptOpened.type]
    appliers[AttemptOpened.type] = _opened_built_per_event
    try:
        yield
    finally:
        appliers[AttemptOpened.type] = built_once


def _applier_cpu(url: str, rounds: int, per_round: int = 100) -> dict[str, float]:
    """This thread's CPU per one-event ``attempt.opened`` append, the fold's statement built once
    beside built per event, alternating ``rounds`` rounds of ``per_round`` appends each."""
    store = EventStore(open_engine(url), project_inline=True)
    cpu = {"once": 0.0, "per_event": 0.0}
    store.append("applier-warm", [opened("applier-warm")], expected_version=0)
    for r in range(rounds):
        for how in cpu:
            keys = [f"applier-{how}-{r}-{i}" for i in range(per_round)]
            events = [opened(key) for key in keys]
            with _openings_built_per_event() if how == "per_event" else nullcontext():
                start = time.thread_time()
                for key, event in zip(keys, events, strict=True):
                    store.append(key, [event], expected_version=0)
                cpu[how] += time.thread_time() - start
    store.close()
    once, per_event = (cpu[how] * 1e3 / (rounds * per_round) for how in ("once", "per_event"))
    return {
        "applier_cpu_ms_per_append": round(once, 3),
        "applier_cpu_ms_per_append_uncached": round(per_event, 3),
        "applier_cpu_over_uncached": round(once / per_event, 3),
    }


def _raw_copy_round(dsn: str):
    """A function that writes the next ``ROUND`` rows by raw ``COPY`` (with their contradiction
    rows when ``folded``) and returns its seconds."""
    done = {False: 0, True: 0}
    columns = ", ".join(COPY_COLUMNS)

    def round_s(folded: bool) -> float:
        stream = f"raw-{folded}"
        rows = _rows(ROUND, stream, done[folded])
        contradictions = _contradiction_rows(ROUND, stream, done[folded]) if folded else []
        done[folded] += ROUND
        with psycopg.connect(dsn) as conn:
            start = time.perf_counter()
            with conn.cursor() as cur:
                with cur.copy(f"COPY grove_events ({columns}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                if contradictions:
                    table = PROJ_CONTRADICTIONS.name
                    with cur.copy(f"COPY {table} ({_CONTRADICTION_NAMES}) FROM STDIN") as copy:
                        for row in contradictions:
                            copy.write_row(row)
            conn.commit()
            return time.perf_counter() - start

    return round_s


def _raw_sqlite_round(path: str):
    """A function that writes the next ``ROUND`` rows by a raw ``executemany`` (with their
    contradiction rows when ``folded``) and returns its seconds."""
    done = {False: 0, True: 0}

    def round_s(folded: bool) -> float:
        stream = f"raw-{folded}"
        rows = _rows(ROUND, stream, done[folded])
        contradictions = _contradiction_rows(ROUND, stream, done[folded]) if folded else []
        done[folded] += ROUND
        conn = sqlite3.connect(path, isolation_level=None)
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            f"INSERT INTO grove_events ({', '.join(COPY_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        if contradictions:
            conn.executemany(
                f"INSERT INTO {PROJ_CONTRADICTIONS.name} ({_CONTRADICTION_NAMES}) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                contradictions,
            )
        conn.execute("COMMIT")
        seconds = time.perf_counter() - start
        conn.close()
        return seconds

    return round_s


def _writer(url: str, index: int, count: int) -> None:
    store = EventStore.open(url)
    for i in range(0, count, 5):
        store.append(f"w{index}", [_event(i + j) for j in range(5)])
    store.close()


def _position_only_reader(url: str, done, queue, total: int) -> None:
    """The naive tailer: remembers the last position it saw and asks for anything above it
    (``total`` is unused: it cannot wait for what it skipped)."""
    del total
    store = EventStore.open(url)
    last, seen = 0, set()
    draining = 0
    while draining < 3:
        draining += done.is_set()
        with store.engine.connect() as conn:
            rows = conn.execute(
                select(EVENTS.c.position, EVENTS.c.event_id)
                .where(EVENTS.c.position > last)
                .order_by(EVENTS.c.position)
                .limit(1000)
            ).all()
        for row in rows:
            seen.add(row.event_id)  # all streams; only the writers' events are compared
            last = row.position
    store.close()
    queue.put(("position_only", seen))


def _grove_reader(url: str, done, queue, total: int) -> None:
    """Grove's reader. Its horizon is the oldest running transaction of the whole server, so
    after the writers finish it keeps reading until it has seen all ``total`` events (a
    transaction elsewhere on the server may hold it back for a while, never make it skip)."""
    store = EventStore.open(url)
    mark, seen = LedgerPosition(position=0), set()
    deadline = None
    while len(seen) < total:
        if done.is_set():
            deadline = deadline or time.monotonic() + 120
            if time.monotonic() > deadline:
                break
        batch = store.read_after(mark, limit=1000)
        seen.update(e.event_id for e in batch.events if e.stream_id.startswith("w"))
        mark = batch.mark
    store.close()
    queue.put(("grove", seen))


def _missed_events(url: str, writers: int, per_writer: int) -> dict[str, int]:
    ctx = multiprocessing.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Event()
    readers = [
        ctx.Process(target=fn, args=(url, done, queue, writers * per_writer))
        for fn in (_position_only_reader, _grove_reader)
    ]
    procs = [ctx.Process(target=_writer, args=(url, i, per_writer)) for i in range(writers)]
    for proc in readers + procs:
        proc.start()
    for proc in procs:
        proc.join()
    done.set()  # each reader polls three more times, then reports what it saw
    results = dict(queue.get() for _ in readers)
    for proc in readers:
        proc.join()
    store = EventStore.open(url)
    with store.engine.connect() as conn:
        written = set(
            conn.execute(select(EVENTS.c.event_id).where(EVENTS.c.stream_id.like("w%"))).scalars()
        )
    store.close()
    return {
        "events_written_by_8_writers": len(written),
        "missed_events_position_only": len(written - results["position_only"]),
        "missed_events_grove": len(written - results["grove"]),
    }


def bench_postgres(quick: bool) -> dict[str, object]:
    admin = make_url(PG_ADMIN)
    admin_dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"grove_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.set(database=name).render_as_string(hide_password=False)
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        migrate.upgrade(url)
        singles, batched = (300, 5_000) if quick else (2_000, 50_000)
        result: dict[str, object] = _append_rates(url, singles, batched, _raw_copy_round(dsn))
        _ratios(result, "copy")
        result.update(_capture_costs(url, singles))
        result.update(_applier_cpu(url, 3 if quick else 10))
        result.update(_missed_events(url, 8, 500 if quick else 5_000))
        return result
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def bench_sqlite(quick: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/ledger.db"
        url = f"sqlite:///{path}"
        migrate.upgrade(url)
        singles, batched = (300, 5_000) if quick else (2_000, 50_000)
        result: dict[str, object] = _append_rates(url, singles, batched, _raw_sqlite_round(path))
        _ratios(result, "executemany")
        result.update(_capture_costs(url, singles))
        result.update(_applier_cpu(url, 3 if quick else 10))
        return result


def main() -> None:
    """Run the benchmark and print a table, or one JSON object with ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    report = {"postgresql": bench_postgres(args.quick), "sqlite": bench_sqlite(args.quick)}
    report["batched_over_copy"] = report["postgresql"]["batched_over_copy"]
    for key in ("batched_over_copy_no_fold", "batched_over_events_copy"):
        report[key] = report["postgresql"][key]
    for key in ("applier_cpu_ms_per_append", "applier_cpu_over_uncached"):
        report[key] = report["postgresql"][key]
    report["missed_events_position_only"] = report["postgresql"]["missed_events_position_only"]
    report["missed_events_grove"] = report["postgresql"]["missed_events_grove"]
    if args.json:
        print(json.dumps(report))
        return
    for database in ("postgresql", "sqlite"):
        print(f"\n{database}")
        for key, value in report[database].items():
            print(f"  {key:34} {value}")


if __name__ == "__main__":
    main()
