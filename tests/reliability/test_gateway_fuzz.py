"""Bad input over real HTTP: schemathesis drives a ``grove serve`` process through its OpenAPI
schema, every operation, and the ledger and blob store behind it are checked after each request.

- Positive generation uses the schema narrowed to what a harness sends (``gateway_schema.py``),
  each request naming a fresh open attempt (and, to reject, a committed call of it) with a fresh
  call id, so that most requests pass validation and reach capture, selection and the ledger.
- Negative generation uses the schema as served; half the requests name an open attempt and its
  committed call, so that they get past the attempt checks.

For every answer: no 5xx; a 4xx wrote no event and no blob; a 2xx is recorded exactly once — the
events that acknowledge it (an attempt opened, a call intended and committed with its one blob, a
rejection, admissions closed, a selection) are each in the attempt's stream once, and nothing else
was written — and sending the same request again records nothing more (an idempotent 2xx, or a
refusal that writes nothing).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

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
from .processes import Child, Launcher

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
    "POST /v1/attempts/{capture_key}/close": ("closed", ("attempt.admissions_closed",)),
    "POST /v1/attempts/{capture_key}/result": (
        "results",
        ("attempt.admissions_closed", "attempt.settled", "rollout.selected"),
    ),
    "POST /v1/attempts/{capture_key}/calls/{call_id}/reject": ("rejections", ("call.failed",)),
}
"""The figure name and the events that record a 2xx of each writing operation; every other
operation writes nothing."""

MODEL_CALLS = {"POST /v1/chat/completions", "POST /v1/responses"}


@dataclass
class Served:
    """A ``grove serve`` process and, read from this process, the ledger and blobs behind it."""

    process: Child
    store: EventStore
    blobs: BlobStore
    http: httpx.Client
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
        assert self.http.post("/v1/attempts", json=body).status_code == 200
        return key

    def committed_call(self, capture_key: str) -> str:
        """The call id of a call committed in ``capture_key``."""
        call_id = self.fresh("call")
        body = {"model": self.model(), "messages": [{"role": "user", "content": "hi"}]}
        headers = {CAPTURE_KEY_HEADER: capture_key, CALL_ID_HEADER: call_id}
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
        return
    if not names & {"capture_key", CAPTURE_KEY_HEADER}:
        return
    key = served.open_attempt()
    if "capture_key" in names:
        case.path_parameters = {**(case.path_parameters or {}), "capture_key": key}
    if "call_id" in names:
        case.path_parameters["call_id"] = served.committed_call(key)
    if CAPTURE_KEY_HEADER in names:
        case.headers = {
            **(case.headers or {}),
            CAPTURE_KEY_HEADER: key,
            CALL_ID_HEADER: served.fresh("call"),
        }


def _pinned_or_free(operation: Any, served: Served, known: dict[str, str]) -> st.SearchStrategy:
    """Negative requests: free, or naming the open attempt (and its call) where the operation
    takes one, so that they get past the attempt checks."""
    names = {p.name for p in operation.iter_parameters()}
    pinned = operation.as_strategy(
        GenerationMode.NEGATIVE,
        headers={CAPTURE_KEY_HEADER: known["capture_key"]} if CAPTURE_KEY_HEADER in names else None,
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


def _exercise(served: Served, case: schemathesis.Case, answers: Counter[str]) -> None:
    """Send ``case`` (and a 2xx again) and check what it wrote."""
    label, stream = case.operation.label, _stream(case)
    before = served.snapshot(stream)
    response = case.call(base_url=served.base_url, timeout=60)
    status = response.status_code
    answers[f"status_{status // 100}xx"] += 1
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
    repeated = case.call(base_url=served.base_url, timeout=60)
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
    if mode is GenerationMode.POSITIVE:
        assert answers["status_2xx"] > answers["cases"] // 2, answers
    figures.record(
        f"bad-input/gateway-{mode.value}",
        {"schemathesis": schemathesis.SCHEMATHESIS_VERSION, **answers},
    )


def test_the_narrowed_schema_keeps_every_operation_and_parameter(served: Served):
    raw = served.http.get("/openapi.json").json()
    assert narrowed(raw, served.model())["paths"] == raw["paths"]
