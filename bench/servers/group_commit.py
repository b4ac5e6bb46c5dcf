"""Does PostgreSQL's own group commit cover Grove's concurrent appends? (``bench/gateway.py``)

Threads append one ``attempt.opened`` each to a fresh stream through ``EventStore.append`` (its
transaction, the inline projection fold and the durable commit, as a captured call's intent),
first one thread, then many, on a fresh database. For each: appends per second, and the WAL
flushes the server made per append (``pg_stat_wal.wal_sync``, read after the store's
connections closed, so that their backends have reported their counts; the server's other
databases count too, so on a shared server the figure is an upper bound). One flush per append
means every commit waits for its own; well below one means concurrent commits share a flush
(PostgreSQL flushes the WAL up to the latest record, which covers every commit waiting for it),
and Grove need not batch.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

APPENDS: Final = 120  # per concurrency, over all threads


def wal_syncs(admin: Any) -> int:
    """The server's WAL flushes so far (``pg_stat_wal.wal_sync``)."""
    admin.execute("SELECT pg_stat_clear_snapshot()")
    row = admin.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0])


def measure(url: str, admin_dsn: str, threads: Sequence[int]) -> dict[str, dict[str, float]]:
    """``{threads: {"appends_per_s", "wal_flushes_per_append", "append_ms_p50"}}`` on the
    database at ``url`` (migrated), each concurrency with ``APPENDS`` appends."""
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        return {str(count): _round(url, admin, count) for count in threads}


def _round(url: str, admin: Any, count: int) -> dict[str, float]:
    """``APPENDS`` appends from ``count`` threads through a fresh store."""
    from grove.ledger.events import AttemptOpened
    from grove.ledger.store import EventStore

    store = EventStore.open(url)
    run = uuid.uuid4().hex[:8]
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(count + 1)

    def append(worker: int) -> None:
        barrier.wait()
        for n in range(APPENDS // count):
            key = f"gc-{run}-{worker}-{n}"
            opened = AttemptOpened(
                capture_key=key,
                rollout_id=key,
                prompt_group="gc",
                rollout_index=0,
                policy_version=0,
                model_fingerprint="bench",
                template_fingerprint="bench",
            )
            start = time.perf_counter()
            store.append(key, [opened], 0)
            with lock:
                latencies.append(time.perf_counter() - start)

    workers = [threading.Thread(target=append, args=(w,)) for w in range(count)]
    for worker in workers:
        worker.start()
    before = wal_syncs(admin)
    barrier.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - began
    store.close()  # the backends exit and report their WAL counts
    time.sleep(0.5)
    flushes = wal_syncs(admin) - before
    latencies.sort()
    return {
        "appends_per_s": round(len(latencies) / wall, 1),
        "wal_flushes_per_append": round(flushes / len(latencies), 3),
        "append_ms_p50": round(1000 * latencies[len(latencies) // 2], 3),
    }


def summary(results: Mapping[str, Mapping[str, float]]) -> str:
    """One line per concurrency."""
    return "; ".join(
        f"{threads} thread(s): {r['appends_per_s']} appends/s, p50 {r['append_ms_p50']} ms, "
        f"{r['wal_flushes_per_append']} WAL flushes per append"
        for threads, r in results.items()
    )
