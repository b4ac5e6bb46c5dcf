"""Media checks at finalization, end to end: rollouts captured through the VL gateway over real
HTTP, projected by the real projector from the ledger they were written to
(``training/media_checks.py``, ``docs/forest.md``).

A prompt group of two rollouts: ``img`` sees image A (a 1 x 4 x 4 patch grid: 4 placeholders at
merge size 2), ``txt`` sees text only. Held to the rules of the model that served them, both
train; held to the rules of a model that reads images otherwise (another image token, another
merge size), the image rollout breaks them: its rollout is masked before its decision is
recorded, nothing of it reaches the batch, and its text sibling trains.

A rollout whose own record breaks the served model's rules (``bad``: call ``bad-1``, written by
hand, shows A's 1 x 4 x 4 grid over a span of 3 image tokens) is masked alone beside a sibling
that keeps them; unchecked, its rows would stop the trainer. A ``grove project`` shard (on a
PostgreSQL copy of the ledger) records the rules with its decision, so ``grove replay --verify``
re-runs it alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from grove.capture.embedded_vlm import (
    VIDEO_TOKEN,
    VISION_END,
    VISION_START,
    EmbeddedVLMEngine,
    build_vlm_model,
    vision_token_ids,
)
from grove.config import load_config
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.event_replay import CheckOutcome
from grove.ledger.events import CallCommitted, CallIntended, LedgerPosition, ReplaySummary
from grove.ledger.leases import Leases
from grove.ledger.store import EventStore, ImportEvent
from grove.services.project import projector_settings
from grove.storage import BlobStore, CallDelta, chain_digest, describe_media, staging_key
from grove.tools.replay import replay
from grove.training.advantages import AdvantageConfig, compute_advantages, group_decisions
from grove.training.media_checks import MEDIA_MASK_REASON, MediaRules, media_rules
from grove.training.metrics import MASKED_ROLLOUTS, MEDIA_INVALID_ROLLOUTS, ROWS, step_metrics
from grove.training.projector import Projector, ProjectorSettings, PublishedBatch
from grove.training.projector_shards import ProjectorShard

from .support import Gateway
from .test_images import (
    IMAGE_ID,
    TOKENIZER,
    A,
    call,
    logprobs_function,
    serve_vlm,
    step_batch,
    user,
)

SERVED = MediaRules(image_token_id=IMAGE_ID, merge_size=2)


@dataclass
class Group:
    """The two settled, selected rollouts of prompt group ``g0``."""

    gateway: Gateway

    def publish(self, rules: MediaRules | None) -> PublishedBatch:
        """Project the ledger with a new projector holding images to ``rules``; step 0 (published
        by the first projector, rebuilt from the ledger by later ones)."""
        service = self.gateway.service
        projector = Projector(
            service.log.store,
            service.blobs,
            ProjectorSettings(rollouts_per_group=2, groups_per_step=1, media_rules=rules),
        )
        projector.poll()
        published = projector.batch_for_step(0)
        assert published is not None
        return published

    def shard(self, database_url: str, rules: MediaRules | None) -> EventStore:
        """The group's events copied into the PostgreSQL ledger at ``database_url`` and finalized
        there by a ``grove project`` shard holding images to ``rules``; that ledger."""
        migrate.upgrade(database_url)
        store = EventStore.open(database_url)
        events = self.gateway.service.log.store.read_after(LedgerPosition(position=0), 1000)
        assert len(events.events) < 1000  # all of them
        store.import_events(
            ImportEvent(e.stream_id, e.stream_version, e.event_type, e.schema_version, e.payload)
            for e in events.events
        )
        settings = ProjectorSettings(rollouts_per_group=2, groups_per_step=1, media_rules=rules)
        shard = ProjectorShard(
            store, self.gateway.service.blobs, settings, Leases.open(store.engine, "media shard")
        )
        try:
            store.wait_for_horizon()  # every copied event readable (docs/ledger.md)
            assert shard.poll() == 2
        finally:
            shard.close()
        return store

    def finalized(self, capture_key: str) -> tuple[bool, str | None]:
        """(trainable, masked reason) as ``rollout.finalized`` recorded them."""
        recorded = self.gateway.state(capture_key).recorded_finalization()
        return recorded.trainable, recorded.masked_reason


def finish(gateway: Gateway, key: str, reward: float, response_id: str) -> None:
    """Post attempt ``key``'s result: ``response_id`` scored ``reward``."""
    answer = gateway.http.post(
        f"/v1/attempts/{key}/result",
        json={"reward": reward, "terminal_response_id": response_id},
    )
    assert answer.status_code == 200, answer.text


