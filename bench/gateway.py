"""What capture costs per model call: Grove's gateway beside a plain server on the same engine.

Usage: ``python bench/gateway.py [--quick] [--json]``

Both servers answer ``POST /v1/chat/completions`` from one ``InstantEngine`` (a fixed short
generation of the embedded tokenizer's tokens, no model), so the figures measure Grove, not
inference. The plain server is a minimal FastAPI application with one route (render the messages
with the same chat template, tokenize, generate, decode, answer a ChatCompletion; nothing
recorded). Grove is ``grove.jobs.serve.build_gateway(workspace, engine=instant,
max_context=2048)`` (the context ``build_gateway`` sets for the embedded engine) on SQLite + local
blobs, PostgreSQL + local blobs and PostgreSQL + S3 (moto in its own process). All servers are
``ServerThread``s (uvicorn) in one child process that does nothing else; the clients are threads
of this process on the official ``openai`` client, so they never queue for the servers' GIL.

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

PostgreSQL: ``GROVE_BENCH_DATABASE_URL``, else ``GROVE_TEST_DATABASE_URL``, else 127.0.0.1:5432
database ``test``; a fresh database per backend, dropped at the end; none reachable: skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import functools
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import httpx
from openai import OpenAI
from pydantic import BaseModel, ConfigDict

ROOT: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:  # the server side imports torch and transformers; the client side stays light
    from fastapi import FastAPI

    from capture.engine import Generation, SamplingParams

MODEL: Final = "grove/embedded-tiny"
CONTEXT: Final = 2048
MAX_TOKENS: Final = 32  # above the engine's 18 tokens: every call ends with end of turn
ANSWER: Final = "Noted, continuing with the next step."
SYSTEM: Final = {"role": "system", "content": "You are a careful research agent. Be brief."}
TASK: Final = {"role": "user", "content": "Find the weather in Paris, then summarize it."}
BACKENDS: Final = ("sqlite+local", "postgresql+local", "postgresql+s3")
HEADLINE_BACKEND: Final = "postgresql+s3"
AIMS: Final = {  # figure: (aim, True when lower is better)
    "capture_overhead_ms_p50": (5.0, True),
    "capture_overhead_ms_p99": (25.0, True),
    "capture_calls_per_s_over_plain": (0.5, False),
}
DEFAULT_URL: Final = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
START_TIMEOUT_S: Final = 180.0
CALL_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class Workload:
    """``attempts[c]`` attempts per client at concurrency ``c``, each of ``calls`` chained calls,
    ``rounds`` times per server; then a profiling phase per server and concurrency with
    ``profile_attempts[c]`` attempts per client; on each Grove backend of ``backends``."""

    calls: int
    attempts: Mapping[int, int]
    rounds: int
    profile_attempts: Mapping[int, int]
    warmup_attempts: int = 2
    backends: tuple[str, ...] = BACKENDS


FULL: Final = Workload(calls=8, attempts={1: 8, 16: 1}, rounds=3, profile_attempts={1: 6, 16: 1})
QUICK: Final = Workload(
    calls=3,
    attempts={1: 2, 16: 1},
    rounds=1,
    profile_attempts={1: 2},
    warmup_attempts=1,
    backends=("sqlite+local", HEADLINE_BACKEND),
)


# -- the server side (the child process) ---------------------------------------------------------


class InstantEngine:
    """A ``capture.engine.Engine`` that computes nothing: every call generates ``ANSWER``'s tokens
    and end of turn, each with logprob -0.25, cut to ``max_tokens``. Deterministic."""

    def __init__(self, answer_token_ids: Sequence[int], stop_token_id: int) -> None:
        self.token_ids = (*answer_token_ids, stop_token_id)

    def check(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Refuse a prompt that leaves no room for ``max_tokens`` in the context."""
        from capture.errors import PromptTooLongError

        if len(prompt_token_ids) + sampling.max_tokens > CONTEXT:
            raise PromptTooLongError(len(prompt_token_ids), sampling.max_tokens, CONTEXT)

    def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        """``ANSWER`` and end of turn (``stop``), or its first ``max_tokens`` (``length``)."""
        from capture.engine import Generation

        self.check(prompt_token_ids, sampling)
        tokens = self.token_ids[: sampling.max_tokens]
        finish = "stop" if len(tokens) == len(self.token_ids) else "length"
        return Generation(tokens, (-0.25,) * len(tokens), finish)


