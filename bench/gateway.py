"""What capture costs per model call: Grove's gateway beside a plain server on the same engine.

Usage: ``python -m bench.gateway [--quick] [--json]``

Both servers answer ``POST /v1/chat/completions`` from one ``InstantEngine`` (a fixed short
generation of the embedded tokenizer's tokens, no model), so the figures measure Grove, not
inference. The plain server is a minimal FastAPI application with one route (render the messages
with the same chat template, tokenize, generate, decode, answer a ChatCompletion; nothing
recorded). Grove is ``grove.services.serve.build_gateway(workspace, engine=instant,
max_context=2048)`` (the context ``build_gateway`` sets for the embedded engine) on SQLite + local
blobs, PostgreSQL + local blobs and PostgreSQL + S3 (moto in its own process). All servers are
``ServerThread``s (uvicorn) in one child process that does nothing else (the server side:
``bench/servers/gateway.py``); the clients are threads of this process on the official
``openai`` client, so they never queue for the servers' GIL.

With 1, then 16 concurrent clients, each client plays attempts of several chained calls: on Grove
it opens the attempt (``POST /v1/attempts``), sends each call with ``X-Grove-Capture-Key`` and the
whole history so far (each call after the first must be admitted as a continuation, or the bench
fails), and posts the returned history as the result; the plain server gets the same calls.
Rounds rotate through the servers so that all see the same machine load.

Figures per backend and concurrency: ``capture_overhead_ms_p50`` / ``_p99`` (Grove's per-call
latency at the client minus the plain server's, same percentile) and
``capture_calls_per_s_over_plain`` (Grove's wall time includes opening attempts and posting
results); the top level holds the worst over concurrencies of PostgreSQL + S3 (SQLite without a
PostgreSQL). Aims: p50 <= 5 ms, p99 <= 25 ms, ratio >= 0.5. A profiling pass then times the
request path by stage (``StageClock``, off during the measured rounds; ``docs/benchmarks.md``).

The headline backend is measured again with an engine that takes 50 ms per generation (a sleep:
a GPU's work costs the server no CPU), beside a plain server on the same engine
(``engine_delays``). The top level also holds the cost figures (``COST_AIMS``):
``grove_server_cpu_ms_per_call`` (PostgreSQL + local, one client), ``serving_cpu_over_plain``
(the serving stack's CPU per call, Grove over plain, headline backend, one client),
``overhead_ms_p50_engine_50ms`` (one client) and ``calls_per_s_over_plain_engine_50ms`` (the
highest concurrency). On PostgreSQL, ``group_commit`` holds durable appends from 1 and 16
threads and the WAL flushes per append (``bench/servers/group_commit.py``).

CPU accounting, per side (``grove``, ``plain``): ``*_cpu_ms_per_call`` holds the CPU ms per call
of every process that serves a call over the measured rounds (the server process, the
PostgreSQL backends of the bench's databases and PostgreSQL's shared processes, moto, this client
process), their sum (``serving``), the backends that ended meanwhile (``postgres_ended``: a pool
that opens and closes connections; other programs' too) and the machine's busy time
(``machine``: all processes, other users' too), read from ``/proc``
(``bench/servers/process_cpu.py``); ``*_calls_per_s_cores_allow`` is the rate the machine's
cores allow at the serving CPU per call, and ``cores_allow_ratio`` the throughput ratio Grove
could reach over plain with the cores saturated on both sides.

PostgreSQL: ``GROVE_BENCH_DATABASE_URL``, else ``GROVE_TEST_DATABASE_URL``, else 127.0.0.1:5432
database ``test``; a fresh database per backend, dropped at the end; none reachable: skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
from openai import OpenAI
from sqlalchemy.engine import make_url

from bench.servers import group_commit
from bench.servers.gateway import (
    CALL_TIMEOUT_S,
    ServerProcess,
    admin_url,
    libpq_dsn,
    moto_server,
    postgres_databases,
)
from bench.servers.process_cpu import ENDED, MACHINE, OTHERS, CpuMeter

MODEL: Final = "grove/embedded-tiny"
KEEPALIVE_S: Final = 2.0  # the client's reuse of an idle connection, below the server's 5 s
MAX_TOKENS: Final = 32  # above the engine's 18 tokens: every call ends with end of turn
SYSTEM: Final = {"role": "system", "content": "You are a careful research agent. Be brief."}
TASK: Final = {"role": "user", "content": "Find the weather in Paris, then summarize it."}
BACKENDS: Final = ("sqlite+local", "postgresql+local", "postgresql+s3")
HEADLINE_BACKEND: Final = "postgresql+s3"
AIMS: Final = {  # figure: (aim, True when lower is better)
    "capture_overhead_ms_p50": (5.0, True),
    "capture_overhead_ms_p99": (25.0, True),
    "capture_calls_per_s_over_plain": (0.5, False),
}
COST_AIMS: Final = {  # the top level's cost figures (docs/benchmarks.md): (aim, lower is better)
    "grove_server_cpu_ms_per_call": (3.5, True),
    "serving_cpu_over_plain": (2.0, True),
    "overhead_ms_p50_engine_50ms": (5.0, True),
    "calls_per_s_over_plain_engine_50ms": (0.9, False),
}
CPU_BACKEND: Final = "postgresql+local"  # grove_server_cpu_ms_per_call's backend


def slow_targets(backend: str) -> tuple[tuple[str, str], ...]:
    """The servers on each slower engine: (name, suffix) — plain, Grove, Grove without the
    overlap of intent and generation (``-serial``)."""
    return (("plain", ""), (backend, ""), (backend, "-serial"))


@dataclass(frozen=True)
class Workload:
    """``attempts[c]`` attempts per client at concurrency ``c``, each of ``calls`` chained calls,
    ``rounds`` times per server; then a profiling phase per server and concurrency with
    ``profile_attempts[c]`` attempts per client; on each Grove backend of ``backends`` with an
    instant engine, and on the headline backend again with an engine that takes each of
    ``engine_delays_ms`` per generation (beside a plain server on the same engine)."""

    calls: int
    attempts: Mapping[int, int]
    rounds: int
    profile_attempts: Mapping[int, int]
    warmup_attempts: int = 2
    backends: tuple[str, ...] = BACKENDS
    engine_delays_ms: tuple[int, ...] = (50,)


FULL: Final = Workload(calls=8, attempts={1: 8, 16: 1}, rounds=3, profile_attempts={1: 6, 16: 1})
QUICK: Final = Workload(
    calls=3,
    attempts={1: 2, 16: 1},
    rounds=1,
    profile_attempts={1: 2},
    warmup_attempts=1,
    backends=("sqlite+local", CPU_BACKEND, HEADLINE_BACKEND),
)


# -- the client side -----------------------------------------------------------------------------


@dataclass
class Phase:
    """Calls against one server: per-call latencies and attempt requests (s), wall time, the
    server process's CPU time (its own clock), and the CPU seconds of every process that serves
    the calls, by group (``bench/servers/process_cpu.py``), with the machine's."""

    latencies: list[float] = field(default_factory=list)
    attempt_requests: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    calls: int = 0
    server_cpu_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)

    def extend(self, other: Phase) -> None:
        """Pool ``other`` into this phase."""
        self.latencies += other.latencies
        self.attempt_requests += other.attempt_requests
        self.wall_s += other.wall_s
        self.calls += other.calls
        self.server_cpu_s += other.server_cpu_s
        for group, spent in other.cpu_s.items():
            self.cpu_s[group] = self.cpu_s.get(group, 0.0) + spent


