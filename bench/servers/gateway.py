"""The server side of ``bench/gateway.py``: the instant engine, the plain server, Grove's stage
clock, the child process that hosts every server, and the backing services (moto, PostgreSQL).

The child process runs as ``python -m bench.servers.gateway SPECS`` (``ServerProcess`` starts it):
each server of ``SPECS`` (the plain server, or Grove's gateway on one backend) in a uvicorn
``ServerThread``, and nothing else, so the clients in the parent process never queue for the
servers' GIL. The parent then drives it with one-line commands on stdin (``serve``).
"""

from __future__ import annotations

import contextlib
import contextvars
import cProfile
import functools
import json
import os
import pstats
import re
import select
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import httpx
from pydantic import BaseModel, ConfigDict

ROOT: Final = Path(__file__).resolve().parents[2]

if TYPE_CHECKING:  # the server side imports torch and transformers; the client side stays light
    from fastapi import FastAPI

    from grove.capture.engine import Generation, SamplingParams

CONTEXT: Final = 2048
ANSWER: Final = "Noted, continuing with the next step."
DEFAULT_URL: Final = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
START_TIMEOUT_S: Final = 180.0
CALL_TIMEOUT_S: Final = 60.0


class InstantEngine:
    """A ``grove.capture.engine.Engine`` that computes nothing: every call generates ``ANSWER``'s
    tokens and end of turn, each with logprob -0.25, cut to ``max_tokens``. Deterministic.
    ``delay_s``: how long each generation takes (a sleep, no CPU, as a GPU's work looks to the
    server), 0 by default."""

    def __init__(
        self, answer_token_ids: Sequence[int], stop_token_id: int, delay_s: float = 0.0
    ) -> None:
        self.token_ids = (*answer_token_ids, stop_token_id)
        self.delay_s = delay_s

    def check(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Refuse a prompt that leaves no room for ``max_tokens`` in the context."""
        from grove.capture.errors import PromptTooLongError

        if len(prompt_token_ids) + sampling.max_tokens > CONTEXT:
            raise PromptTooLongError(len(prompt_token_ids), sampling.max_tokens, CONTEXT)

    def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        """``ANSWER`` and end of turn (``stop``), or its first ``max_tokens`` (``length``)."""
        from grove.capture.engine import Generation

        self.check(prompt_token_ids, sampling)
        if self.delay_s:
            time.sleep(self.delay_s)
        tokens = self.token_ids[: sampling.max_tokens]
        finish = "stop" if len(tokens) == len(self.token_ids) else "length"
        return Generation(tokens, (-0.25,) * len(tokens), finish)


ROUTE: Final = contextvars.ContextVar[str]("bench_route", default="other")


def thread_cpu_s() -> dict[int, tuple[str, float]]:
    """Each live thread's name and CPU seconds so far, by thread id (empty where threads have no
    CPU clocks: not POSIX)."""
    spent: dict[int, tuple[str, float]] = {}
    for thread in threading.enumerate():
        if thread.ident is None or not hasattr(time, "pthread_getcpuclockid"):
            continue
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            spent[thread.ident] = (thread.name, seconds)
    return spent


def threads_spent(
    before: Mapping[int, tuple[str, float]], now: Mapping[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds spent between two ``thread_cpu_s`` readings by kind of thread: its name
    without a pool's index (the event loop's ``grove-gateway``, the route bodies' ``AnyIO worker
    thread``, the intent pool's ``grove-intent``), threads of one kind summed. A thread that
    ended in between is not counted; one that started since counts from zero (also where it took
    an ended thread's id)."""
    spent: dict[str, float] = {}
    for ident, (name, seconds) in now.items():
        kind = re.sub(r"_\d+$", "", name)
        earlier = before.get(ident)
        if earlier is not None and earlier[0] == name and earlier[1] <= seconds:
            seconds -= earlier[1]
        spent[kind] = spent.get(kind, 0.0) + seconds
    return {kind: seconds for kind, seconds in spent.items() if seconds > 0}


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
        self._threads = thread_cpu_s()

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
        """Since the last take: ``{"cpu_s": process CPU time, "threads": {thread kind: CPU s},
        "routes": {route: {name: [count, inclusive wall s, own wall s or None, own CPU s or
        None]}}}``."""
        with self._lock:
            totals, self._totals = self._totals, {}
            cpu, self._cpu = time.process_time() - self._cpu, time.process_time()
            now, before = thread_cpu_s(), self._threads
            self._threads = now
        routes: dict[str, dict[str, list[Any]]] = {}
        for (route, name), total in totals.items():
            routes.setdefault(route, {})[name] = total
        return {
            "cpu_s": cpu,
            "threads": threads_spent(before, now),
            "routes": routes,
        }


CLOCK: Final = StageClock()