ROUTE: Final = contextvars.ContextVar[str]("bench_route", default="other")


class StageClock:
    """Wall and CPU time of the server's request path by stage, per route kind (``call``: a chat
    completion; ``attempt``: opening an attempt or posting its result).

    ``wrap(name, function)`` times a stage: its inclusive wall time, and its own wall and thread
    CPU time (minus nested stages, on a stack per thread), so own times add up. ``nested=False``
    times a detail: inclusive wall time only, invisible to the stack. Off until ``enabled``; then
    the wrappers cost one flag test. ``take`` also reports the process's CPU time, always.
    """

    def __init__(self) -> None:
        self.enabled = False
        self._lock = threading.Lock()
        self._totals: dict[tuple[str, str], list[Any]] = {}
        self._local = threading.local()
        self._cpu = time.process_time()

    def add(self, name: str, wall: float, own: tuple[float, float] | None = None) -> None:
        """Record one inclusive wall time of ``name`` (and a stage's own wall and CPU time)."""
        with self._lock:
            total = self._totals.setdefault((ROUTE.get(), name), [0, 0.0, None, None])
            total[0] += 1
            total[1] += wall
            if own is not None:
                total[2] = (total[2] or 0.0) + own[0]
                total[3] = (total[3] or 0.0) + own[1]

    def wrap(self, name: str, function: Callable[..., Any], *, nested: bool = True) -> Any:
        """``function`` timed as stage (or detail) ``name`` while the clock is enabled."""

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled:
                return function(*args, **kwargs)
            stack: list[list[float]] = self._local.__dict__.setdefault("stack", [])
            if nested:
                stack.append([0.0, 0.0])  # the nested stages' wall and CPU time
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
                if not nested:
                    self.add(name, wall)
                else:
                    nested_wall, nested_cpu = stack.pop()
                    if stack:
                        stack[-1][0] += wall
                        stack[-1][1] += cpu
                    self.add(name, wall, (wall - nested_wall, cpu - nested_cpu))

        return timed

    def patch(self, owner: object, attribute: str, name: str, *, nested: bool = True) -> None:
        """Replace ``owner.attribute`` by its timed form (nothing if Grove renamed it)."""
        original = getattr(owner, attribute, None)
        if callable(original):
            setattr(owner, attribute, self.wrap(name, original, nested=nested))

    def take(self) -> dict[str, Any]:
        """Since the last take: ``{"cpu_s": process CPU time, "routes": {route: {name: [count,
        inclusive wall s, own wall s or None, own CPU s or None]}}}``."""
        with self._lock:
            totals, self._totals = self._totals, {}
            cpu, self._cpu = time.process_time() - self._cpu, time.process_time()
        routes: dict[str, dict[str, list[Any]]] = {}
        for (route, name), total in totals.items():
            routes.setdefault(route, {})[name] = total
        return {"cpu_s": cpu, "routes": routes}


CLOCK: Final = StageClock()


