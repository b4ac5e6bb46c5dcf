"""Configuration: keys, bounds, the renamed key, policy resolution, combination rules (what each
key changes: tests/unit/config/test_key_effects.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from grove.config import ConfigurationError, GroveConfig, load_config

POLICIES = "tests.unit.trainer.selection_policies"

FOREST = {"token_capture": {"enabled": True, "forest_training": True}}


def _with(*sections: dict) -> dict:
    merged: dict = {}
    for section in sections:
        for key, value in section.items():
            merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    return merged


def _problems(data: dict) -> tuple[str, ...]:
    with pytest.raises(ConfigurationError) as caught:
        load_config(data)
    return caught.value.problems


def _sections(model: type[BaseModel]) -> list[type[BaseModel]]:
    found = [model]
    for field in model.model_fields.values():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found.extend(_sections(field.annotation))
    return found


def test_every_field_has_a_default_and_a_docstring() -> None:
    for section in _sections(GroveConfig):
        for name, field in section.model_fields.items():
            assert not field.is_required(), f"{section.__name__}.{name} has no default"
            assert field.description, f"{section.__name__}.{name} has no docstring"


def test_defaults_load_without_a_source() -> None:
    config = load_config()
    assert config.token_capture.selection_policy == "returned_history"
    assert config.grpo.masked_reward_policy == "exclude"
    assert config.policy.train_global_batch_size == 16


def test_yaml_and_json_files_load_the_same_configuration(tmp_path: Path) -> None:
    data = _with(FOREST, {"grpo": {"advantage_clip_low": -2.0, "overlong_filtering": True}})
    (tmp_path / "c.yaml").write_text(
        "token_capture:\n  enabled: true\n  forest_training: true\n"
        "grpo:\n  advantage_clip_low: -2.0\n  overlong_filtering: true\n"
    )
    (tmp_path / "c.json").write_text(json.dumps(data))
    from_yaml = load_config(tmp_path / "c.yaml")
    assert from_yaml == load_config(str(tmp_path / "c.json")) == load_config(data)
    assert from_yaml.grpo.advantage_clip_low == -2.0


def test_empty_yaml_file_gives_the_defaults(tmp_path: Path) -> None:
    (tmp_path / "empty.yml").write_text("")
    assert load_config(tmp_path / "empty.yml") == load_config()


def test_unknown_file_type_is_refused(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text("")
    with pytest.raises(ConfigurationError, match=r"unknown file type '\.toml'"):
        load_config(tmp_path / "c.toml")


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read the file"):
        load_config(tmp_path / "absent.yaml")


def test_unparsable_yaml_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("grpo: [unclosed\n")
    with pytest.raises(ConfigurationError, match="cannot parse the file"):
        load_config(tmp_path / "bad.yaml")


def test_top_level_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigurationError, match="the top level must be a mapping, got list"):
        load_config(tmp_path / "list.yaml")


def test_unknown_key_is_refused() -> None:
    assert _problems({"grpo": {"advantage_clip_lo": 1.0}}) == (
        "grpo.advantage_clip_lo: unknown key (docs/train.md lists every key)",
    )


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("token_capture", "min_valid_fraction_per_group", 1.5, "less than or equal to 1"),
        ("grpo", "seq_logprob_error_threshold", 0.5, "greater than or equal to 1"),
        ("grpo", "masked_reward_policy", "drop", "'exclude' or 'include'"),
        ("loss_fn", "ratio_clip_min", 1.0, "less than 1"),
        ("policy", "train_micro_batch_size", 0, "greater than or equal to 1"),
        ("async_rl", "rollout_failure", {"min_step_batch_fraction": 0.0}, "greater than 0"),
    ],
)
def test_values_outside_their_bounds_are_refused(section, key, value, message) -> None:
    (problem,) = _problems({section: {key: value}})
    assert problem.startswith(f"{section}.{key}")
    assert message in problem


def test_context_compaction_key_is_refused_with_a_migration_message() -> None:
    assert _problems({"token_capture": {"context_compaction": True}}) == (
        "token_capture: token_capture.context_compaction was renamed to "
        "token_capture.forest_training: rename the key and keep its value (True)",
    )


def test_custom_selection_policy_resolves_during_validation() -> None:
    config = load_config(
        _with(FOREST, {"token_capture": {"selection_policy": f"{POLICIES}:select_all"}})
    )
    assert config.token_capture.selection_policy == f"{POLICIES}:select_all"


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("no_such_module_anywhere:select", "(unknown_module)"),
        (f"{POLICIES}:missing", "(missing_attribute)"),
        (f"{POLICIES}:NOT_A_FUNCTION", "(not_callable)"),
        ("newest_first", "(malformed_name)"),
    ],
)
def test_unusable_selection_policy_is_refused_before_any_rollout(policy, message) -> None:
    (problem,) = _problems(_with(FOREST, {"token_capture": {"selection_policy": policy}}))
    assert problem.startswith(f"token_capture.selection_policy: Selection policy {policy!r}")
    assert message in problem


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (
            {"token_capture": {"enabled": False}},
            "token_capture.enabled: false is not supported: Grove trains only on the exact "
            "tokens it captured",
        ),
        (
            {"policy": {"megatron_cfg": {"enabled": True}}},
            "policy.megatron_cfg.enabled: true is not supported: megatron-core's GPTModel needs "
            "CUDA even for a forward pass (its rotary embedding and attention buffers call "
            "torch.cuda.current_device()), so Grove cannot test a Megatron learner on the CPU "
            "its tests run on; the sharded learner is FSDP2: set policy.dtensor_cfg.enabled: true",
        ),
        (
            {"harness": {"target": "examples.recency_agent:play"}},
            "harness.target 'examples.recency_agent:play' plays tasks from a file: set data.path "
            "to a JSONL file of tasks",
        ),
        (
            {"harness": {"options": {"turns": 2}}},
            "harness.options is read only by an in-process harness; with harness.target: "
            "external your agents bring their own tasks: remove it",
        ),
        (
            {"async_rl": {"rollout_failure": {"max_replacement_groups": 1}}},
            "async_rl.rollout_failure.max_replacement_groups is read only by an in-process "
            "harness; with harness.target: external your agents bring their own tasks: remove it",
        ),
        (
            {"token_capture": {"selection_policy": "all_captured"}},
            "token_capture.selection_policy 'all_captured' needs "
            "token_capture.forest_training: true",
        ),
        (
            _with(FOREST, {"token_capture": {"defer_routed_experts_to_policy": True}}),
            "token_capture.defer_routed_experts_to_policy: true is not supported: routed experts "
            "are assembled with each call's capture",
        ),
        (
            _with(FOREST, {"policy": {"automodel_cfg": {"enabled": True}}}),
            "policy.automodel_cfg.enabled: true is not supported: Grove's learner is its torch "
            "trainer",
        ),
        (
            _with(
                FOREST,
                {"policy": {"megatron_cfg": {"virtual_pipeline_model_parallel_size": 2}}},
            ),
            "policy.megatron_cfg.virtual_pipeline_model_parallel_size (2): interleaved Megatron is "
            "not supported",
        ),
        (
            _with(FOREST, {"grpo": {"calculate_advantages_on_gpu": True}}),
            "grpo.calculate_advantages_on_gpu: true is not supported: advantages are computed per "
            "logical rollout on the CPU",
        ),
        (
            _with(FOREST, {"grpo": {"reward_shaping": {"enabled": True}}}),
            "grpo.reward_shaping.enabled: true is not supported: each logical rollout keeps the "
            "one reward its harness gave",
        ),
        (
            {"policy": {"train_global_batch_size": 32}},
            "policy.train_global_batch_size (32) must equal the logical rollouts per step, "
            "grpo.num_prompts_per_step x grpo.num_generations_per_prompt (16): one optimizer step "
            "per batch",
        ),
        (
            {"grpo": {"advantage_clip_low": 1.0, "advantage_clip_high": -1.0}},
            "grpo.advantage_clip_low (1.0) must not exceed grpo.advantage_clip_high (-1.0)",
        ),
        (
            {"loss_fn": {"token_level_loss": False}},
            "loss_fn.token_level_loss: false is not supported (token-level loss only)",
        ),
        (
            {"loss_fn": {"sequence_level_importance_ratios": True}},
            "loss_fn.sequence_level_importance_ratios: true is not supported",
        ),
        (
            {"policy": {"dynamic_batching": {"enabled": True}}},
            "policy.dynamic_batching.enabled: true is not supported",
        ),
    ],
)
def test_each_unsupported_combination_is_refused(data, problem) -> None:
    assert _problems(data) == (problem,)


def test_unsupported_combinations_are_refused_together_in_one_bulleted_error() -> None:
    data = _with(
        {"token_capture": {"enabled": False}},
        {"token_capture": {"forest_training": True, "defer_routed_experts_to_policy": True}},
        {"grpo": {"calculate_advantages_on_gpu": True}},
        {"loss_fn": {"sequence_level_importance_ratios": True}},
    )
    with pytest.raises(ConfigurationError) as caught:
        load_config(data)
    assert str(caught.value) == (
        "Invalid Grove configuration (mapping):\n"
        "- token_capture.enabled: false is not supported: Grove trains only on the exact tokens "
        "it captured\n"
        "- loss_fn.sequence_level_importance_ratios: true is not supported\n"
        "- token_capture.defer_routed_experts_to_policy: true is not supported: routed experts "
        "are assembled with each call's capture\n"
        "- grpo.calculate_advantages_on_gpu: true is not supported: advantages are computed per "
        "logical rollout on the CPU"
    )


def _forest_overrides(*, megatron: bool) -> dict:
    """The forest-training override block as users copy it (``megatron`` its learner switch)."""
    return _with(
        {
            "token_capture": {
                "enabled": True,
                "forest_training": True,
                "selection_policy": "returned_history",
                "defer_routed_experts_to_policy": False,
            },
            "policy": {
                "megatron_cfg": {"enabled": megatron},
                "automodel_cfg": {"enabled": False},
                "sequence_packing": {"enabled": False},
                "dynamic_batching": {"enabled": False},
            },
            "grpo": {"calculate_advantages_on_gpu": False},
            "loss_fn": {"token_level_loss": True, "sequence_level_importance_ratios": False},
            "async_rl": {"rollout_failure": {"min_step_batch_fraction": 1}},
        }
    )


def test_forest_overrides_on_the_torch_learner_are_accepted() -> None:
    config = load_config(_forest_overrides(megatron=False))
    assert config.token_capture.forest_training is True
    assert config.policy.megatron_cfg.enabled is False


def test_forest_overrides_as_users_copy_them_are_refused_for_their_megatron_learner() -> None:
    # The block names the Megatron learner (megatron_cfg.enabled: true); every other override
    # is one Grove supports, so that switch is the one problem.
    (problem,) = _problems(_forest_overrides(megatron=True))
    assert problem.startswith("policy.megatron_cfg.enabled: true is not supported")


def test_execution_row_multiple_is_data_parallel_times_micro_batch_for_fixed_batches() -> None:
    config = load_config({"policy": {"data_parallel_size": 4, "train_micro_batch_size": 2}})
    assert config.policy.execution_row_multiple == 8


def test_digest_is_stable_and_changes_with_any_value() -> None:
    assert load_config().digest() == load_config({}).digest()
    assert load_config().digest() != load_config({"seed": 1}).digest()


def test_digest_ignores_how_long_where_and_how_visibly_a_run_goes() -> None:
    changed = {
        "grpo": {"max_num_steps": 7},
        "engine": {"port": 8123, "host": "0.0.0.0", "auth_token": "t"},
        "logging": {"tensorboard": False},
    }
    assert load_config(changed).digest() == load_config().digest()


def test_digest_ignores_fsdp2_sharding_so_a_run_resumes_with_it_turned_on_or_off() -> None:
    sharded = load_config({"policy": {"dtensor_cfg": {"enabled": True}}})
    assert sharded.digest() == load_config().digest()
    # ... while the learner settings beside it still count
    checkpointed = load_config({"policy": {"dtensor_cfg": {"activation_checkpointing": True}}})
    assert checkpointed.digest() != load_config().digest()


def test_digest_ignores_where_the_vllm_server_runs() -> None:
    def vllm(**where: object) -> dict:
        return {"engine": {"kind": "vllm", **where}}

    here = load_config(vllm(vllm_url="http://127.0.0.1:8001", vllm_weights_dir="/tmp/a"))
    moved = load_config(vllm(vllm_url="http://10.0.0.2:9000", vllm_weights_dir="/tmp/b"))
    assert here.digest() == moved.digest()