def play(gateway: Gateway, key: str, index: int, message: dict[str, Any]) -> None:
    """Rollout ``index`` of group g0: one call with ``message``, scored ``index``."""
    gateway.open(key, rollout_index=index, selection_policy="all_captured")
    completion = call(gateway.client(key), f"{key}-1", [message])
    finish(gateway, key, float(index), completion.id)


def commit_by_hand(gateway: Gateway, key: str, call_id: str, delta: CallDelta) -> str:
    """Intend and commit root call ``call_id`` of attempt ``key`` with ``delta`` as its blob;
    its response id."""
    log = gateway.service.log
    summary = ReplaySummary(
        normalization_version=1,
        item_count=1,
        source_digest="0" * 64,
        canonical_source_digest="0" * 64,
        render_options_digest="1" * 64,
    )
    intended = CallIntended(
        call_id=call_id,
        decision="root",
        root_reason="initial",
        replay_summary=summary,
        prompt_tokens=len(delta.prompt_delta),
    )
    log.intend(key, intended)
    blob = gateway.service.blobs.put_delta(staging_key(key, call_id), delta)
    response_id = f"resp-{call_id}"
    committed = CallCommitted(
        call_id=call_id,
        prev_len=0,
        delta_len=delta.delta_len,
        cum_len=delta.delta_len,
        prompt_delta_len=len(delta.prompt_delta),
        generated_len=len(delta.generated),
        blob_key=blob.key,
        blob_sha256=blob.sha256,
        blob_bytes=blob.size,
        chain_digest=chain_digest(None, delta.prompt_delta, delta.generated),
        finish_reason="stop",
        response_id=response_id,
        output_fingerprint=hashlib.sha256(call_id.encode()).hexdigest(),
        replay_summary=summary,
    )
    log.commit(key, committed)
    return response_id


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    with serve_vlm(tmp_path) as gateway:
        play(gateway, "img", 0, user("look", A))
        play(gateway, "txt", 1, user("read this"))
        yield Group(gateway)


@pytest.fixture
def broken(tmp_path: Path) -> Iterator[Group]:
    with serve_vlm(tmp_path) as gateway:
        play(gateway, "img", 0, user("look", A))
        gateway.open("bad", rollout_index=1, selection_policy="all_captured")
        ids = vision_token_ids(TOKENIZER)
        text = TOKENIZER.encode("look", add_special_tokens=False)
        prompt = [*text, ids[VISION_START], *[IMAGE_ID] * 3, ids[VISION_END]]
        pixels = torch.zeros(16, 3 * 2 * 14 * 14)  # A's 1 x 4 x 4 patches: 4 placeholders
        image = describe_media(
            media_id="message-0/image-0",
            kind="image",
            pixels=pixels,
            height=4,
            width=4,
            token_span=(len(text) + 1, len(text) + 4),
        )
        delta = CallDelta.from_lists(prompt, text, [-0.5] * len(text), media=[image])
        finish(gateway, "bad", 1.0, commit_by_hand(gateway, "bad", "bad-1", delta))
        yield Group(gateway)


def test_the_served_models_rules_are_those_of_its_configuration():
    assert media_rules(build_vlm_model(TOKENIZER).config) == SERVED


def test_a_vlm_runs_projector_holds_images_to_the_served_models_rules():
    vlm = load_config({"model": {"architecture": "vlm"}})
    assert projector_settings(vlm).media_rules == SERVED
    assert projector_settings(load_config(None)).media_rules is None


def test_images_that_fit_the_models_rules_train(group: Group):
    published = group.publish(SERVED)
    assert group.finalized("img") == (True, None)
    assert published.batch.rollout_ids == ("r-img", "r-txt")
    (image_row,) = published.rollouts[0].rollout.rows
    assert [placed.item.media_id for placed in image_row.media] == ["message-0/image-0"]


