"""What durable acknowledgements cost: fsynced blob puts and SQLite ``synchronous=FULL``, each
beside the same work without the syncs, alternating in the same run.

Usage: ``python -m bench.durability [--quick] [--json] [--dir DIR]``

A captured call is answered only after its delta blob and its ``call.committed`` event are on
disk (``docs/reliability.md``, "Durability"). The baseline is the same code with the syncs taken
out: ``os.fsync`` replaced by a no-op (blob puts) and SQLite at ``synchronous=NORMAL`` (appends).
Medians in microseconds, over ``DIR`` (default: the system's temporary directory; its file system
is reported, since what an fsync costs is the file system's and the disk's):

- ``put_new_partition_us``: the first blob of an attempt (creates ``staging/KEY/``: 3 fsyncs);
- ``put_us``: a later blob of the attempt (2 fsyncs: the bytes, the name);
- ``appends_us``: one call's two appends (``call.intended``, ``call.committed``) on SQLite;
- ``captured_call_us``: the ledger and storage work of one call of a 3-call attempt (its share of
  the ``attempt.opened`` append, both appends and the put), which is what the gateway adds to
  inference; ``durable_over_unsynced`` is its ratio (the cost of durability, >= 1).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import event

from grove.ledger import migrate
from grove.ledger.store import EventStore
from grove.storage import BlobStore, open_blob_store, staging_key
from tests.integration.ledger.scenario import committed, intended, opened

BLOB_BYTES = 1_600  # a delta of 100 observation and 100 generated tokens with their logprobs
CALLS_PER_ATTEMPT = 3


@contextlib.contextmanager
def unsynced_files() -> Iterator[None]:
    """``os.fsync`` as a no-op: the blob store's puts without their syncs."""
    real = os.fsync
    os.fsync = lambda fd: None  # type: ignore[assignment]
    try:
        yield
    finally:
        os.fsync = real


def sqlite_store(directory: Path, synchronous: str) -> EventStore:
    """An event store on a fresh SQLite ledger in ``directory`` at ``synchronous``."""
    url = f"sqlite:///{directory / f'ledger-{synchronous.lower()}.db'}"
    migrate.upgrade(url)
    store = EventStore.open(url)

    @event.listens_for(store.engine, "connect")
    def _synchronous(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute(f"PRAGMA synchronous={synchronous}")

    return store


class Side:
    """One side of the comparison: its ledger, its blob store, and whether files are synced."""

    def __init__(self, directory: Path, *, durable: bool) -> None:
        directory.mkdir(parents=True)
        self.durable = durable
        self.store = sqlite_store(directory, "FULL" if durable else "NORMAL")
        self.blobs: BlobStore = open_blob_store(str(directory / "blobs"))
        self.samples: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Time the block (files synced or not as this side is), recording microseconds."""
        with contextlib.nullcontext() if self.durable else unsynced_files():
            start = time.perf_counter()
            yield
            elapsed = time.perf_counter() - start
        self.samples.setdefault(name, []).append(elapsed * 1e6)

    def attempt(self, data: bytes) -> None:
        """One attempt of ``CALLS_PER_ATTEMPT`` calls, each stage timed."""
        key = f"att-{uuid.uuid4().hex[:12]}"
        start = time.perf_counter()
        with self.timed("open"):
            self.store.append(key, [opened(key)], expected_version=0)
        for index in range(CALLS_PER_ATTEMPT):
            call, version = f"c{index}", 1 + 2 * index
            with self.timed("intend"):
                self.store.append(key, [intended(call)], version)
            with self.timed("put_new_partition" if index == 0 else "put"):
                self.blobs.put(staging_key(key, call), data)
            with self.timed("commit"):
                self.store.append(key, [committed(key, call)], version + 1)
        per_call = (time.perf_counter() - start) * 1e6 / CALLS_PER_ATTEMPT
        self.samples.setdefault("captured_call", []).append(per_call)

    def medians(self) -> dict[str, float]:
        """Median microseconds of each stage."""
        appends = [
            i + c for i, c in zip(self.samples["intend"], self.samples["commit"], strict=True)
        ]
        return {
            "put_new_partition_us": round(statistics.median(self.samples["put_new_partition"]), 1),
            "put_us": round(statistics.median(self.samples["put"]), 1),
            "appends_us": round(statistics.median(appends), 1),
            "captured_call_us": round(statistics.median(self.samples["captured_call"]), 1),
        }

    def close(self) -> None:
        self.store.close()


def file_system(path: Path) -> str:
    """The type of the file system holding ``path`` (from /proc/mounts), or "unknown"."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    resolved = str(path.resolve())
    holding = [m for m in mounts if resolved == m[0] or resolved.startswith(m[0].rstrip("/") + "/")]
    return max(holding, key=lambda m: len(m[0]))[1] if holding else "unknown"


def run(quick: bool, directory: Path | None) -> dict[str, Any]:
    """Alternate attempts between the durable and the unsynced side; their medians and ratios."""
    attempts = 20 if quick else 200
    data = os.urandom(BLOB_BYTES)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        root = Path(scratch)
        durable, unsynced = (
            Side(root / "durable", durable=True),
            Side(root / "unsynced", durable=False),
        )
        try:
            for _ in range(attempts):
                durable.attempt(data)
                unsynced.attempt(data)
            on, off = durable.medians(), unsynced.medians()
        finally:
            durable.close()
            unsynced.close()
        system = file_system(root)
    return {
        "file_system": system,
        "attempts": attempts,
        "calls_per_attempt": CALLS_PER_ATTEMPT,
        "durable": on,
        "unsynced": off,
        "durable_over_unsynced": {
            name: round(on[name] / off[name], 2) for name in on if off[name] > 0
        },
    }


def main() -> None:
    """Run the benchmark and print a table (or one JSON object)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer attempts (CI smoke)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dir", type=Path, default=None, help="measure on this directory")
    args = parser.parse_args()
    result = run(args.quick, args.dir)
    if args.json:
        print(json.dumps(result))
        return
    print(f"file system: {result['file_system']}; {result['attempts']} attempts of 3 calls")
    print(f"{'median us':<24}{'durable':>12}{'unsynced':>12}{'ratio':>8}")
    for name, value in result["durable"].items():
        ratio = result["durable_over_unsynced"].get(name, float("nan"))
        print(f"{name:<24}{value:>12}{result['unsynced'][name]:>12}{ratio:>8}")


if __name__ == "__main__":
    main()
