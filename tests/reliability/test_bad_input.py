"""Bad input: no request, payload or admission input makes Grove fail in any but the documented
way, and a refusal writes nothing.

- The gateway's OpenAPI schema drives schemathesis over real HTTP against ``grove serve``:
  ``test_gateway_fuzz.py``.
- Event payloads: random JSON, and mutations of real payloads, validated (``validate_payload``),
  appended (``EventStore.append`` of a ``model_construct`` model) and imported
  (``EventStore.import_events``) on SQLite and PostgreSQL: recorded whole, or a ``LedgerError``
  with nothing written.
- Admission: random requests against random indexes of candidate calls
(``grove.ledger.admission.admit``):
  an ``AdmissionError``, or a decision that keeps every admission rule.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grove.ledger.admission import (
    AdmissionError,
    AdmissionIndex,
    AdmissionItem,
    CallStatus,
    CandidateCall,
    DecisionKind,
    admit,
    prefix_digests,
)
from grove.ledger.errors import LedgerError
from grove.ledger.events import CATALOG, CallFailed, event_class, validate_payload
from grove.ledger.store import EventStore, ImportEvent

from .conftest import capture_service
from .figures import FiguresFile
from .rollouts import play
from .test_tamper import caught_up, fresh_projector, publish_all

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)

# -- event payloads --------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=10,
)


@pytest.fixture(scope="module")
def real_payloads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One recorded payload of every event type, from a played, projected and published group."""
    directory = tmp_path_factory.mktemp("payloads")
    capture = capture_service(f"sqlite:///{directory / 'ledger.db'}", str(directory / "blobs"))
    for index in range(2):
        play(capture, f"g0-r{index}", group="g0", index=index)
    publish_all(caught_up(fresh_projector(capture), capture.log.store))
    capture.log.fail("g0-r0", CallFailed(call_id="t0", reason="engine_error", detail="late"))
    capture.log.cleaned("g0-r0", event_class("attempt.cleaned")(keys=("staging/g0-r0/t0",)))
    store = capture.log.store
    payloads = {}
    for stream in ("g0-r0", "training"):
        for stored in store.read_stream(stream):
            payloads.setdefault(stored.event_type, stored.payload)
    store.close()
    assert set(payloads) == set(CATALOG)
    return payloads


@st.composite
def payloads(draw: st.DrawFn, real: dict[str, dict[str, Any]]) -> tuple[str, Any]:
    """An event type and a payload: random JSON, or a real payload with one field changed,
    removed or added."""
    event_type = draw(st.sampled_from(sorted(real)))
    if draw(st.booleans()):
        return event_type, draw(JSON)
    payload = dict(real[event_type])
    how = draw(st.sampled_from(["change", "remove", "add", "keep"]))
    if how == "add" or not payload:
        payload[draw(st.text(max_size=10))] = draw(JSON)
    elif how != "keep":
        field = draw(st.sampled_from(sorted(payload)))
        if how == "remove":
            del payload[field]
        else:
            payload[field] = draw(JSON)
    return event_type, payload


@pytest.fixture
def ledger(database_url: str) -> Iterator[EventStore]:
    from grove.ledger import migrate

    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    try:
        yield store
    finally:
        store.close()


def test_validation_accepts_a_payload_or_raises_a_ledger_error(
    real_payloads: dict[str, dict[str, Any]], figures: FiguresFile
):
    seen: Counter[str] = Counter()

    @settings(FUZZ, max_examples=600)
    @given(case=payloads(real_payloads), unknown=st.text(max_size=20))
    def check(case: tuple[str, Any], unknown: str) -> None:
        event_type, payload = case
        try:
            event = validate_payload(event_type, payload)
        except LedgerError:
            seen["validate_refused"] += 1
        else:
            seen["validate_accepted"] += 1
            assert validate_payload(event_type, event.model_dump(mode="json")) == event
        if unknown not in CATALOG:
            with pytest.raises(LedgerError, match="Unknown event type"):
                validate_payload(unknown, payload)

    check()
    figures.record("bad-input/payloads/validate", {"cases": sum(seen.values()), **seen})


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # model_construct of bad input
def test_an_appended_or_imported_payload_is_recorded_whole_or_refused_writing_nothing(
    ledger: EventStore, real_payloads: dict[str, dict[str, Any]], figures: FiguresFile
):
    seen: Counter[str] = Counter()

    @FUZZ
    @given(case=payloads(real_payloads), stream=st.one_of(st.just("s"), st.text(max_size=12)))
    def check(case: tuple[str, Any], stream: str) -> None:
        event_type, payload = case
        stream = f"{stream}-{uuid.uuid4().hex[:8]}" if stream == "s" else stream
        imported = f"{stream}-{uuid.uuid4().hex[:8]}"
        for how in ("append", "import"):
            before = ledger.count()
            try:
                if how == "append":
                    if not isinstance(payload, dict):
                        continue
                    model = event_class(event_type).model_construct(**payload)
                    ledger.append(stream, [model])
                else:
                    schema_version = event_class(event_type).schema_version
                    ledger.import_events(  # a new stream: a version clash is another matter
                        [ImportEvent(imported, 1, event_type, schema_version, payload)]
                    )
            except LedgerError:
                seen[f"{how}_refused"] += 1
                assert ledger.count() == before
            else:
                seen[f"{how}_recorded"] += 1
                assert ledger.count() == before + 1
                recorded = ledger.read_stream(stream if how == "append" else imported)[-1]
                assert recorded.decode() == validate_payload(event_type, recorded.payload)

    check()
    backend = ledger.backend.name
    figures.record(f"bad-input/payloads/store-{backend}", {"cases": sum(seen.values()), **seen})


