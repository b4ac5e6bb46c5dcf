"""Event fields stay in the ranges both ledger databases hold (``grove.ledger.bounds``): counts
and versions fit PostgreSQL's ``integer``, sizes and seeds a signed 64-bit integer, identifiers
200 characters and codes 64. A payload outside them is an ``InvalidEventPayload`` naming the
field, and an append of one writes nothing, whichever path built it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from grove.ledger import migrate
from grove.ledger.bounds import MAX_BYTES, MAX_CODE_CHARS, MAX_COUNT, MAX_NAME_CHARS, MAX_SEED
from grove.ledger.errors import InvalidEventPayload
from grove.ledger.events import AttemptOpened, validate_payload
from grove.ledger.store import EventStore

OPENED = {
    "capture_key": "k",
    "rollout_id": "r",
    "prompt_group": "g",
    "rollout_index": 0,
    "policy_version": 0,
    "model_fingerprint": "m",
    "template_fingerprint": "t",
}
DIGEST = "0" * 64
SUMMARY = {
    "normalization_version": 1,
    "item_count": 1,
    "source_digest": DIGEST,
    "canonical_source_digest": DIGEST,
    "render_options_digest": DIGEST,
}
COMMITTED = {
    "call_id": "c1",
    "prev_len": 0,
    "delta_len": 3,
    "cum_len": 3,
    "prompt_delta_len": 2,
    "generated_len": 1,
    "blob_key": "staging/k/c1",
    "blob_sha256": DIGEST,
    "blob_bytes": 10,
    "chain_digest": DIGEST,
    "finish_reason": "stop",
    "response_id": "resp-1",
    "output_fingerprint": DIGEST,
    "replay_summary": SUMMARY,
}
VALID = {
    "attempt.opened": OPENED,
    "call.committed": COMMITTED,
    "call.intended": {
        "call_id": "c1",
        "decision": "root",
        "replay_summary": SUMMARY,
        "prompt_tokens": 2,
    },
    "call.failed": {"call_id": "c1", "reason": "engine_error"},
    "rollout.selected": {"policy": "all_captured", "call_ids": ["c1"], "reward": 1.0},
    "rollout.finalized": {"rollout_id": "r", "trainable": True},
    "batch.published": {
        "step": 0,
        "rollout_ids": [],
        "row_ids": [],
        "ledger_position": {"position": 0},
    },
}
OUT_OF_RANGE = [
    ("attempt.opened", "rollout_index", MAX_COUNT + 1),
    ("attempt.opened", "policy_version", MAX_COUNT + 1),
    ("attempt.opened", "rollout_id", "r" * (MAX_NAME_CHARS + 1)),
    ("attempt.opened", "prompt_group", "g" * (MAX_NAME_CHARS + 1)),
    ("attempt.opened", "selection_policy", "p" * (MAX_NAME_CHARS + 1)),
    ("attempt.opened", "seed", MAX_SEED + 1),
    ("call.intended", "prompt_tokens", MAX_COUNT + 1),
    ("call.intended", "call_id", "c" * (MAX_NAME_CHARS + 1)),
    ("call.intended", "root_reason", "x" * (MAX_CODE_CHARS + 1)),
    ("call.intended", "policy_version", MAX_COUNT + 1),
    ("call.committed", "cum_len", MAX_COUNT + 1),
    ("call.committed", "generated_len", MAX_COUNT + 1),
    ("call.committed", "blob_bytes", MAX_BYTES + 1),
    ("call.committed", "response_id", "x" * (MAX_NAME_CHARS + 1)),
    ("call.committed", "finish_reason", "x" * 33),
    ("call.failed", "reason", "x" * (MAX_CODE_CHARS + 1)),
    ("rollout.selected", "policy", "p" * (MAX_NAME_CHARS + 1)),
    ("rollout.selected", "terminal_response_id", "x" * (MAX_NAME_CHARS + 1)),
    ("rollout.selected", "reward", math.inf),
    ("rollout.selected", "reward", math.nan),
    ("rollout.finalized", "masked_reason", "x" * (MAX_CODE_CHARS + 1)),
    ("batch.published", "step", MAX_COUNT + 1),
]


def _with(event_type: str, field: str, value: Any) -> dict[str, Any]:
    return {**VALID[event_type], field: value}


@pytest.mark.parametrize("event_type", list(VALID))
def test_the_valid_payloads_of_this_module_validate(event_type: str):
    validate_payload(event_type, VALID[event_type])


@pytest.mark.parametrize(("event_type", "field", "value"), OUT_OF_RANGE)
def test_a_field_out_of_the_databases_range_is_refused_naming_it(
    event_type: str, field: str, value: Any
):
    with pytest.raises(InvalidEventPayload, match=rf"{field}: "):
        validate_payload(event_type, _with(event_type, field, value))


def test_every_range_holds_its_largest_value():
    edge = {
        **OPENED,
        "rollout_id": "r" * MAX_NAME_CHARS,
        "rollout_index": MAX_COUNT,
        "policy_version": MAX_COUNT,
        "seed": MAX_SEED,
    }
    assert validate_payload("attempt.opened", edge) == AttemptOpened(**edge)
    validate_payload("call.committed", {**COMMITTED, "cum_len": MAX_COUNT, "blob_bytes": MAX_BYTES})


def test_an_append_of_an_event_built_without_validation_writes_nothing(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate.upgrade(url)
    store = EventStore.open(url)
    try:
        event = AttemptOpened.model_construct(**{**OPENED, "rollout_index": 2**63})
        with pytest.raises(InvalidEventPayload, match="rollout_index"):
            store.append("k", [event], expected_version=0)
        assert store.count() == 0
    finally:
        store.close()


def test_an_append_of_a_string_json_cannot_hold_is_refused_and_writes_nothing(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate.upgrade(url)
    store = EventStore.open(url)
    try:
        event = AttemptOpened.model_construct(**{**OPENED, "rollout_id": "r\ud800"})
        with pytest.raises(InvalidEventPayload, match="surrogates not allowed"):
            store.append("k", [event], expected_version=0)
        assert store.count() == 0
    finally:
        store.close()