class ThreadProfiles:
    """``cProfile`` of Grove's request path in thread CPU time (waits cost nothing), on every
    thread it runs on: ``wrap`` makes a function
    profiled on the calling thread while it runs (nested and concurrent calls on other threads
    included, the intent pool's thread too), while ``enabled``. ``take`` answers the functions with
    the most own time since the last take, over all threads."""

    def __init__(self) -> None:
        self.enabled = False
        self._lock = threading.Lock()
        self._profiles: list[cProfile.Profile] = []
        self._local = threading.local()

    def wrap(self, function: Callable[..., Any]) -> Any:
        """``function`` profiled on its thread while profiling is enabled."""

        @functools.wraps(function)
        def profiled(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled or getattr(self._local, "active", False):
                return function(*args, **kwargs)
            profile = getattr(self._local, "profile", None)
            if profile is None:
                profile = self._local.profile = cProfile.Profile(time.thread_time)
                with self._lock:
                    self._profiles.append(profile)
            self._local.active = True
            profile.enable()
            try:
                return function(*args, **kwargs)
            finally:
                profile.disable()
                self._local.active = False

        return profiled

    def take(self, top: int = 25) -> list[list[Any]]:
        """``[[function, calls, own s, inclusive s], ...]``, most own time first; then reset."""
        with self._lock:
            profiles, self._profiles = self._profiles, []
        self._local = threading.local()  # every thread starts a fresh profile
        if not profiles:
            return []
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            stats.add(profile)
        rows = []
        table = stats.stats  # type: ignore[attr-defined]
        for (path, line, name), (_, calls, own, inclusive, _) in table.items():
            where = f"{Path(path).name}:{line}({name})" if line else name
            rows.append([where, calls, own, inclusive])
        return sorted(rows, key=lambda row: -row[2])[:top]


PROFILES: Final = ThreadProfiles()


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
    import psycopg
    import sqlalchemy
    from sqlalchemy.engine import Engine
    from sqlalchemy.pool import Pool

    import grove.capture.call_events
    import grove.capture.gateway
    import grove.capture.gateway_service
    import grove.capture.lifecycle
    import grove.capture.splice
    from grove.capture.attempt_views import AttemptViews
    from grove.capture.conversion import RequestConverter
    from grove.capture.lifecycle import CaptureService
    from grove.capture.render import Renderer
    from grove.ledger.attempt import AttemptLog
    from grove.ledger.store import EventStore
    from grove.storage import BlobStore

    stages: list[tuple[object, str, str]] = [
        (RequestConverter, "chat_call", "conversion"),
        (grove.capture.gateway_service.GatewayService, "generate", "gateway checks (own)"),
        (CaptureService, "generate", "lifecycle (own): events, delta, ids, fit"),
        (AttemptViews, "view", "ledger read: the attempt's view"),
        (grove.capture.lifecycle, "normalize_messages", "normalization"),
        (grove.capture.call_events, "normalize_messages", "normalization"),
        (grove.capture.call_events, "output_message", "output parse"),
        (grove.capture.call_events, "fingerprint_output", "admission and digests"),
        (grove.capture.call_events, "chain_digest", "admission and digests"),
        (Renderer, "render", "chat template render"),
        (Renderer, "encode", "tokenize and decode"),
        (Renderer, "decode", "tokenize and decode"),
        (InstantEngine, "check", "engine (instant)"),
        (InstantEngine, "generate", "engine (instant)"),
        (AttemptLog, "intend", "intent append"),
        (AttemptLog, "commit", "commit append"),
        (BlobStore, "put_delta", "blob put"),
        (grove.capture.gateway, "chat_completion", "answer"),
    ]
    for module in (grove.capture.call_events, grove.capture.splice):
        for function in ("admission_items", "locate_boundary", "decide", "replay_summary"):
            stages.append((module, function, "admission and digests"))
    for owner, attribute, name in stages:
        CLOCK.patch(owner, attribute, name)
    for owner, attribute in [(grove.capture.gateway_service.GatewayService, "generate")]:
        setattr(owner, attribute, PROFILES.wrap(getattr(owner, attribute)))
    AttemptLog.intend = PROFILES.wrap(AttemptLog.intend)  # type: ignore[method-assign]

    def count(name: str) -> Callable[..., None]:
        return lambda *_: CLOCK.add(name, 0.0) if CLOCK.enabled else None

    sqlalchemy.event.listen(Engine, "before_cursor_execute", count("count: SQL statements"))
    sqlalchemy.event.listen(Pool, "checkout", count("count: connection checkouts"))
    sqlalchemy.event.listen(Pool, "connect", count("count: new connections (pool misses)"))
    waits = count("count: PostgreSQL round trips (psycopg waits)")
    wait = psycopg.Connection.wait

    @functools.wraps(wait)
    def counted_wait(self: psycopg.Connection, *args: Any, **kwargs: Any) -> Any:
        waits()
        return wait(self, *args, **kwargs)

    psycopg.Connection.wait = counted_wait  # type: ignore[method-assign]
    for owner, attribute, name in [
        (AttemptLog, "refresh", "detail: log reads (after a conflict)"),
        (EventStore, "append", "detail: append transaction"),
        (EventStore, "read_stream", "detail: read_stream"),
        (CaptureService, "_plan", "detail: plan (admission, render, splice)"),
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

    from grove.capture.chat_api import ChatCompletion
    from grove.capture.engine import SamplingParams

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


def serve(specs: Sequence[Mapping[str, Any]]) -> None:
    """The child process: each server of ``specs`` (with its engine's ``delay_s``, default 0, and
    for Grove ``overlap_intents``, default true) in a ``ServerThread``, then commands on stdin,
    one a line, each answered by one JSON line: ``on`` / ``off`` (the stage clock; ``off`` also
    stops profiling), ``profile`` (``cProfile`` of Grove's call path), ``take`` (the stages since
    the last take, and the profile's top functions while profiling), ``stop``. Anything else
    printed goes to stderr."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from grove.capture.embedded import build_tokenizer
    from grove.services.serve import ServerThread, build_gateway
    from grove.workspace import Workspace

    tokenizer = build_tokenizer()
    instrument_grove()
    servers: dict[str, ServerThread] = {}
    for spec in specs:
        delay_s = float(spec.get("delay_s", 0.0))
        engine = InstantEngine(tokenizer.encode(ANSWER), tokenizer.eos_token_id, delay_s)
        if spec["kind"] == "plain":
            app = plain_app(tokenizer, engine)
        else:
            workspace = Workspace(Path(spec["workdir"]), spec["database_url"], spec["blob_url"])
            app = build_gateway(workspace, engine=engine, tokenizer=tokenizer, max_context=CONTEXT)
            app.state.gateway.service.overlap_intents = spec.get("overlap_intents", True)
        app.add_middleware(RouteTimer)
        servers[spec["name"]] = ServerThread(app).start(timeout_s=START_TIMEOUT_S)
    answers.write(json.dumps({name: s.base_url for name, s in servers.items()}) + "\n")
    try:
        for line in sys.stdin:
            command = line.strip()
            if command == "stop":
                break
            CLOCK.enabled = {"on": True, "off": False}.get(command, CLOCK.enabled)
            PROFILES.enabled = {"profile": True, "off": False}.get(command, PROFILES.enabled)
            answer = CLOCK.take() if command == "take" else {}
            if command == "take" and PROFILES.enabled:
                answer["profile"] = PROFILES.take()
            answers.write(json.dumps(answer) + "\n")
    finally:
        for server in servers.values():  # all at once: each stop waits for its loop to notice
            server.server.should_exit = True
        for server in servers.values():
            server.stop()


class ServerProcess:
    """The child process hosting every server; one JSON line answers each command."""

    def __init__(self, specs: Sequence[Mapping[str, Any]], env: Mapping[str, str], log: Path):
        self.log = log
        with log.open("w") as stderr:  # the child keeps writing to its own copy
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.servers.gateway", json.dumps(specs)],
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
def moto_server() -> Iterator[tuple[dict[str, str], Callable[[], None], int]]:
    """moto's S3 server on 127.0.0.1 in its own process: the ``AWS_*`` variables that point
    ``open_blob_store`` at it, ``ready()``, which waits for it and creates the bucket (so
    that the server process can start meanwhile), and its process id."""
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
        yield {**env, "AWS_EC2_METADATA_DISABLED": "true"}, ready, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


def admin_url() -> str:
    """The bench's PostgreSQL server (SQLAlchemy URL of the database it administers from)."""
    environ = os.environ.get
    return environ("GROVE_BENCH_DATABASE_URL") or environ("GROVE_TEST_DATABASE_URL") or DEFAULT_URL


def libpq_dsn(url: str) -> str:
    """``url`` (SQLAlchemy's form) as psycopg connects to it."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.contextmanager
def postgres_databases(
    names: Sequence[str], *, flushed: bool = True
) -> Iterator[dict[str, str] | str]:
    """A fresh database per name, dropped afterwards: ``{name: url}``; or why there is none.
    ``flushed=False`` sets ``synchronous_commit = off`` on these databases alone: no commit waits
    for its WAL flush, so the figures show Grove without the disk (not durable: measuring only)."""
    import psycopg
    from sqlalchemy.engine import make_url

    from grove.ledger import migrate

    admin = make_url(admin_url())
    try:
        connection = psycopg.connect(libpq_dsn(admin_url()), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        yield f"no PostgreSQL at {admin.render_as_string(hide_password=True)}: {error}"
        return
    created: list[str] = []
    try:
        urls = {}
        for name in names:
            created.append(f"grove_bench_gateway_{uuid.uuid4().hex[:12]}")
            connection.execute(f'CREATE DATABASE "{created[-1]}"')
            if not flushed:
                connection.execute(f'ALTER DATABASE "{created[-1]}" SET synchronous_commit = off')
            urls[name] = admin.set(database=created[-1]).render_as_string(hide_password=False)
            migrate.upgrade(urls[name])  # `grove db upgrade`, as the owner: serve never does DDL
        yield urls
    finally:
        for database in created:
            connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        connection.close()


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