# -- admission -------------------------------------------------------------------------------

DIGESTS = st.sampled_from([f"{i:064x}" for i in range(4)])
ITEM = st.builds(
    AdmissionItem,
    role=st.sampled_from(["user", "assistant", "tool", "user", "assistant", "tool", "system"]),
    digest=DIGESTS,
    canonical_digest=DIGESTS,
    echoed_ids=st.lists(st.sampled_from(["resp-a", "resp-b"]), max_size=2).map(tuple),
)


@st.composite
def admissions(draw: st.DrawFn) -> tuple[list[AdmissionItem], AdmissionIndex, str, bool]:
    """A request, an index whose calls' sources are prefixes of it (or not), a render digest."""
    items = draw(st.lists(ITEM, max_size=7))
    chains = list(prefix_digests(items))
    boundaries = [i for i, item in enumerate(items) if item.role == "assistant"]
    calls = []
    for n in range(draw(st.integers(0, 5))):
        if boundaries and draw(st.booleans()):  # a call whose output ends at an assistant item
            strict, canonical = chains[draw(st.sampled_from(boundaries))]
        elif chains and draw(st.booleans()):
            strict, canonical = chains[draw(st.integers(0, len(chains) - 1))]
        else:
            strict, canonical = draw(DIGESTS), draw(DIGESTS)
        calls.append(
            CandidateCall(
                call_id=f"c{n}",
                status=draw(st.sampled_from(list(CallStatus))),
                source_digest=strict,
                canonical_source_digest=draw(st.sampled_from([strict, canonical])),
                render_options_digest=draw(st.sampled_from(["r0", "r1"])),
                response_ids=frozenset(draw(st.lists(st.sampled_from(["resp-a", "resp-b"])))),
            )
        )
    return items, AdmissionIndex(calls), draw(st.sampled_from(["r0", "r1"])), draw(st.booleans())


def test_admission_decides_by_its_rules_or_raises_an_admission_error(figures: FiguresFile):
    seen: Counter[str] = Counter()

    @settings(FUZZ, max_examples=1500)
    @given(case=admissions())
    def check(case: tuple[list[AdmissionItem], AdmissionIndex, str, bool]) -> None:
        items, index, render, proven = case
        try:
            decision = admit(
                items, render_options_digest=render, index=index,
                tool_content_equivalence_proven=proven,
            )  # fmt: skip
        except AdmissionError:
            seen["admission_refused"] += 1
            return
        seen[f"admission_{decision.kind.value}"] += 1
        boundary = decision.boundary
        assert boundary.item_count == len(items) > boundary.prefix_item_count
        assert (decision.kind is DecisionKind.CONTINUATION) == (decision.parent_call_id is not None)
        assert (decision.kind is DecisionKind.ROOT) == (decision.reason is not None)
        if decision.parent_call_id is not None:
            parents = [
                c
                for c in (
                    *index.by_source_digest(boundary.prefix_digest or ""),
                    *index.by_canonical_source_digest(boundary.canonical_prefix_digest or ""),
                )
                if c.call_id == decision.parent_call_id
            ]
            assert parents and parents[0].status is CallStatus.COMMITTED
            assert parents[0].render_options_digest == render
            assert boundary.suffix_only_observations
            assert items[boundary.prefix_item_count - 1].role == "assistant"
            if parents[0].source_digest != boundary.prefix_digest:
                assert proven and decision.equivalences

    check()
    figures.record("bad-input/admission", {"cases": sum(seen.values()), **seen})