class Harness:
    """One client thread: the official openai client for calls, httpx for attempts."""

    def __init__(self, base_url: str, grove: bool) -> None:
        self.grove = grove
        self.openai = OpenAI(
            base_url=f"{base_url}/v1", api_key="bench", max_retries=0, timeout=CALL_TIMEOUT_S
        )
        # Connections kept alive, as grove.client keeps them, but never reused after sitting
        # idle for longer than the server keeps them (uvicorn closes an idle one after 5 s, and
        # a request on a connection the server closes meanwhile fails).
        self.http = httpx.Client(
            base_url=base_url,
            timeout=CALL_TIMEOUT_S,
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),
        )

    def play(self, key: str, calls: int, phase: Phase) -> None:
        """One attempt of ``calls`` chained calls; each continues the one before. Every attempt
        starts from the same system and task messages (the roots of one prompt group); the
        observations name the attempt, so that its later calls' inputs are its own, as a real
        rollout's are once its generations differ (the instant engine's answers never do)."""
        headers = {"X-Grove-Capture-Key": key} if self.grove else {}
        if self.grove:
            body = {"capture_key": key, "rollout_id": key, "prompt_group": "b", "rollout_index": 0}
            opened = self._attempt_request("/v1/attempts", body, phase, {})
            headers["X-Grove-Attempt-Token"] = opened["attempt_token"]  # docs/gateway.md
        messages: list[dict[str, Any]] = [SYSTEM, TASK]
        response_ids: dict[int, str] = {}
        for n in range(calls):
            if n:
                observation = f"Observation {n} of {key}: sunny, 21 C."
                messages.append({"role": "user", "content": observation})
            start = time.perf_counter()
            raw = self.openai.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=MAX_TOKENS, extra_headers=headers
            )
            completion = raw.parse()
            phase.latencies.append(time.perf_counter() - start)
            decision = raw.headers.get("X-Grove-Decision")
            if self.grove and n and decision != "continuation":
                raise RuntimeError(f"call {n} of {key} was admitted as {decision}")
            messages.append({"role": "assistant", "content": completion.choices[0].message.content})
            response_ids[len(messages) - 1] = completion.id
        phase.calls += calls
        if self.grove:
            # Every answer has the same text, so the returned history names each call's
            # response id, as docs/gateway.md asks of chat clients whose answers repeat.
            output = [
                {**m, "response_id": response_ids[i]} if i in response_ids else m
                for i, m in enumerate(messages)
            ]
            self._attempt_request(
                f"/v1/attempts/{key}/result", {"reward": 1, "output": output}, phase, headers
            )

    def _attempt_request(
        self, path: str, body: dict[str, Any], phase: Phase, headers: dict[str, str]
    ) -> dict[str, Any]:
        start = time.perf_counter()
        answer = self.http.post(path, json=body, headers=headers)
        if answer.status_code != 200:
            raise RuntimeError(f"POST {path}: {answer.status_code} {answer.text}")
        phase.attempt_requests.append(time.perf_counter() - start)
        return answer.json()

    def close(self) -> None:
        """Close both clients."""
        self.openai.close()
        self.http.close()


