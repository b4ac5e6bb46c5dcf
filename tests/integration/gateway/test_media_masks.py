"""Media checks at finalization, end to end: rollouts captured through the VL gateway over real
HTTP, projected by the real projector from the ledger they were written to
(``training/media_checks.py``, ``docs/forest.md``).

A prompt group of two rollouts: ``img`` sees image A (a 1 x 4 x 4 patch grid: 4 placeholders at
merge size 2), ``txt`` sees text only. Held to the rules of the model that served them, both
train; held to the rules of a model that reads images otherwise (another image token, another
merge size), the image rollout breaks them: its rollout is masked before its decision is
recorded, nothing of it reaches the batch, and its text sibling trains.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from grove.capture.embedded_vlm import VIDEO_TOKEN, build_vlm_model, vision_token_ids
from grove.training.advantages import AdvantageConfig, compute_advantages, group_decisions
from grove.training.media_checks import MEDIA_MASK_REASON, MediaRules, media_rules
from grove.training.metrics import MASKED_ROLLOUTS, ROWS, step_metrics
from grove.training.projector import Projector, ProjectorSettings, PublishedBatch

from .support import Gateway
from .test_images import IMAGE_ID, TOKENIZER, A, call, serve_vlm, user

SERVED = MediaRules(image_token_id=IMAGE_ID, merge_size=2)


@dataclass
class Group:
    """The two settled, selected rollouts of prompt group ``g0``."""

    gateway: Gateway

    def publish(self, rules: MediaRules) -> PublishedBatch:
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

    def finalized(self, capture_key: str) -> tuple[bool, str | None]:
        """(trainable, masked reason) as ``rollout.finalized`` recorded them."""
        recorded = self.gateway.state(capture_key).recorded_finalization()
        return recorded.trainable, recorded.masked_reason


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    with serve_vlm(tmp_path) as gateway:
        for index, (key, message) in enumerate(
            [("img", user("look", A)), ("txt", user("read this"))]
        ):
            gateway.open(key, rollout_index=index, selection_policy="all_captured")
            completion = call(gateway.client(key), f"{key}-1", [message])
            answer = gateway.http.post(
                f"/v1/attempts/{key}/result",
                json={"reward": float(index), "terminal_response_id": completion.id},
            )
            assert answer.status_code == 200, answer.text
        yield Group(gateway)


def test_the_served_models_rules_are_those_of_its_configuration():
    assert media_rules(build_vlm_model(TOKENIZER).config) == SERVED


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
    assert (metrics[MASKED_ROLLOUTS], metrics[ROWS]) == (1.0, 1.0)


def test_a_projector_rebuilt_from_the_ledger_keeps_the_media_mask(group: Group):
    other_token = MediaRules(vision_token_ids(TOKENIZER)[VIDEO_TOKEN], merge_size=2)
    first = group.publish(other_token)
    rebuilt = group.publish(other_token)
    assert rebuilt.rebuilt and rebuilt.batch.rollout_ids == first.batch.rollout_ids
    assert [len(r.rollout.rows) for r in rebuilt.rollouts] == [0, 1]