class RouteTimer:
    """ASGI middleware: sets the route kind for the stage clock and times the whole request
    (``server request``: from the application's first byte in to its last byte out)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not CLOCK.enabled:
            await self.app(scope, receive, send)
            return
        token = ROUTE.set("call" if scope["path"] == "/v1/chat/completions" else "attempt")
        start = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            CLOCK.add("server request", time.perf_counter() - start)
            ROUTE.reset(token)


def instrument_grove() -> None:
    """Time the stages of Grove's request path (``docs/benchmarks.md``)."""
    import sqlalchemy
    from sqlalchemy.engine import Engine
    from sqlalchemy.pool import Pool

    import capture.gateway
    import capture.lifecycle
    import capture.splice
    from capture.conversion import RequestConverter
    from capture.lifecycle import CaptureService
    from capture.render import Renderer
    from ledger.attempt import AttemptLog
    from ledger.store import EventStore
    from storage import BlobStore

    stages: list[tuple[object, str, str]] = [
        (RequestConverter, "chat_call", "conversion"),
        (capture.gateway._Gateway, "generate", "gateway checks, fit to context (own)"),
        (capture.gateway._Gateway, "state", "ledger read: gateway attempt state"),
        (CaptureService, "generate", "lifecycle (own): events, delta, ids"),
        (CaptureService, "_view", "ledger read: lifecycle attempt view"),
        (capture.lifecycle, "normalize_messages", "normalization"),
        (capture.lifecycle, "output_message", "output parse"),
        (capture.lifecycle, "fingerprint_output", "admission and digests"),
        (capture.lifecycle, "chain_digest", "admission and digests"),
        (Renderer, "render", "chat template render"),
        (Renderer, "encode", "tokenize and decode"),
        (Renderer, "decode", "tokenize and decode"),
        (InstantEngine, "check", "engine (instant)"),
        (InstantEngine, "generate", "engine (instant)"),
        (AttemptLog, "intend", "intent append"),
        (AttemptLog, "commit", "commit append"),
        (BlobStore, "put_delta", "blob put"),
        (capture.gateway, "chat_completion", "answer"),
    ]
    for module in (capture.lifecycle, capture.splice):
        for function in ("admission_items", "locate_boundary", "decide", "replay_summary"):
            stages.append((module, function, "admission and digests"))
    for owner, attribute, name in stages:
        CLOCK.patch(owner, attribute, name)

    def count(name: str) -> Callable[..., None]:
        return lambda *_: CLOCK.add(name, 0.0) if CLOCK.enabled else None

    sqlalchemy.event.listen(Engine, "before_cursor_execute", count("count: SQL statements"))
    sqlalchemy.event.listen(Pool, "checkout", count("count: connection checkouts (pinged)"))
    for owner, attribute, name in [
        (AttemptLog, "load", "detail: stream reload before an append"),
        (EventStore, "append", "detail: append transaction"),
        (EventStore, "read_stream", "detail: read_stream"),
        (CaptureService, "_plan", "detail: plan (admission, render, splice)"),
        (CaptureService, "measure", "detail: fit to context (plans once more)"),
    ]:
        CLOCK.patch(owner, attribute, name, nested=False)


class PlainRequest(BaseModel):
    """The plain server's request: the fields it uses; others are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None = None


def plain_app(tokenizer: Any, engine: InstantEngine) -> FastAPI:
    """The baseline: render, tokenize, generate, decode, answer a ChatCompletion; no capture.
    (``instrument_grove`` has already made the engine's methods stages.)"""
    from fastapi import FastAPI

    from capture.chat_api import ChatCompletion
    from capture.engine import SamplingParams

    render = CLOCK.wrap("chat template render", tokenizer.apply_chat_template)
    encode = CLOCK.wrap("tokenize and decode", tokenizer.encode)
    decode = CLOCK.wrap("tokenize and decode", tokenizer.decode)
    app = FastAPI(title="plain OpenAI-compatible server")

    @app.post("/v1/chat/completions", response_model=ChatCompletion)
    def chat_completions(request: PlainRequest) -> Any:
        text = render(request.messages, add_generation_prompt=True, tokenize=False)
        prompt = encode(text, add_special_tokens=False)
        generation = engine.generate(prompt, SamplingParams(max_tokens=request.max_tokens or 256))
        content = decode(list(generation.content_token_ids), skip_special_tokens=False)
        message = {"role": "assistant", "content": content}
        choice = {"index": 0, "message": message, "finish_reason": generation.finish_reason}
        count = len(generation.token_ids)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": count}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": request.model,
            "choices": [choice],
            "usage": {**usage, "total_tokens": len(prompt) + count},
        }

    return app