def run_phase(base_url: str, *, grove: bool, clients: int, attempts: int, calls: int) -> Phase:
    """``clients`` threads, each playing ``attempts`` attempts; started and timed together."""
    run = uuid.uuid4().hex[:10]
    harnesses = [Harness(base_url, grove) for _ in range(clients)]
    phases = [Phase() for _ in range(clients)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(clients + 1)

    def play(index: int) -> None:
        barrier.wait()
        try:
            for attempt in range(attempts):
                harnesses[index].play(f"bench-{run}-{index}-{attempt}", calls, phases[index])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=play, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join(CALL_TIMEOUT_S * attempts * (calls + 2))
    total = Phase(wall_s=time.perf_counter() - start)
    for harness in harnesses:
        harness.close()
    if errors:
        raise errors[0]
    if any(thread.is_alive() for thread in threads):
        raise RuntimeError("a client thread did not finish in time")
    for phase in phases:
        total.extend(phase)
    return total


# -- figures -------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered), -(-len(ordered) * q // 100)) - 1)]


def cpu_figures(phase: Phase, side: str) -> dict[str, Any]:
    """CPU ms per call of each process group serving ``phase``, their sum (``serving``: not the
    ended PostgreSQL backends, which other programs' share, nor other databases' backends), the
    machine's busy ms per call (every process, other users' too), and the calls per second that
    the machine's cores allow at the serving CPU per call."""
    per_call = {g: round(1000 * s / phase.calls, 3) for g, s in sorted(phase.cpu_s.items())}
    serving = sum(ms for group, ms in per_call.items() if group not in (MACHINE, ENDED, OTHERS))
    cores = os.cpu_count() or 1
    return {
        f"{side}_cpu_ms_per_call": {**per_call, "serving": round(serving, 3)},
        f"{side}_calls_per_s_cores_allow": round(1000 * cores / serving, 1) if serving else None,
    }


def figures(grove: Phase, plain: Phase) -> dict[str, Any]:
    """The figures of one backend at one concurrency, and whether each aim is met."""
    ms = {
        f"{side}_ms_{q}": round(1000 * percentile(phase.latencies, int(q[1:])), 3)
        for side, phase in (("grove", grove), ("plain", plain))
        for q in ("p50", "p99")
    }
    grove_rate, plain_rate = grove.calls / grove.wall_s, plain.calls / plain.wall_s
    result: dict[str, Any] = {
        "capture_overhead_ms_p50": round(ms["grove_ms_p50"] - ms["plain_ms_p50"], 3),
        "capture_overhead_ms_p99": round(ms["grove_ms_p99"] - ms["plain_ms_p99"], 3),
        "capture_calls_per_s_over_plain": round(grove_rate / plain_rate, 3),
        **ms,
        "grove_calls_per_s": round(grove_rate, 1),
        "plain_calls_per_s": round(plain_rate, 1),
        "attempt_request_ms_p50": round(1000 * percentile(grove.attempt_requests, 50), 3),
        "grove_server_cpu_ms_per_call": round(1000 * grove.server_cpu_s / grove.calls, 3),
        "plain_server_cpu_ms_per_call": round(1000 * plain.server_cpu_s / plain.calls, 3),
        **cpu_figures(grove, "grove"),
        **cpu_figures(plain, "plain"),
        "cores": os.cpu_count(),
        "calls": grove.calls,
    }
    allowed = result["grove_calls_per_s_cores_allow"], result["plain_calls_per_s_cores_allow"]
    result["cores_allow_ratio"] = round(allowed[0] / allowed[1], 3) if all(allowed) else None
    result["aims_met"] = {
        name: result[name] <= aim if lower else result[name] >= aim
        for name, (aim, lower) in AIMS.items()
    }
    return result


def stage_table(taken: Mapping[str, Any], calls: int) -> dict[str, dict[str, float]]:
    """Per chat call: each stage's own wall and CPU ms, each detail's inclusive wall ms, the rest
    of the server's request time (HTTP, FastAPI, validation, serialization, the event loop), the
    attempt requests (open, result) spread over the calls, the counts, and the server process's
    CPU ms (all threads, and by thread: the event loop, the route bodies, the intent pool)."""
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    counts: dict[str, float] = {}
    for name, (count, inclusive, own_wall, own_cpu) in taken["routes"].get("call", {}).items():
        if name.startswith("count:"):
            counts[name.removeprefix("count: ")] = round(count / calls, 2)
            continue
        wall[name] = round(1000 * (inclusive if own_wall is None else own_wall) / calls, 3)
        if own_cpu is not None:
            cpu[name] = round(1000 * own_cpu / calls, 3)
    if "server request" in wall:
        rest = wall["server request"] - sum(wall[name] for name in cpu)
        wall["rest: HTTP, FastAPI, validation"] = round(rest, 3)
    attempts = taken["routes"].get("attempt", {}).get("server request")
    if attempts is not None:
        wall["detail: attempt requests (open, result)"] = round(1000 * attempts[1] / calls, 3)
    cpu["server process, all threads"] = round(1000 * taken["cpu_s"] / calls, 3)
    for name, seconds in taken.get("threads", {}).items():
        cpu[f"thread: {name}"] = round(1000 * seconds / calls, 3)
    return {"wall_ms": wall, "cpu_ms": cpu, "counts": counts}


def ms_per_call(seconds: float, phase: Phase) -> float:
    """``seconds`` spent over ``phase``, in ms per call."""
    return round(1000 * seconds / phase.calls, 3)


def cost_figures(
    results: Mapping[str, Mapping[str, Any]],
    engines: Mapping[str, Mapping[str, Any]],
    headline: str,
) -> dict[str, Any]:
    """The top level's cost figures (``COST_AIMS``): Grove's server CPU per call on
    ``CPU_BACKEND`` (else the headline backend), the serving stack's CPU per call over plain's
    on the headline backend, both at the lowest concurrency; with each slower engine the
    overhead p50 at the lowest concurrency and the throughput ratio at the highest."""
    cpu = results[CPU_BACKEND if CPU_BACKEND in results else headline]
    lowest = min(cpu, key=int)
    single = results[headline][lowest]
    serving = single["grove_cpu_ms_per_call"]["serving"], single["plain_cpu_ms_per_call"]["serving"]
    cost: dict[str, Any] = {
        "grove_server_cpu_ms_per_call": cpu[lowest]["grove_server_cpu_ms_per_call"],
        "serving_cpu_over_plain": round(serving[0] / serving[1], 3) if serving[1] else None,
    }
    for delay, per in engines.items():
        low, high = min(per, key=int), max(per, key=int)
        cost[f"overhead_ms_p50_engine_{delay}"] = per[low]["capture_overhead_ms_p50"]
        cost[f"calls_per_s_over_plain_engine_{delay}"] = per[high]["capture_calls_per_s_over_plain"]
    return cost


# -- the run -------------------------------------------------------------------------------------


def run_benchmark(workload: Workload, *, flushed: bool = True) -> dict[str, Any]:
    """Every backend of the workload beside the plain server: figures, stages, notes.
    ``flushed=False``: PostgreSQL commits do not wait for the disk (not durable, ``--unflushed``).
    """
    backends = list(workload.backends)
    began = time.perf_counter()
    notes = [f"load average at the start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)"]
    if not flushed:
        notes.append(
            "NOT DURABLE: PostgreSQL databases run synchronous_commit = off (--unflushed), "
            "to show the capture overhead without the disk's flushes"
        )
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="grove-bench-gateway-"))
        stack.callback(shutil.rmtree, workdir, True)
        env: dict[str, str] = {}
        ready: Callable[[], None] | None = None
        meter = CpuMeter({"client": os.getpid()})
        if any(b.endswith("+s3") for b in backends):
            env, ready, meter.watched["moto"] = stack.enter_context(moto_server())
        urls = {b: f"sqlite:///{workdir / b / 'ledger.db'}" for b in backends}
        postgres = [b for b in backends if b.startswith("postgresql")]
        if postgres:
            databases = stack.enter_context(postgres_databases(postgres, flushed=flushed))
            if isinstance(databases, str):
                notes.append(f"PostgreSQL backends skipped: {databases}")
                backends = [b for b in backends if b not in postgres]
            else:
                urls.update(databases)
                meter.databases = {make_url(url).database for url in databases.values()}
        specs: list[dict[str, Any]] = [{"name": "plain", "kind": "plain"}] + [
            {
                "name": b,
                "kind": "grove",
                "database_url": urls[b],
                "blob_url": f"s3://grove-bench/{b.replace('+', '-')}"
                if b.endswith("+s3")
                else str(workdir / b / "blobs"),
                "workdir": str(workdir / b),
            }
            for b in backends
        ]
        delayed = HEADLINE_BACKEND if HEADLINE_BACKEND in backends else backends[0]
        for delay in workload.engine_delays_ms:  # the same servers on a slower engine
            for spec in (specs[0], specs[1 + backends.index(delayed)]):
                name = f"{spec['name']}@{delay}ms"
                specs.append({**spec, "name": name, "delay_s": delay / 1000})
            # the baseline of the overlap: each intent durable before its generation starts
            specs.append({**specs[-1], "name": f"{delayed}@{delay}ms-serial"})
            specs[-1]["overlap_intents"] = False
        server = ServerProcess(specs, env, workdir / "server.log")
        stack.callback(server.stop)
        meter.watched["server"] = server.process.pid
        if ready is not None:
            ready()
        notes.append(f"servers up after {time.perf_counter() - began:.0f} s")
        targets = ["plain", *backends]
        slow = [
            f"{t}@{d}ms{s}" for d in workload.engine_delays_ms for t, s in slow_targets(delayed)
        ]
        postgres_urls = {b: urls[b] for b in backends if b.startswith("postgresql")}

        def phase(target: str, clients: int, attempts: int) -> tuple[Phase, dict[str, Any]]:
            """One phase, with what the server's clock took during it."""
            server.command("take")
            before = meter.sample()
            played = run_phase(
                server.base_urls[target],
                grove=not target.startswith("plain"),
                clients=clients,
                attempts=attempts,
                calls=workload.calls,
            )
            played.cpu_s = meter.since(before)
            taken = server.command("take")
            played.server_cpu_s = taken["cpu_s"]
            return played, taken

        every = targets + slow
        for target in every:  # warm-up: connections, caches, compiled queries
            phase(target, 1, workload.warmup_attempts)
        results: dict[str, dict[str, Any]] = {b: {} for b in backends}
        engines: dict[str, dict[str, Any]] = {
            f"{d}ms{s}": {} for d in workload.engine_delays_ms for s in ("", "_serial")
        }
        for clients, attempts in sorted(workload.attempts.items()):
            pooled = {target: Phase() for target in every}
            for round_ in range(workload.rounds):
                shift = round_ % len(every)
                for target in every[shift:] + every[:shift]:
                    pooled[target].extend(phase(target, clients, attempts)[0])
            for backend in backends:
                results[backend][str(clients)] = figures(pooled[backend], pooled["plain"])
            for delay in workload.engine_delays_ms:
                plain = pooled[f"plain@{delay}ms"]
                engines[f"{delay}ms"][str(clients)] = figures(pooled[f"{delayed}@{delay}ms"], plain)
                serial = figures(pooled[f"{delayed}@{delay}ms-serial"], plain)
                engines[f"{delay}ms_serial"][str(clients)] = serial
        stages: dict[str, dict[str, Any]] = {target: {} for target in targets}
        server.command("on")
        for clients, attempts in sorted(workload.profile_attempts.items()):
            for target in targets:
                played, taken = phase(target, clients, attempts)
                stages[target][str(clients)] = stage_table(taken, played.calls)
        server.command("off")
        profiled = CPU_BACKEND if CPU_BACKEND in backends else backends[0]
        server.command("profile")  # cProfile, one client, after the stage clock is off
        played, taken = phase(
            profiled, 1, workload.profile_attempts[min(workload.profile_attempts)]
        )
        server.command("off")
        grouped = None
        if postgres_urls:  # durable appends from 1 and 16 threads: do their flushes merge?
            url = postgres_urls.get(CPU_BACKEND) or next(iter(postgres_urls.values()))
            grouped = group_commit.measure(url, libpq_dsn(admin_url()), (1, 16))
            notes.append(f"group commit: {group_commit.summary(grouped)}")
        profile = {
            "backend": profiled,
            "calls": played.calls,
            "top_own_ms_per_call": [  # function, calls, own ms, inclusive ms: per call
                [where, round(count / played.calls, 2), *(ms_per_call(s, played) for s in times)]
                for where, count, *times in taken.get("profile", [])
            ],
        }
    headline = HEADLINE_BACKEND if HEADLINE_BACKEND in results else next(iter(results))
    worst = results[headline].values()
    notes.append(f"ran {time.perf_counter() - began:.0f} s; load average {os.getloadavg()[0]:.1f}")
    return {
        "capture_overhead_ms_p50": max(r["capture_overhead_ms_p50"] for r in worst),
        "capture_overhead_ms_p99": max(r["capture_overhead_ms_p99"] for r in worst),
        "capture_calls_per_s_over_plain": min(r["capture_calls_per_s_over_plain"] for r in worst),
        **cost_figures(results, engines, headline),
        "headline_backend": headline,
        "backends": results,
        "engine_delays": {"backend": delayed, **engines},
        "stages_per_call": stages,
        "profile": profile,
        "group_commit": grouped,
        "workload": {
            "calls_per_attempt": workload.calls,
            "attempts_per_client": {str(c): a for c, a in workload.attempts.items()},
            "rounds": workload.rounds,
        },
        "notes": notes,
    }


