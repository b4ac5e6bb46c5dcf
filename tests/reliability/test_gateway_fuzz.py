"""Bad input over real HTTP: schemathesis drives a ``grove serve`` process through its OpenAPI
schema, every operation, and the ledger and blob store behind it are checked after each request.

- Positive generation uses the schema narrowed to what a harness sends (``gateway_schema.py``),
  each request naming a fresh open attempt (and, to reject, a committed call of it) with a fresh
  call id, so that most requests pass validation and reach capture, selection and the ledger.
- Negative generation uses the schema as served; half the requests name an open attempt and its
  committed call, so that they get past the attempt checks.
- Hostile values (``hostile_values.py``): a positive request with one place — a body value at any
  depth, a new body key, a path parameter or a header — replaced by a value that once got past
  validation (integers past 2**31 and 2**63, lone surrogates, names ending in a line break,
  special-token text, names past 200 characters, nesting thousands deep), on every operation.

Requests on an attempt carry its token (``X-Grove-Attempt-Token``) when opening answered one.

For every answer: no 5xx; a 4xx wrote no event and no blob; a 2xx is recorded exactly once — the
events that acknowledge it (an attempt opened, a call intended and committed with its one blob, a
rejection, admissions closed, a selection) are each in the attempt's stream once, and nothing else
was written — and sending the same request again records nothing more (an idempotent 2xx, or a
refusal that writes nothing).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from grove.capture.gateway import CALL_ID_HEADER, CAPTURE_KEY_HEADER
from grove.ledger.errors import StreamIdError
from grove.ledger.store import EventStore, StoredEvent
from grove.storage import BlobStore, open_blob_store, staging_key
from grove.workspace import Workspace

from .figures import FiguresFile
from .gateway_schema import narrowed
from .hostile_values import json_text, mutations
from .processes import Child, Launcher

TOKEN_HEADER = "X-Grove-Attempt-Token"

FUZZ = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

ACKNOWLEDGED_BY = {
    "POST /v1/attempts": ("opened", ("attempt.opened",)),
    "POST /v1/chat/completions": ("chat_calls", ("call.intended", "call.committed")),
    "POST /v1/responses": ("responses_calls", ("call.intended", "call.committed")),
    "POST /v1/messages": ("messages_calls", ("call.intended", "call.committed")),
    "POST /v1/attempts/{capture_key}/close": ("closed", ("attempt.admissions_closed",)),
    "POST /v1/attempts/{capture_key}/result": (
        "results",
        ("attempt.admissions_closed", "attempt.settled", "rollout.selected"),
    ),
    "POST /v1/attempts/{capture_key}/calls/{call_id}/reject": ("rejections", ("call.failed",)),
}
"""The figure name and the events that record a 2xx of each writing operation; every other
operation writes nothing."""

MODEL_CALLS = {"POST /v1/chat/completions", "POST /v1/responses", "POST /v1/messages"}
POSITIVE_2XX_PERCENT = 25
"""The least share of 2xx answers (in percent) each operation gets in positive mode."""


@dataclass(frozen=True)
class Answer:
    """What a request got: status, text, and headers (each name with its values)."""

    status_code: int
    text: str
    headers: dict[str, list[str]]


@dataclass
class Served:
    """A ``grove serve`` process and, read from this process, the ledger and blobs behind it."""

    process: Child
    store: EventStore
    blobs: BlobStore
    http: httpx.Client
    tokens: dict[str, str] = field(default_factory=dict)
    _numbers: Iterator[int] = field(default_factory=itertools.count)

    @property
    def base_url(self) -> str:
        """The gateway's root URL."""
        assert self.process.base_url is not None
        return self.process.base_url

    def fresh(self, prefix: str) -> str:
        """An identifier no request has used."""
        return f"{prefix}-{next(self._numbers)}"

    def open_attempt(self) -> str:
        """A newly opened attempt's capture key."""
        key = self.fresh("att")
        body = {"capture_key": key, "rollout_id": key, "prompt_group": "g", "rollout_index": 0}
        answer = self.http.post("/v1/attempts", json=body)
        assert answer.status_code == 200, answer.text
        token = answer.json().get("attempt_token")
        if token is not None:
            self.tokens[key] = token
        return key

    def token_headers(self, capture_key: str) -> dict[str, str]:
        """The header carrying the attempt's token ({} when it has none)."""
        token = self.tokens.get(capture_key)
        return {} if token is None else {TOKEN_HEADER: token}

    def committed_call(self, capture_key: str) -> str:
        """The call id of a call committed in ``capture_key``."""
        call_id = self.fresh("call")
        body = {
            "model": self.model(),
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        }
        headers = {CAPTURE_KEY_HEADER: capture_key, CALL_ID_HEADER: call_id}
        headers.update(self.token_headers(capture_key))
        answer = self.http.post("/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        return call_id

    def model(self) -> str:
        """The model the gateway serves."""
        return self.http.get("/v1/models").json()["data"][0]["id"]

    def snapshot(self, stream: str | None) -> tuple[int, set[str], list[StoredEvent]]:
        """Event count, blob keys, and the events of ``stream`` (none when there is no stream)."""
        try:
            events = self.store.read_stream(stream) if stream else []
        except StreamIdError:  # a key no stream can have: nothing to read
            events = []
        return self.store.count(), set(self.blobs.list_keys()), events


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``grove serve`` on SQLite and a local blob directory, in its own process."""
    directory = tmp_path_factory.mktemp("gateway-fuzz")
    workspace = Workspace.resolve(directory / "work")
    process = Launcher(directory).gateway(workspace)
    store = EventStore.open(workspace.database_url)
    assert process.base_url is not None
    try:
        with httpx.Client(base_url=process.base_url, timeout=60) as http:
            yield Served(process, store, open_blob_store(workspace.blob_url), http)
    finally:
        store.close()
        process.stop()


def _stream(case: schemathesis.Case) -> str | None:
    """The attempt a request names: in its body, its capture-key header or its path."""
    if case.operation.label == "POST /v1/attempts" and isinstance(case.body, dict):
        key = case.body.get("capture_key")
    else:
        key = (case.path_parameters or {}).get("capture_key") or (case.headers or {}).get(
            CAPTURE_KEY_HEADER
        )
    return key if isinstance(key, str) else None


def _pin_valid(case: schemathesis.Case, served: Served) -> None:
    """Name a fresh open attempt (a fresh key, to open one), a committed call and a fresh call
    id, where the operation takes them."""
    names = {parameter.name for parameter in case.operation.iter_parameters()}
    if case.operation.label == "POST /v1/attempts":
        case.body["capture_key"] = served.fresh("opened")
        if case.headers:  # a token of its own, when proposed, has its own rules: none
            case.headers.pop(TOKEN_HEADER, None)
        return
    if not names & {"capture_key", CAPTURE_KEY_HEADER}:
        return
    key = served.open_attempt()
    if "capture_key" in names:
        case.path_parameters = {**(case.path_parameters or {}), "capture_key": key}
    if "call_id" in names:
        case.path_parameters["call_id"] = served.committed_call(key)
    case.headers = {**(case.headers or {}), **served.token_headers(key)}
    if CAPTURE_KEY_HEADER in names:
        case.headers.update({CAPTURE_KEY_HEADER: key, CALL_ID_HEADER: served.fresh("call")})


def _pinned_or_free(operation: Any, served: Served, known: dict[str, str]) -> st.SearchStrategy:
    """Negative requests: free, or naming the open attempt (and its call) where the operation
    takes one, so that they get past the attempt checks."""
    names = {p.name for p in operation.iter_parameters()}
    headers = served.token_headers(known["capture_key"])
    if CAPTURE_KEY_HEADER in names:
        headers[CAPTURE_KEY_HEADER] = known["capture_key"]
    pinned = operation.as_strategy(
        GenerationMode.NEGATIVE,
        headers=headers or None,
        path_parameters={k: v for k, v in known.items() if k in names} or None,
    )
    return st.one_of(operation.as_strategy(GenerationMode.NEGATIVE), pinned)


def _check_recorded_once(
    served: Served,
    case: schemathesis.Case,
    before: tuple[int, set[str], list[StoredEvent]],
    call_id: str | None,
) -> None:
    """The request's acknowledging events are each in its stream once, with nothing else new."""
    label, stream = case.operation.label, _stream(case)
    count, blobs, events = served.snapshot(stream)
    new = events[len(before[2]) :]
    acknowledged = ACKNOWLEDGED_BY.get(label, ("", ()))[1]
    assert {event.event_type for event in new} <= set(acknowledged), (label, new)
    assert count - before[0] == len(new), f"{label} wrote outside its attempt's stream"
    for event_type in acknowledged:
        matching = [
            event
            for event in events
            if event.event_type == event_type
            and (call_id is None or event.payload.get("call_id") in (None, call_id))
        ]
        assert len(matching) == 1, (label, event_type, matching)
    expected_blobs = {staging_key(stream, call_id)} if label in MODEL_CALLS else set()
    assert blobs - before[1] <= expected_blobs
    assert expected_blobs <= blobs


def _call_id(case: schemathesis.Case, response: Any) -> str | None:
    """The call a 2xx recorded (model calls answer its id in a header) or rejected."""
    if case.operation.label in MODEL_CALLS:
        headers = {name.lower(): values for name, values in response.headers.items()}
        return headers[CALL_ID_HEADER.lower()][0]
    return (case.path_parameters or {}).get("call_id")


def _sent(served: Served, case: schemathesis.Case) -> Callable[[], Answer]:
    """Sending ``case`` as schemathesis serializes it."""

    def send() -> Answer:
        response = case.call(base_url=served.base_url, timeout=60)
        headers = {name: list(values) for name, values in response.headers.items()}
        return Answer(response.status_code, response.text, headers)

    return send


def _exercise(
    served: Served,
    case: schemathesis.Case,
    answers: Counter[str],
    send: Callable[[], Answer] | None = None,
) -> None:
    """Send ``case`` (and a 2xx again; ``send``: how, else as schemathesis serializes it) and
    check what it wrote."""
    label, stream = case.operation.label, _stream(case)
    send = send or _sent(served, case)
    before = served.snapshot(stream)
    response = send()
    status = response.status_code
    answers[f"status_{status // 100}xx"] += 1
    answers[f"{label} {status // 100}xx"] += 1
    assert status < 500, f"{label}: {status} {response.text}"
    if status >= 400:
        answers["refusals_checked_for_writes"] += 1
        assert served.snapshot(stream)[:2] == before[:2], f"{label} {status}: {response.text}"
        return
    call_id = _call_id(case, response)
    _check_recorded_once(served, case, before, call_id)
    answers["acknowledgements_checked"] += 1
    if label in ACKNOWLEDGED_BY:
        answers[f"recorded_{ACKNOWLEDGED_BY[label][0]}"] += 1
    if label in MODEL_CALLS and CALL_ID_HEADER not in (case.headers or {}):
        return  # without a call id, the same request again is another call
    again = served.snapshot(stream)
    repeated = send()
    assert repeated.status_code < 500, f"{label} sent again: {repeated.text}"
    assert served.snapshot(stream)[:2] == again[:2], f"{label} sent again wrote more"
    _check_recorded_once(served, case, before, call_id)
    answers["sent_again_checked"] += 1


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_2xx_is_recorded_once_and_every_refusal_writes_nothing(
    served: Served, mode: GenerationMode, figures: FiguresFile
):
    raw = served.http.get("/openapi.json").json()
    schema = schemathesis.openapi.from_dict(
        narrowed(raw, served.model()) if mode is GenerationMode.POSITIVE else raw
    )
    known_key = served.open_attempt()
    known = {"capture_key": known_key, "call_id": served.committed_call(known_key)}
    answers: Counter[str] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        strategy = (
            operation.as_strategy(mode)
            if mode is GenerationMode.POSITIVE
            else _pinned_or_free(operation, served, known)
        )

        @FUZZ
        @given(case=strategy)
        def check(case: schemathesis.Case) -> None:
            if mode is GenerationMode.POSITIVE:
                _pin_valid(case, served)
            _exercise(served, case, answers)

        try:
            check()
        except Unsatisfiable:  # nothing to make invalid (e.g. GET /health has no input)
            assert mode is GenerationMode.NEGATIVE
            continue
        answers["operations"] += 1
    answers["cases"] = sum(v for k, v in answers.items() if k.startswith("status_"))
    by_operation = _by_operation(answers)
    record: dict[str, Any] = {"schemathesis": schemathesis.SCHEMATHESIS_VERSION, **answers}
    if mode is GenerationMode.POSITIVE:
        shares = _percent_2xx(by_operation)
        record["2xx_percent"] = shares
        assert answers["status_2xx"] > answers["cases"] // 2, answers
        low = {label: share for label, share in shares.items() if share < POSITIVE_2XX_PERCENT}
        assert low == {}, f"positive mode reaches 2xx too rarely: {low}"
    figures.record(f"bad-input/gateway-{mode.value}", {**record, "by_operation": by_operation})


def test_the_narrowed_schema_keeps_every_operation_and_parameter(served: Served):
    raw = served.http.get("/openapi.json").json()
    assert narrowed(raw, served.model())["paths"] == raw["paths"]


def _by_operation(answers: Counter[str]) -> dict[str, dict[str, int]]:
    """The per-operation counts (``"POST /v1/responses 2xx"``) taken out of ``answers``, as
    ``{operation: {"2xx": n, ...}}``."""
    nested: dict[str, dict[str, int]] = {}
    for key in sorted(k for k in answers if k.startswith(("GET ", "POST "))):
        label, kind = key.rsplit(" ", 1)
        nested.setdefault(label, {})[kind] = answers.pop(key)
    return nested


def _percent_2xx(by_operation: dict[str, dict[str, int]]) -> dict[str, int]:
    """Per operation, the share of its answers that were 2xx, in whole percent."""
    return {
        label: round(100 * counts.get("2xx", 0) / sum(counts.values()))
        for label, counts in by_operation.items()
    }


def _hostile_send(served: Served, case: schemathesis.Case, body: Any) -> Callable[[], Answer]:
    """Sending ``case`` with ``body`` as :func:`json_text` writes it and its path parameters
    percent-encoded, over the suite's own client."""
    path = case.path
    for name, value in (case.path_parameters or {}).items():
        path = path.replace("{" + name + "}", quote(str(value), safe=""))
    headers = {str(k): str(v) for k, v in (case.headers or {}).items()}
    content = None
    if body is not None:
        content = json_text(body)
        headers["content-type"] = "application/json"

    def send() -> Answer:
        response = served.http.request(case.method, path, content=content, headers=headers)
        values: dict[str, list[str]] = {}
        for name, value in response.headers.multi_items():
            values.setdefault(name, []).append(value)
        return Answer(response.status_code, response.text, values)

    return send


HOSTILE = settings(FUZZ, max_examples=20)


def test_hostile_values_anywhere_get_no_5xx_and_every_refusal_writes_nothing(
    served: Served, figures: FiguresFile
):
    raw = served.http.get("/openapi.json").json()
    schema = schemathesis.openapi.from_dict(narrowed(raw, served.model()))
    answers: Counter[str] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()

        @HOSTILE
        @given(case=operation.as_strategy(GenerationMode.POSITIVE), data=st.data())
        def check(case: schemathesis.Case, data: st.DataObject) -> None:
            _pin_valid(case, served)
            case.path_parameters = dict(case.path_parameters or {})
            case.headers = dict(case.headers or {})
            body = case.body if isinstance(case.body, (dict, list)) else None
            mutation = data.draw(mutations(body, case.path_parameters, case.headers))
            body = mutation.apply(body, case.path_parameters, case.headers)
            answers[f"mutated_{mutation.where}"] += 1
            _exercise(served, case, answers, _hostile_send(served, case, body))

        check()
        answers["operations"] += 1
    answers["cases"] = sum(v for k, v in answers.items() if k.startswith("status_"))
    assert answers["status_4xx"] > 0, answers
    by_operation = _by_operation(answers)
    figures.record(
        "bad-input/gateway-hostile",
        {
            "schemathesis": schemathesis.SCHEMATHESIS_VERSION,
            **answers,
            "by_operation": by_operation,
        },
    )
