"""Keys whose only supported value is their default: the effect of any other value is its refusal
when the configuration is loaded (``grove/config/schema.py``, ``unsupported_combinations``),
with the message below and nothing started."""

from __future__ import annotations

from typing import Any

import pytest

from grove.config import ConfigurationError, load_config


def _problems(data: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(ConfigurationError) as refused:
        load_config(data)
    return refused.value.problems


def test_token_capture_disabled_is_refused() -> None:
    assert _problems({"token_capture": {"enabled": False}}) == (
        "token_capture.enabled: false is not supported: Grove trains only on the exact tokens "
        "it captured",
    )


def test_deferred_routed_experts_are_refused() -> None:
    assert _problems({"token_capture": {"defer_routed_experts_to_policy": True}}) == (
        "token_capture.defer_routed_experts_to_policy: true is not supported: routed experts "
        "are assembled with each call's capture",
    )


def test_advantages_on_the_gpu_are_refused() -> None:
    assert _problems({"grpo": {"calculate_advantages_on_gpu": True}}) == (
        "grpo.calculate_advantages_on_gpu: true is not supported: advantages are computed per "
        "logical rollout on the CPU",
    )


def test_reward_shaping_is_refused() -> None:
    assert _problems({"grpo": {"reward_shaping": {"enabled": True}}}) == (
        "grpo.reward_shaping.enabled: true is not supported: each logical rollout keeps the one "
        "reward its harness gave",
    )


def test_sequence_level_loss_is_refused() -> None:
    assert _problems({"loss_fn": {"token_level_loss": False}}) == (
        "loss_fn.token_level_loss: false is not supported (token-level loss only)",
    )


def test_sequence_level_importance_ratios_are_refused() -> None:
    assert _problems({"loss_fn": {"sequence_level_importance_ratios": True}}) == (
        "loss_fn.sequence_level_importance_ratios: true is not supported",
    )


def test_megatron_learner_is_refused() -> None:
    assert _problems({"policy": {"megatron_cfg": {"enabled": True}}}) == (
        "policy.megatron_cfg.enabled: true is not supported: megatron-core's GPTModel needs "
        "CUDA even for a forward pass (its rotary embedding and attention buffers call "
        "torch.cuda.current_device()), so Grove cannot test a Megatron learner on the CPU "
        "its tests run on; the sharded learner is FSDP2: set policy.dtensor_cfg.enabled: true",
    )


def test_interleaved_pipeline_stages_are_refused() -> None:
    megatron = {"policy": {"megatron_cfg": {"virtual_pipeline_model_parallel_size": 2}}}
    assert _problems(megatron) == (
        "policy.megatron_cfg.virtual_pipeline_model_parallel_size (2): interleaved Megatron is "
        "not supported",
    )
    # one stage per rank is no interleaving: accepted, as the default (None) is
    single = {"policy": {"megatron_cfg": {"virtual_pipeline_model_parallel_size": 1}}}
    assert load_config(single).policy.megatron_cfg.virtual_pipeline_model_parallel_size == 1


def test_automodel_learner_is_refused() -> None:
    assert _problems({"policy": {"automodel_cfg": {"enabled": True}}}) == (
        "policy.automodel_cfg.enabled: true is not supported: Grove's learner is its torch trainer",
    )


def test_fsdp2_sharding_with_tree_packing_is_refused() -> None:
    sharded_trees = {"policy": {"dtensor_cfg": {"enabled": True}, "tree_packing": True}}
    assert _problems(sharded_trees) == (
        "policy.dtensor_cfg.enabled: true is not supported with policy.tree_packing: true: a "
        "tree-packed micro batch holds whole prompt trees, so ranks may run different "
        "numbers of passes, and FSDP2 gathers every layer in every pass on every rank; turn "
        "one of them off (unsharded data-parallel ranks sum gradients once per step, so "
        "tree packing trains on them)",
    )
    # either alone loads
    assert load_config({"policy": {"dtensor_cfg": {"enabled": True}}}).policy.dtensor_cfg.enabled


def test_dynamic_batching_is_refused() -> None:
    assert _problems({"policy": {"dynamic_batching": {"enabled": True}}}) == (
        "policy.dynamic_batching.enabled: true is not supported",
    )


def test_more_fork_groups_than_prompt_groups_are_refused() -> None:
    forks = {"num_prompts_per_step": 2, "forks": {"per_step": 3}}
    harness = {"target": "grove.demo.tool_agent:play"}
    data = {"harness": harness, "data": {"path": "tasks.jsonl"}, "grpo": forks}
    assert _problems({**data, "policy": {"train_global_batch_size": 8}}) == (
        "grpo.forks.per_step (3) must not exceed grpo.num_prompts_per_step (2): fork groups "
        "take the place of task groups in a step",
    )


def test_forks_with_an_external_harness_are_refused() -> None:
    assert _problems({"harness": {"target": "external"}, "grpo": {"forks": {"per_step": 1}}}) == (
        "grpo.forks.per_step needs an in-process harness (harness.target: module:function): "
        "grove train plays the forks itself; external agents open forks with grove.client "
        "(docs/fork.md)",
    )
