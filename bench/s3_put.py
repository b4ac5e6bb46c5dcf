"""S3 put and read: s3fs against botocore's synchronous client, on the same filesystem.

Usage: ``python -m bench.s3_put [--quick] [--json]``

The capture path stores each model call's tensors as a blob before it answers, so the put's wall
time is part of every call and its CPU time is the server's; training and roaming gateways read
the blobs back. Two ways to send each request to a moto S3 server in its own process (not
competing for this one's GIL; ``bench/servers/gateway.py``'s ``moto_server``):

- ``s3fs``: aiobotocore on s3fs's event-loop thread, the calling thread waiting for it (what
  Grove used first): ``fs.pipe_file(path, data, mode="create")`` for a put, s3fs's own
  ``cat_file`` (a HEAD to size the object, then a GET) for a read;
- ``botocore``: botocore's synchronous client on the calling thread (``storage/s3.py``):
  ``S3Backend.create`` (one ``PutObject`` with ``If-None-Match: *``) and ``fs.cat_file`` (one
  ``GetObject``).

Both come from one ``open_blob_store`` (same endpoint, credentials, retries, timeouts), on random
bytes of two sizes: 4 KiB (a call's delta) and 1 MiB (a long context or an image). Rounds
alternate which way goes first, so that load from elsewhere on the machine falls on both alike;
each round is a batch of operations on fresh keys per way (for reads, written first, untimed).
Figures per row and way: wall p50 and p99 of single operations over all rounds, CPU per operation
(``time.process_time``: every thread of this process, s3fs's loop thread included; the server's
own CPU is not counted; the median over rounds of a batch's CPU over its operations) and
operations per second. The ``4 threads`` rows run the 4 KiB batch from 4 threads at once, as the
gateway's worker threads do. Ratios are s3fs over botocore (above 1: botocore is cheaper).

moto answers every request with ``Connection: close``, so each request here opens a TCP
connection (both ways alike); a real S3 endpoint keeps connections alive, and costs less CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fsspec.asyn import sync

from bench.servers.gateway import moto_server
from grove.storage import BlobStore, open_blob_store
from grove.storage.s3 import S3Backend

SIZES = {"4KiB": 4 << 10, "1MiB": 1 << 20}
THREADS = 4
Operation = Callable[[str, bytes], object]
"""One put of ``data`` to ``path``, or one read of ``path`` (which then holds ``data``)."""


def puts(store: BlobStore) -> dict[str, Operation]:
    """The two puts under comparison, on ``store``'s filesystem."""
    fs = store.fs
    backend = S3Backend(fs)  # the store's backend, as ``open_blob_store`` makes it

    def s3fs_put(path: str, data: bytes) -> None:
        fs.pipe_file(path, data, mode="create")

    return {"s3fs": s3fs_put, "botocore": backend.create}


def reads(store: BlobStore) -> dict[str, Operation]:
    """The two whole-object reads under comparison, on ``store``'s filesystem."""
    fs = store.fs

    def s3fs_read(path: str, data: bytes) -> bytes:
        return sync(fs.loop, fs._cat_file, path)  # s3fs's own cat_file

    def botocore_read(path: str, data: bytes) -> bytes:
        return fs.cat_file(path)

    return {"s3fs": s3fs_read, "botocore": botocore_read}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _batch(
    store: BlobStore, operation: Operation, data: bytes, count: int, threads: int, *, stored: bool
) -> tuple[list[float], float, float]:
    """``operation`` on ``count`` fresh keys from ``threads`` threads (``stored``: the keys hold
    ``data`` first, untimed): each operation's wall time, the batch's process CPU time and its
    wall time. The keys are deleted afterwards, untimed."""
    run = uuid.uuid4().hex[:10]
    paths = [store.path(f"bench/{run}/b{i}") for i in range(count)]
    if stored:
        store.fs.pipe({path: data for path in paths})
    walls: list[float] = []

    def one(path: str) -> None:
        start = time.perf_counter()
        operation(path, data)
        walls.append(time.perf_counter() - start)

    cpu, wall = time.process_time(), time.perf_counter()
    if threads == 1:
        for path in paths:
            one(path)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, paths))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    store.fs.rm(paths)
    return walls, cpu, wall


