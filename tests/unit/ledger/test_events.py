"""The event catalog: stable type names, validation with clear errors, upcasting of old versions."""

from __future__ import annotations

import pytest

from grove.ledger.errors import InvalidEventPayload, StreamIdError, UnknownEventType
from grove.ledger.events import CATALOG, AttemptOpened, validate_payload
from grove.ledger.store import validate_stream_id
from grove.ledger.upcasting import UPCASTERS, decode_payload

DESIGN_CATALOG = {
    "attempt.opened",
    "call.intended",
    "call.committed",
    "call.failed",
    "attempt.admissions_closed",
    "attempt.settled",
    "rollout.selected",
    "rollout.finalized",
    "batch.published",
    "attempt.cleaned",
}


def test_catalog_holds_exactly_the_designed_event_types():
    assert set(CATALOG) == DESIGN_CATALOG


def test_unknown_event_type_is_refused_with_the_known_types():
    with pytest.raises(
        UnknownEventType, match=r"'call\.exploded' is not in the catalog.*call\.failed"
    ):
        validate_payload("call.exploded", {})


def test_invalid_payload_names_the_event_and_the_field():
    with pytest.raises(InvalidEventPayload, match=r"'call\.failed'.*call_id: Field required"):
        validate_payload("call.failed", {"reason": "engine_error"})


def test_payload_with_an_unknown_field_is_refused():
    with pytest.raises(InvalidEventPayload, match=r"surprise: Extra inputs are not permitted"):
        validate_payload("call.failed", {"call_id": "c1", "reason": "x", "surprise": 1})


def test_version_one_attempt_opened_is_upcast_to_the_current_model():
    old = {
        "capture_key": "k",
        "rollout_id": "r",
        "prompt_group": "g",
        "rollout_index": 0,
        "policy_version": 3,
        "model_fingerprint": "m",
        "template_fingerprint": "t",
    }
    event = decode_payload("attempt.opened", 1, old)
    assert isinstance(event, AttemptOpened)
    assert (event.forest_mode, event.selection_policy) == (False, "returned_history")
    assert old.get("forest_mode") is None  # the stored payload is not rewritten


def test_payload_from_a_newer_grove_is_refused():
    with pytest.raises(InvalidEventPayload, match=r"written by a newer Grove"):
        decode_payload("call.failed", 2, {"call_id": "c", "reason": "x"})


def test_every_version_bump_has_an_upcaster_chain():
    for event_type, cls in CATALOG.items():
        for version in range(1, cls.schema_version):
            assert (event_type, version) in UPCASTERS, (event_type, version)


@pytest.mark.parametrize("stream_id", ["", "a/b", "../x", "a..b", "-lead", "a b", "x" * 201, 7])
def test_stream_id_outside_the_alphabet_is_refused(stream_id):
    with pytest.raises(StreamIdError, match="Invalid stream id"):
        validate_stream_id(stream_id)


@pytest.mark.parametrize("stream_id", ["a", "attempt-1", "g0.r1:try_2@host", "x" * 200])
def test_stream_id_inside_the_alphabet_is_accepted(stream_id):
    assert validate_stream_id(stream_id) == stream_id


def test_catalog_page_documents_every_event_type():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[3] / "docs" / "events.md").read_text()
    assert {t for t in CATALOG if f"`{t}`" not in page} == set()
