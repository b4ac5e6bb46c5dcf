"""The training modules' public surface and error tree are pinned: changing them is a decision."""

from __future__ import annotations

import importlib

import pytest

from grove.training.errors import (
    AdvantageError,
    BatchError,
    ForestError,
    RouteReplayError,
    RowError,
    SelectionError,
    SelectionPolicyError,
    TrainingError,
)

PUBLIC = {
    "grove.training.forest": {
        "CALL_STATUSES",
        "LENGTH_FINISH_REASONS",
        "MASK_REASONS",
        "CallRecord",
        "Forest",
        "ForestRow",
        "MaskReason",
        "RecordRule",
        "RowSegment",
        "build_forest",
    },
    "grove.training.forest_rows": {"ForestRow", "RowSegment", "row_of_path"},
    "grove.training.array_values": {"Array1D", "ArrayValues", "as_list", "values_total"},
    "grove.training.selection": {
        "BUILTIN_POLICIES",
        "COMPLETE_FINISH_REASONS",
        "GENERATED_ITEM_TYPES",
        "REJECTED_BY_HARNESS",
        "REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES",
        "CapturedCall",
        "PolicyRegistry",
        "RolloutSelection",
        "SelectionPolicy",
        "SelectionPolicyFailed",
        "SelectionRule",
        "all_captured",
        "completion_mask_reason",
        "fingerprint_output",
        "is_generated_item",
        "resolve_selection_policy",
        "returned_history",
        "select_rollout",
    },
    "grove.training.captured": {
        "COMPLETE_FINISH_REASONS",
        "REJECTED_BY_HARNESS",
        "REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES",
        "CapturedCall",
        "SelectionRule",
    },
    "grove.training.evidence": {
        "GENERATED_ITEM_TYPES",
        "CaptureIndex",
        "agreed_evidence",
        "attributed_terminal",
        "explicit_terminal",
        "is_generated_item",
        "refuse_named_generations",
    },
    "grove.training.rows": {
        "ROUTE_MISSING_SENTINEL",
        "CallExtras",
        "MediaItem",
        "RowMedia",
        "RowTensors",
        "rollout_rows",
        "row_tensors",
    },
    "grove.training.media_checks": {
        "MEDIA_MASK_REASON",
        "MediaRules",
        "check_row_media",
        "media_rules",
    },
    "grove.training.batch": {"LogicalRollout", "PackedBatch", "TrainingBatch", "assemble_batch"},
    "grove.training.advantages": {
        "AdvantageConfig",
        "GroupDecision",
        "LogicalAdvantages",
        "MaskedRewardPolicy",
        "RolloutFilter",
        "RolloutOutcome",
        "broadcast_to_rows",
        "compute_advantages",
        "group_decisions",
        "pooled_logprob_error",
    },
    "grove.training.errors": {
        "AdvantageError",
        "BatchError",
        "ForestError",
        "RouteReplayError",
        "RowError",
        "SelectionError",
        "SelectionPolicyError",
        "TrainingError",
    },
    "grove.training.route_replay": {
        "REPLAYABLE_ROUTERS",
        "logprob_function",
        "moe_routers",
        "recompute_logprobs",
        "replayed_row_logprobs",
        "replaying",
    },
    "grove.training.tree": {"TreeLayout", "forest_tree", "pack_tree"},
    "grove.training.tree_logprobs": {
        "micro_batch_trees",
        "owner_micro_batches",
        "tree_logprobs",
        "tree_row_lengths",
    },
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_module_exports_exactly_its_pinned_names(module_name: str) -> None:
    module = importlib.import_module(module_name)

    assert set(module.__all__) == PUBLIC[module_name]
    assert all(hasattr(module, name) for name in module.__all__)


def test_metrics_export_every_metric_key_constant() -> None:
    metrics = importlib.import_module("grove.training.metrics")
    keys = {name for name in metrics.__all__ if name.isupper()}

    assert len({getattr(metrics, name) for name in keys}) == len(keys) == 16


@pytest.mark.parametrize(
    "error",
    [
        ForestError,
        SelectionError,
        SelectionPolicyError,
        RowError,
        RouteReplayError,
        BatchError,
        AdvantageError,
    ],
)
def test_every_training_error_is_a_training_error_and_a_value_error(error: type[Exception]) -> None:
    assert issubclass(error, TrainingError)
    assert issubclass(error, ValueError)


def test_errors_keep_the_rule_and_identifiers_as_attributes() -> None:
    forest = ForestError("selection_not_closed", "c2", "parent 'c1' is not selected")
    policy = SelectionPolicyError("pkg:fn", "unknown_module", "no module named 'pkg'")

    assert (forest.rule, forest.call_id) == ("selection_not_closed", "c2")
    assert str(forest) == (
        "Forest rule 'selection_not_closed' violated by call 'c2': parent 'c1' is not selected"
    )
    assert (policy.rule, policy.spec) == ("unknown_module", "pkg:fn")
