"""Media checks: each owned image's span holds exactly the model's image token, as many as its
patch grid takes at the model's merge size (``training/media_checks.py``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from transformers import Qwen2Config

from grove.ledger.events import RolloutFinalized
from grove.training.errors import RowError
from grove.training.finalization import finalization_event, recorded_media_rules
from grove.training.forest import CallRecord, MaskReason, build_forest
from grove.training.media_checks import MEDIA_MASK_REASON, MediaRules, check_row_media, media_rules
from grove.training.rows import CallExtras, MediaItem, RowTensors, rollout_rows

IMAGE = 9
RULES = MediaRules(image_token_id=IMAGE, merge_size=2)


def rows(prompt: list[int], media: MediaItem, *, child: bool = False) -> list[RowTensors]:
    """Call ``a`` with ``prompt`` and ``media``; with ``child``, two branches continue it (its
    image is in both rows, owned by the first)."""
    calls = [CallRecord("a", None, prompt, [1], [-0.5])]
    selected = ["a"]
    if child:
        calls += [CallRecord("b", "a", [2], [3], [-0.5]), CallRecord("c", "a", [4], [5], [-0.5])]
        selected = ["a", "b", "c"]
    forest = build_forest(calls, selected)
    return rollout_rows(forest, {"a": CallExtras(media=(media,))})


def image(start: int, end: int, height: int = 2, width: int = 4) -> MediaItem:
    return MediaItem("message-0/image-0", "image", start, end, height=height, width=width)


def test_a_span_of_image_tokens_as_long_as_its_grid_takes_passes():
    check_row_media(rows([5, IMAGE, IMAGE, 6], image(1, 3)), RULES)  # 2 x 4 patches: 2 tokens


def test_a_shared_ancestors_image_passes_in_every_row_that_places_it():
    placed = rows([5, IMAGE, IMAGE, 6], image(1, 3), child=True)
    assert [[m.owned for m in row.media] for row in placed] == [[True], [False]]
    check_row_media(placed, RULES)


def test_another_token_at_a_placeholder_masks_the_rollout_naming_it():
    with pytest.raises(RowError, match=r"holds token 6 at placeholder 1 of its span \[1, 3\)") as e:
        check_row_media(rows([5, IMAGE, 6, 7], image(1, 3)), RULES)
    assert (e.value.rule, e.value.call_id) == ("media_placeholder_token", "a")
    assert e.value.mask_reason == MEDIA_MASK_REASON


def test_a_span_longer_than_its_grid_takes_masks_the_rollout():
    with pytest.raises(
        RowError, match=r"spans 3 tokens, but its patch grid 1 x 2 x 4 takes 2"
    ) as e:
        check_row_media(rows([5, IMAGE, IMAGE, IMAGE], image(1, 4)), RULES)
    assert e.value.rule == "media_placeholder_count"
    assert e.value.mask_reason == MEDIA_MASK_REASON


def test_a_grid_the_merge_square_does_not_divide_never_fits():
    with pytest.raises(RowError, match=r"no whole number of placeholders \(merge size 2\)"):
        check_row_media(rows([5, IMAGE, 6], image(1, 2, height=1, width=3)), RULES)


def test_the_model_image_token_decides_not_the_captured_one():
    with pytest.raises(RowError, match="model's image token 7"):
        check_row_media(rows([5, IMAGE, IMAGE], image(1, 3)), MediaRules(7, merge_size=2))


def test_rules_of_a_text_model_are_none():
    assert media_rules(Qwen2Config()) is None


def test_rules_need_a_merge_size_of_at_least_one():
    with pytest.raises(ValueError, match="merge size >= 1, got 9 and 0"):
        MediaRules(IMAGE, merge_size=0)


def test_placeholders_of_a_grid_are_its_patches_over_the_merge_square():
    assert RULES.placeholders(2, 4, 6) == 12
    assert RULES.placeholders(1, 3, 3) is None


def test_a_media_invalid_rollout_is_masked_media_invalid():
    assert MEDIA_MASK_REASON == MaskReason.MEDIA_INVALID == "media_invalid"


def test_a_decision_records_the_rules_its_images_were_held_to():
    event = finalization_event(
        "r", build_forest([CallRecord("a", None, [5], [1], [-0.5])], ["a"]), media_rules=RULES
    )
    assert (event.media_image_token_id, event.media_merge_size) == (IMAGE, 2)
    assert recorded_media_rules(event) == RULES


def test_a_decision_made_without_rules_records_none():
    event = finalization_event("r", build_forest([CallRecord("a", None, [5], [1], [-0.5])], ["a"]))
    assert (event.media_image_token_id, event.media_merge_size) == (None, None)
    assert recorded_media_rules(event) is None


def test_a_decision_is_refused_with_half_of_the_rules():
    with pytest.raises(ValidationError, match="give both or neither, got 9 and None"):
        RolloutFinalized(rollout_id="r", trainable=True, media_image_token_id=IMAGE)
