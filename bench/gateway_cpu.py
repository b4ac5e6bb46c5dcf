"""Grove's gateway CPU per call beside an earlier revision's, in one run, phases interleaved.

Usage: ``python -m bench.gateway_cpu [--baseline REV [--without PACKAGE ...]] [--quick] [--json]``

Two server processes as ``bench/gateway.py`` starts them (``bench/servers/gateway.py``: the plain
server and Grove on PostgreSQL + local blobs, the instant engine): one imports the checkout's
Grove, the other ``REV``'s (``bench/support/baseline.py``; ``--without uvloop`` hides a package
the revision did not use, as it was installed). Without ``--baseline`` both run the checkout: an
A/A run, whose ratio shows the bench's own spread. One client plays attempts of 3 chained calls
(opening and result included, as in ``bench/gateway.py``), in short phases that alternate
between the two processes, and between Grove and the plain server in each, the order reversed
every round, so that both revisions see the same load. Each process's own CPU clock over its
phases gives ``grove_server_cpu_ms_per_call`` and ``plain_server_cpu_ms_per_call`` per revision,
and ``cpu_over_baseline`` (today's Grove over the revision's; ``plain_over_baseline`` the same
for the plain server, which follows the server settings of its revision's Grove).

PostgreSQL as for ``bench/gateway.py``; none reachable: the bench says so and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Final

from bench.gateway import run_phase
from bench.servers.gateway import ServerProcess, postgres_databases
from bench.support.baseline import baseline_tree

CALLS: Final = 3
SIDES: Final = ("current", "baseline")


def measure(
    revision: str | None, without: tuple[str, ...], rounds: int, attempts: int
) -> dict[str, Any]:
    """Interleaved phases on both revisions (None: the checkout on both sides); the figures per
    revision and their ratios."""
    tree = None if revision is None else baseline_tree(revision, without)
    with contextlib.ExitStack() as stack:
        databases = stack.enter_context(postgres_databases(SIDES))
        if isinstance(databases, str):
            raise SystemExit(f"bench/gateway_cpu.py needs PostgreSQL: {databases}")
        workdir = Path(tempfile.mkdtemp(prefix="grove-bench-gateway-cpu-"))
        stack.callback(shutil.rmtree, workdir, True)
        servers: dict[str, ServerProcess] = {}
        for side in SIDES:
            specs = [
                {"name": "plain", "kind": "plain"},
                {
                    "name": "grove",
                    "kind": "grove",
                    "database_url": databases[side],
                    "blob_url": str(workdir / side / "blobs"),
                    "workdir": str(workdir / side),
                },
            ]
            env = {"PYTHONPATH": str(tree)} if side == "baseline" and tree else {}
            servers[side] = ServerProcess(specs, env, workdir / f"{side}.log")
            stack.callback(servers[side].stop)
        spent = {(side, kind): [0.0, 0] for side in SIDES for kind in ("grove", "plain")}
        for round_ in range(-1, rounds):  # round -1 warms up: connections, caches, statements
            for side in SIDES if round_ % 2 else SIDES[::-1]:
                for kind in ("grove", "plain") if round_ % 2 else ("plain", "grove"):
                    server = servers[side]
                    server.command("take")
                    phase = run_phase(
                        server.base_urls[kind],
                        grove=kind == "grove",
                        clients=1,
                        attempts=attempts,
                        calls=CALLS,
                    )
                    if round_ >= 0:
                        spent[side, kind][0] += server.command("take")["cpu_s"]
                        spent[side, kind][1] += phase.calls
    figures: dict[str, Any] = {
        "revision": revision or "the checkout",
        "without": list(without),
        "rounds": rounds,
    }
    for side in SIDES:
        for kind in ("grove", "plain"):
            cpu_s, calls = spent[side, kind]
            figures.setdefault(side, {})[f"{kind}_server_cpu_ms_per_call"] = round(
                1000 * cpu_s / calls, 3
            )
            figures[side][f"{kind}_calls"] = calls
    for kind, key in (("grove", "cpu_over_baseline"), ("plain", "plain_over_baseline")):
        name = f"{kind}_server_cpu_ms_per_call"
        figures[key] = round(figures["current"][name] / figures["baseline"][name], 3)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", metavar="REV", help="the earlier revision (default: none)")
    parser.add_argument("--without", action="append", default=[], metavar="PACKAGE")
    parser.add_argument("--quick", action="store_true", help="4 rounds of 3 attempts")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parser.parse_args()
    rounds, attempts = (4, 3) if args.quick else (12, 10)
    figures = measure(args.baseline, tuple(args.without), rounds, attempts)
    if args.json:
        print(json.dumps(figures))
        return
    for side in SIDES:
        f = figures[side]
        print(
            f"{side:9s} Grove {f['grove_server_cpu_ms_per_call']:.2f} ms CPU per call "
            f"({f['grove_calls']} calls), plain {f['plain_server_cpu_ms_per_call']:.2f}"
        )
    print(
        f"cpu_over_baseline {figures['cpu_over_baseline']} "
        f"(plain_over_baseline {figures['plain_over_baseline']})"
    )


if __name__ == "__main__":
    main()
