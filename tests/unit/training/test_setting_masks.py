"""The projector's setting masks: forest training off, and rows longer than the trainer accepts."""

from __future__ import annotations

import pytest

from grove.training.errors import BatchError
from grove.training.forest import CallRecord, MaskReason, build_forest
from grove.training.projector import ProjectorSettings, setting_mask_reason

# c0: root, prompt [1, 2, 3], generates [10, 11] -> row c0 has 5 tokens.
# c1 <- c0: observation [4], generates [12]     -> row c0 -> c1 has 7 tokens.
# c2: a rewritten root, prompt [1, 30], generates [13] -> row c2 has 3 tokens.
CALLS = [
    CallRecord("c0", None, [1, 2, 3], [10, 11], [-0.1, -0.2]),
    CallRecord("c1", "c0", [4], [12], [-0.3]),
    CallRecord("c2", None, [1, 30], [13], [-0.4]),
]
SINGLE = build_forest(CALLS, ["c0", "c1"], terminal="c1")  # one path of 7 tokens
REWRITTEN = build_forest(CALLS, ["c0", "c1", "c2"], terminal="c2")  # paths of 7 and 3 tokens


def test_a_row_of_n_plus_one_tokens_is_too_long_under_a_limit_of_n() -> None:
    assert [len(row.token_ids) for row in SINGLE.rows] == [7]
    assert setting_mask_reason(SINGLE, max_row_tokens=6) == MaskReason.ROW_TOO_LONG


def test_a_row_of_exactly_the_limit_trains() -> None:
    assert setting_mask_reason(SINGLE, max_row_tokens=7) is None
    assert setting_mask_reason(SINGLE) is None  # no limit


def test_any_row_over_the_limit_masks_the_whole_rollout() -> None:
    # the 3-token row fits a limit of 6, the 7-token row does not: nothing of it trains
    assert setting_mask_reason(REWRITTEN, max_row_tokens=6) == MaskReason.ROW_TOO_LONG


def test_without_forest_training_a_forest_of_two_paths_is_masked() -> None:
    assert setting_mask_reason(REWRITTEN, forest_training=False) == (
        MaskReason.FOREST_TRAINING_DISABLED
    )
    assert setting_mask_reason(REWRITTEN, forest_training=True) is None


def test_without_forest_training_a_single_path_trains() -> None:
    assert setting_mask_reason(SINGLE, forest_training=False) is None


def test_forest_training_disabled_is_decided_before_row_too_long() -> None:
    reason = setting_mask_reason(REWRITTEN, forest_training=False, max_row_tokens=1)

    assert reason == MaskReason.FOREST_TRAINING_DISABLED


def test_a_forest_masked_already_passes_the_settings() -> None:
    masked = build_forest(CALLS, ["c1"])  # selection not closed: no rows

    assert setting_mask_reason(masked, forest_training=False, max_row_tokens=1) is None


def test_settings_default_to_forest_training_and_no_row_limit() -> None:
    settings = ProjectorSettings(rollouts_per_group=2, groups_per_step=1)

    assert (settings.forest_training, settings.max_row_tokens) == (True, None)


@pytest.mark.parametrize("limit", [0, -5])
def test_a_row_limit_below_one_raises(limit: int) -> None:
    with pytest.raises(BatchError, match=rf"max_row_tokens must be >= 1 or None, got {limit}"):
        ProjectorSettings(rollouts_per_group=2, groups_per_step=1, max_row_tokens=limit)