@pytest.mark.parametrize(
    "rules",
    [
        MediaRules(vision_token_ids(TOKENIZER)[VIDEO_TOKEN], merge_size=2),
        MediaRules(IMAGE_ID, merge_size=1),
    ],
    ids=["another_image_token", "another_merge_size"],
)
def test_images_that_break_the_models_rules_mask_only_their_rollout(
    group: Group, rules: MediaRules
):
    published = group.publish(rules)
    assert group.finalized("img") == (False, str(MEDIA_MASK_REASON))
    assert group.finalized("txt") == (True, None)
    image, text = published.rollouts
    assert (image.rollout_id, image.rollout.rows) == ("r-img", ())
    assert image.outcome.masked_reason == MEDIA_MASK_REASON
    assert len(text.rollout.rows) == 1
    real_rows = published.batch.parent_indices[published.batch.parent_indices >= 0]
    assert real_rows.tolist() == [1]  # every real row is the text rollout's
    outcomes = published.outcomes
    metrics = step_metrics(
        outcomes=outcomes,
        decisions=group_decisions(outcomes),
        advantages=compute_advantages(outcomes, AdvantageConfig()),
        batch=published.batch,
    )
    assert (metrics[MASKED_ROLLOUTS], metrics[MEDIA_INVALID_ROLLOUTS], metrics[ROWS]) == (
        1.0,
        1.0,
        1.0,
    )


def test_a_projector_rebuilt_from_the_ledger_keeps_the_media_mask(group: Group):
    other_token = MediaRules(vision_token_ids(TOKENIZER)[VIDEO_TOKEN], merge_size=2)
    first = group.publish(other_token)
    rebuilt = group.publish(other_token)
    assert rebuilt.rebuilt and rebuilt.batch.rollout_ids == first.batch.rollout_ids
    assert [len(r.rollout.rows) for r in rebuilt.rollouts] == [0, 1]


def test_a_rollout_whose_record_breaks_the_rules_is_masked_beside_a_sibling_that_keeps_them(
    broken: Group,
):
    published = broken.publish(SERVED)
    assert broken.finalized("bad") == (False, str(MEDIA_MASK_REASON))
    assert broken.finalized("img") == (True, None)
    assert {r.rollout_id: len(r.rollout.rows) for r in published.rollouts} == {
        "r-bad": 0,
        "r-img": 1,
    }


def test_unchecked_the_broken_rollouts_rows_stop_the_trainer(broken: Group):
    published = broken.publish(None)
    assert broken.finalized("bad") == (True, None)
    (rows,) = [r.rollout.rows for r in published.rollouts if r.rollout_id == "r-bad"]
    batch = step_batch(rows)
    model = EmbeddedVLMEngine.build(TOKENIZER, seed=5).model
    with (
        pytest.raises(ValueError, match=r"image tokens do not match, tokens: 3, features: 4"),
        torch.no_grad(),
    ):
        logprobs_function()(model, batch, slice(0, batch.rows))


def verified(store: EventStore, blobs: BlobStore, capture_key: str) -> CheckOutcome:
    """What ``grove replay --verify`` says of ``capture_key``'s recorded decision."""
    replayed = replay(store, capture_key, blobs=blobs)
    assert replayed.checks is not None  # with blobs, every decision is re-run
    (check,) = [c for c in replayed.checks if c.decision == "finalization"]
    return check.outcome


@pytest.mark.postgres
def test_a_shard_masks_the_broken_rollout_records_its_rules_and_replay_holds(
    broken: Group, postgres_url: str
):
    store = broken.shard(postgres_url, SERVED)
    try:
        log, blobs = AttemptLog(store), broken.gateway.service.blobs
        recorded = log.load("bad").recorded_finalization()
        assert (recorded.trainable, recorded.masked_reason) == (False, "media_invalid")
        assert (recorded.media_image_token_id, recorded.media_merge_size) == (IMAGE_ID, 2)
        assert log.load("img").recorded_finalization().trainable
        assert verified(store, blobs, "bad") == verified(store, blobs, "img") == CheckOutcome.SAME
    finally:
        store.close()


@pytest.mark.postgres
def test_a_shard_without_rules_records_none_and_replays_without_them(
    broken: Group, postgres_url: str
):
    store = broken.shard(postgres_url, None)
    try:
        recorded = AttemptLog(store).load("bad").recorded_finalization()
        assert (recorded.trainable, recorded.media_image_token_id) == (True, None)
        assert verified(store, broken.gateway.service.blobs, "bad") == CheckOutcome.SAME
    finally:
        store.close()