def compare(
    store: BlobStore,
    operations: dict[str, Operation],
    data: bytes,
    *,
    rounds: int,
    per_round: int,
    threads: int = 1,
    stored: bool = False,
) -> dict[str, Any]:
    """Both ways on ``data``, alternating which goes first, ``rounds`` batches of ``per_round``."""
    walls: dict[str, list[float]] = {name: [] for name in operations}
    cpus: dict[str, list[float]] = {name: [] for name in operations}
    rates: dict[str, list[float]] = {name: [] for name in operations}
    order = list(operations)
    for index in range(rounds):
        for name in order if index % 2 else reversed(order):
            batch_walls, cpu, wall = _batch(
                store, operations[name], data, per_round, threads, stored=stored
            )
            walls[name] += batch_walls
            cpus[name].append(cpu / per_round)
            rates[name].append(per_round / wall)
    result: dict[str, Any] = {}
    for name in operations:
        result[name] = {
            "wall_p50_ms": round(statistics.median(walls[name]) * 1e3, 3),
            "wall_p99_ms": round(_percentile(walls[name], 0.99) * 1e3, 3),
            "cpu_ms": round(statistics.median(cpus[name]) * 1e3, 3),
            "per_s": round(statistics.median(rates[name]), 1),
        }
    s3fs, botocore = result["s3fs"], result["botocore"]
    result["s3fs_over_botocore"] = {
        figure: round(s3fs[figure] / botocore[figure], 3)
        for figure in ("wall_p50_ms", "wall_p99_ms", "cpu_ms")
    }
    return result


def run(quick: bool) -> dict[str, Any]:
    """Every figure of this benchmark, as one JSON-ready dict."""
    rounds, per_round = (4, 25) if quick else (10, 50)
    with moto_server() as (env, ready, *_):
        ready()
        store = open_blob_store(
            f"s3://grove-bench/s3-put-{uuid.uuid4().hex[:8]}",
            endpoint_url=env["AWS_ENDPOINT_URL_S3"],
            access_key_id=env["AWS_ACCESS_KEY_ID"],
            secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )
        operations = {"put": puts(store), "read": reads(store)}
        for kind in operations.values():  # make both clients first
            for operation in kind.values():
                _batch(store, operation, b"warm", 3, 1, stored=kind is operations["read"])
        rows: dict[str, Any] = {}
        for kind, ways in operations.items():
            for size_name, size in SIZES.items():
                rows[f"{kind} {size_name}, 1 thread"] = compare(
                    store,
                    ways,
                    os.urandom(size),
                    rounds=rounds,
                    per_round=per_round if size < 1 << 20 else per_round // 5,
                    stored=kind == "read",
                )
            rows[f"{kind} 4KiB, {THREADS} threads"] = compare(
                store,
                ways,
                os.urandom(SIZES["4KiB"]),
                rounds=rounds,
                per_round=per_round,
                threads=THREADS,
                stored=kind == "read",
            )
    return {"rows": rows, "quick": quick}


def _print_table(result: dict[str, Any]) -> None:
    print("S3 put and read: wall of single operations, process CPU per operation (all threads)")
    print(f"{'':34}{'p50 ms':>9}{'p99 ms':>9}{'CPU ms':>9}{'ops/s':>9}")
    for label, figures in result["rows"].items():
        for way in ("s3fs", "botocore"):
            f = figures[way]
            print(
                f"{label + ', ' + way:<34}{f['wall_p50_ms']:>9.2f}{f['wall_p99_ms']:>9.2f}"
                f"{f['cpu_ms']:>9.2f}{f['per_s']:>9.0f}"
            )
        r = figures["s3fs_over_botocore"]
        print(
            f"{'  s3fs / botocore':<34}{r['wall_p50_ms']:>9.2f}{r['wall_p99_ms']:>9.2f}"
            f"{r['cpu_ms']:>9.2f}"
        )


def main() -> None:
    """Run the benchmark; print a table, or one JSON object with ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and puts")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = run(args.quick)
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)


if __name__ == "__main__":
    main()