def print_report(report: Mapping[str, Any]) -> None:
    """The figures, then the stages, as tables."""
    columns = ("grove_ms_p50", "plain_ms_p50", "capture_overhead_ms_p50", "grove_ms_p99")
    columns += ("plain_ms_p99", "capture_overhead_ms_p99", "grove_calls_per_s")
    columns += ("plain_calls_per_s", "capture_calls_per_s_over_plain")
    columns += ("grove_server_cpu_ms_per_call", "plain_server_cpu_ms_per_call")
    heads = ("grove p50", "plain p50", "over p50", "grove p99", "plain p99", "over p99")
    heads += ("grove/s", "plain/s", "ratio", "grove CPU", "plain CPU")
    print(f"{'backend':<17} {'clients':>7} " + " ".join(f"{h:>9}" for h in heads) + "  aims")
    for backend, per in report["backends"].items():
        for clients, r in per.items():
            cells = " ".join(f"{r[c]:>9.2f}" for c in columns)
            met = "met" if all(r["aims_met"].values()) else "missed"
            print(f"{backend:<17} {clients:>7} {cells}  {met}")
    groups = {"server": "server", "postgres_backends": "pg own", "postgres_auxiliary": "pg shared"}
    groups |= {"moto": "moto", "client": "client", "serving": "serving", ENDED: "pg ended"}
    groups |= {OTHERS: "pg others", MACHINE: "machine"}
    print(f"\nCPU ms per call by process, and the calls/s {os.cpu_count()} cores allow at the sum")
    heads = " ".join(f"{label:>9}" for label in groups.values())
    print(f"{'backend':<17} {'clients':>7} {'side':>5} {heads}")
    for backend, per in report["backends"].items():
        for clients, r in per.items():
            for side in ("grove", "plain"):
                cpu = r[f"{side}_cpu_ms_per_call"]
                cells = " ".join(f"{cpu.get(g, 0.0):>9.2f}" for g in groups)
                allowed = r[f"{side}_calls_per_s_cores_allow"]
                print(f"{backend:<17} {clients:>7} {side:>5} {cells}  allow {allowed}/s")
    for target, per in report["stages_per_call"].items():
        for clients, table in per.items():
            print(f"\nstages, per call: {target}, {clients} client(s)     wall ms    CPU ms")
            wall, cpu = table["wall_ms"], table["cpu_ms"]
            for name in sorted(wall.keys() | cpu.keys(), key=lambda n: -wall.get(n, 0)):
                print(f"  {name:<48} {wall.get(name, ''):>9} {cpu.get(name, ''):>9}")
            for name, count in table["counts"].items():
                print(f"  {name:<48} {count:>9}")
    profile = report["profile"]
    print(f"\ncProfile, {profile['backend']}, 1 client: own / inclusive ms per call, calls")
    for where, count, own, inclusive in profile["top_own_ms_per_call"]:
        print(f"  {where:<64} {own:>8} {inclusive:>8} {count:>6}")
    for delay, per in report["engine_delays"].items():
        if delay == "backend":
            continue
        for clients, r in per.items():
            print(
                f"\nengine {delay}, {report['engine_delays']['backend']}, {clients} client(s): "
                f"Grove p50 {r['grove_ms_p50']} ms, plain {r['plain_ms_p50']} ms, overhead "
                f"{r['capture_overhead_ms_p50']} ms, calls/s over plain "
                f"{r['capture_calls_per_s_over_plain']}"
            )
    print()
    for name, (aim, lower) in AIMS.items():
        bound = "<=" if lower else ">="
        print(f"{name} = {report[name]} (aim {bound} {aim}; {report['headline_backend']}, worst)")
    for name, (aim, lower) in COST_AIMS.items():
        print(f"{name} = {report.get(name)} (aim {'<=' if lower else '>='} {aim})")
    for note in report["notes"]:
        print(f"note: {note}")


def main() -> None:
    """Run the benchmark; print tables, or one JSON object with ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds (CI smoke)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--unflushed",
        action="store_true",
        help="PostgreSQL with synchronous_commit = off (NOT durable): Grove without the disk",
    )
    args = parser.parse_args()
    workload = QUICK if args.quick else FULL
    report = {
        **run_benchmark(workload, flushed=not args.unflushed),
        "quick": args.quick,
        "flushed": not args.unflushed,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)


if __name__ == "__main__":
    main()