def serve(specs: Sequence[Mapping[str, str]]) -> None:
    """The child process: each server of ``specs`` in a ``ServerThread``, then commands on stdin,
    one a line, each answered by one JSON line: ``on`` / ``off`` (the stage clock), ``take``
    (the stages since the last take), ``stop``. Anything else printed goes to stderr."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from capture.embedded import build_tokenizer
    from grove.jobs.serve import ServerThread, build_gateway
    from grove.workspace import Workspace

    tokenizer = build_tokenizer()
    engine = InstantEngine(tokenizer.encode(ANSWER), tokenizer.eos_token_id)
    instrument_grove()
    servers: dict[str, ServerThread] = {}
    for spec in specs:
        if spec["kind"] == "plain":
            app = plain_app(tokenizer, engine)
        else:
            workspace = Workspace(Path(spec["workdir"]), spec["database_url"], spec["blob_url"])
            app = build_gateway(workspace, engine=engine, tokenizer=tokenizer, max_context=CONTEXT)
        app.add_middleware(RouteTimer)
        servers[spec["name"]] = ServerThread(app).start(timeout_s=START_TIMEOUT_S)
    answers.write(json.dumps({name: s.base_url for name, s in servers.items()}) + "\n")
    try:
        for line in sys.stdin:
            command = line.strip()
            if command == "stop":
                break
            CLOCK.enabled = {"on": True, "off": False}.get(command, CLOCK.enabled)
            answers.write(json.dumps(CLOCK.take() if command == "take" else {}) + "\n")
    finally:
        for server in servers.values():  # all at once: each stop waits for its loop to notice
            server.server.should_exit = True
        for server in servers.values():
            server.stop()


class ServerProcess:
    """The child process hosting every server; one JSON line answers each command."""

    def __init__(self, specs: Sequence[Mapping[str, str]], env: Mapping[str, str], log: Path):
        self.log = log
        with log.open("w") as stderr:  # the child keeps writing to its own copy
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--serve", json.dumps(specs)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env={**os.environ, **env},
                cwd=ROOT,
            )
        self.base_urls: dict[str, str] = self._answer(START_TIMEOUT_S)

    def command(self, command: str) -> Any:
        """Send ``command``; its answer."""
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._answer(CALL_TIMEOUT_S)

    def _answer(self, timeout_s: float) -> Any:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.process.kill()
            raise RuntimeError(
                f"the server process did not answer:\n{self.log.read_text()[-4000:]}"
            )
        return json.loads(line)

    def stop(self) -> None:
        """Stop every server, then the process."""
        with contextlib.suppress(OSError, ValueError):
            assert self.process.stdin is not None
            self.process.stdin.write("stop\n")
            self.process.stdin.close()
        try:
            self.process.wait(timeout=CALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# -- backing services ----------------------------------------------------------------------------


@contextlib.contextmanager
def moto_server() -> Iterator[tuple[dict[str, str], Callable[[], None]]]:
    """moto's S3 server on 127.0.0.1 in its own process: the ``AWS_*`` variables that point
    ``open_blob_store`` at it, and ``ready()``, which waits for it and creates the bucket (so
    that the server process can start meanwhile)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready() -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:  # moto checks no signature: a plain PUT creates the bucket
                httpx.put(f"{endpoint}/grove-bench", timeout=5).raise_for_status()
                return
            except httpx.TransportError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.2)

    env = {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
    env |= {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    try:
        yield {**env, "AWS_EC2_METADATA_DISABLED": "true"}, ready
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def postgres_databases(names: Sequence[str]) -> Iterator[dict[str, str] | str]:
    """A fresh database per name, dropped afterwards: ``{name: url}``; or why there is none."""
    import psycopg
    from sqlalchemy.engine import make_url

    environ = os.environ.get
    admin = make_url(
        environ("GROVE_BENCH_DATABASE_URL") or environ("GROVE_TEST_DATABASE_URL") or DEFAULT_URL
    )
    dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        connection = psycopg.connect(dsn, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        yield f"no PostgreSQL at {admin.render_as_string(hide_password=True)}: {error}"
        return
    created: list[str] = []
    try:
        urls = {}
        for name in names:
            created.append(f"grove_bench_gateway_{uuid.uuid4().hex[:12]}")
            connection.execute(f'CREATE DATABASE "{created[-1]}"')
            urls[name] = admin.set(database=created[-1]).render_as_string(hide_password=False)
        yield urls
    finally:
        for database in created:
            connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        connection.close()


# -- the client side -----------------------------------------------------------------------------


@dataclass
class Phase:
    """Calls against one server: per-call latencies and attempt requests (s), wall time, and
    the server process's CPU time."""

    latencies: list[float] = field(default_factory=list)
    attempt_requests: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    calls: int = 0
    server_cpu_s: float = 0.0

    def extend(self, other: Phase) -> None:
        """Pool ``other`` into this phase."""
        self.latencies += other.latencies
        self.attempt_requests += other.attempt_requests
        self.wall_s += other.wall_s
        self.calls += other.calls
        self.server_cpu_s += other.server_cpu_s


class Harness:
    """One client thread: the official openai client for calls, httpx for attempts."""

    def __init__(self, base_url: str, grove: bool) -> None:
        self.grove = grove
        self.openai = OpenAI(
            base_url=f"{base_url}/v1", api_key="bench", max_retries=0, timeout=CALL_TIMEOUT_S
        )
        self.http = httpx.Client(base_url=base_url, timeout=CALL_TIMEOUT_S)

    def play(self, key: str, calls: int, phase: Phase) -> None:
        """One attempt of ``calls`` chained calls; each continues the one before."""
        headers = {"X-Grove-Capture-Key": key} if self.grove else {}
        if self.grove:
            body = {"capture_key": key, "rollout_id": key, "prompt_group": "b", "rollout_index": 0}
            self._attempt_request("/v1/attempts", body, phase)
        messages: list[dict[str, Any]] = [SYSTEM, TASK]
        response_ids: dict[int, str] = {}
        for n in range(calls):
            if n:
                messages.append({"role": "user", "content": f"Observation {n}: sunny, 21 C."})
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
                f"/v1/attempts/{key}/result", {"reward": 1, "output": output}, phase
            )

    def _attempt_request(self, path: str, body: dict[str, Any], phase: Phase) -> None:
        start = time.perf_counter()
        answer = self.http.post(path, json=body)
        if answer.status_code != 200:
            raise RuntimeError(f"POST {path}: {answer.status_code} {answer.text}")
        phase.attempt_requests.append(time.perf_counter() - start)

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
        "calls": grove.calls,
    }
    result["aims_met"] = {
        name: result[name] <= aim if lower else result[name] >= aim
        for name, (aim, lower) in AIMS.items()
    }
    return result


def stage_table(taken: Mapping[str, Any], calls: int) -> dict[str, dict[str, float]]:
    """Per chat call: each stage's own wall and CPU ms, each detail's inclusive wall ms, the rest
    of the server's request time (HTTP, FastAPI, validation, serialization, the event loop), the
    attempt requests (open, result) spread over the calls, the counts, and the server process's
    CPU ms (all threads)."""
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
    return {"wall_ms": wall, "cpu_ms": cpu, "counts": counts}


# -- the run -------------------------------------------------------------------------------------


def run_benchmark(workload: Workload) -> dict[str, Any]:
    """Every backend of the workload beside the plain server: figures, stages, notes."""
    backends = list(workload.backends)
    began = time.perf_counter()
    notes = [f"load average at the start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)"]
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="grove-bench-gateway-"))
        stack.callback(shutil.rmtree, workdir, True)
        env: dict[str, str] = {}
        ready: Callable[[], None] | None = None
        if any(b.endswith("+s3") for b in backends):
            env, ready = stack.enter_context(moto_server())
        urls = {b: f"sqlite:///{workdir / b / 'ledger.db'}" for b in backends}
        postgres = [b for b in backends if b.startswith("postgresql")]
        if postgres:
            databases = stack.enter_context(postgres_databases(postgres))
            if isinstance(databases, str):
                notes.append(f"PostgreSQL backends skipped: {databases}")
                backends = [b for b in backends if b not in postgres]
            else:
                urls.update(databases)
        specs = [{"name": "plain", "kind": "plain"}] + [
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
        server = ServerProcess(specs, env, workdir / "server.log")
        stack.callback(server.stop)
        if ready is not None:
            ready()
        notes.append(f"servers up after {time.perf_counter() - began:.0f} s")
        targets = ["plain", *backends]

        def phase(target: str, clients: int, attempts: int) -> tuple[Phase, dict[str, Any]]:
            """One phase, with what the server's clock took during it."""
            server.command("take")
            played = run_phase(
                server.base_urls[target],
                grove=target != "plain",
                clients=clients,
                attempts=attempts,
                calls=workload.calls,
            )
            taken = server.command("take")
            played.server_cpu_s = taken["cpu_s"]
            return played, taken

        for target in targets:  # warm-up: connections, caches, compiled queries
            phase(target, 1, workload.warmup_attempts)
        results: dict[str, dict[str, Any]] = {b: {} for b in backends}
        for clients, attempts in sorted(workload.attempts.items()):
            pooled = {target: Phase() for target in targets}
            for round_ in range(workload.rounds):
                shift = round_ % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    pooled[target].extend(phase(target, clients, attempts)[0])
            for backend in backends:
                results[backend][str(clients)] = figures(pooled[backend], pooled["plain"])
        stages: dict[str, dict[str, Any]] = {target: {} for target in targets}
        server.command("on")
        for clients, attempts in sorted(workload.profile_attempts.items()):
            for target in targets:
                played, taken = phase(target, clients, attempts)
                stages[target][str(clients)] = stage_table(taken, played.calls)
        server.command("off")
    headline = HEADLINE_BACKEND if HEADLINE_BACKEND in results else next(iter(results))
    worst = results[headline].values()
    notes.append(f"ran {time.perf_counter() - began:.0f} s; load average {os.getloadavg()[0]:.1f}")
    return {
        "capture_overhead_ms_p50": max(r["capture_overhead_ms_p50"] for r in worst),
        "capture_overhead_ms_p99": max(r["capture_overhead_ms_p99"] for r in worst),
        "capture_calls_per_s_over_plain": min(r["capture_calls_per_s_over_plain"] for r in worst),
        "headline_backend": headline,
        "backends": results,
        "stages_per_call": stages,
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
    for target, per in report["stages_per_call"].items():
        for clients, table in per.items():
            print(f"\nstages, per call: {target}, {clients} client(s)     wall ms    CPU ms")
            wall, cpu = table["wall_ms"], table["cpu_ms"]
            for name in sorted(wall.keys() | cpu.keys(), key=lambda n: -wall.get(n, 0)):
                print(f"  {name:<48} {wall.get(name, ''):>9} {cpu.get(name, ''):>9}")
            for name, count in table["counts"].items():
                print(f"  {name:<48} {count:>9}")
    print()
    for name, (aim, lower) in AIMS.items():
        bound = "<=" if lower else ">="
        print(f"{name} = {report[name]} (aim {bound} {aim}; {report['headline_backend']}, worst)")
    for note in report["notes"]:
        print(f"note: {note}")


def main() -> None:
    """Run the benchmark; print tables, or one JSON object with ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds (CI smoke)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # the child process: server specs
    args = parser.parse_args()
    if args.serve:
        serve(json.loads(args.serve))
        return
    report = {**run_benchmark(QUICK if args.quick else FULL), "quick": args.quick}
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)


if __name__ == "__main__":
    main()
