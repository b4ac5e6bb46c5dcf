"""Every configuration key has a test that shows its effect: ``EFFECTS`` maps each key to it.

The rule (``docs/train.md``, "Configuration reference"): every key is read by the code that runs
and has a test that shows what changing it changes; a key that nothing reads does not exist. A
new key turns ``test_every_configuration_key_has_a_behavioural_test`` red until it is mapped
here to a test that changes it and shows what happens:

- ``test_run_keys``: a tiny ``grove train`` run (``run_training``) with the key changed;
- ``test_learner_keys``: a training step of ``TrainingRun`` built from the configuration;
- ``test_refused_keys``: keys whose only supported value is their default; their effect is the
  refusal of any other value when the configuration is loaded;
- ``test_capture_keys``: capture keys (``token_capture.strict``), shown on a tiny run;
- ``test_moe_run``: ``model.architecture``, shown on a tiny run of the embedded MoE model;
- ``test_device_keys``: ``policy.device``, ``policy.precision`` and activation checkpointing,
  shown on the run's model, optimizer state, logprobs and gradients;
- ``test_sequence_packing_keys``: the ``policy.sequence_packing`` keys, shown on the bins a
  training step runs and what they refuse;
- ``test_fork_keys``: the ``grpo.forks`` keys, shown on the fork groups a tiny run plays;
- ``test_tree_packing_key``: ``policy.tree_packing``, shown on a training step of the run's trainer;
- ``tests/e2e/test_train_fsdp.py``: ``policy.dtensor_cfg.enabled``, shown on the weights and
  checkpoints of ``grove train`` under ``torchrun`` with two sharded ranks;
- ``tests/integration/gateway/test_limits.py`` and ``test_image_limits.py``: the
  ``gateway.limits`` keys, each shown on what a gateway built with it refuses over real HTTP;
- ``tests/integration/gateway/test_reward_bound.py``: ``grpo.max_abs_reward``, shown on the
  rewards a gateway built from the configuration takes and refuses over real HTTP;
- ``tests/unit/jobs/test_engines.py``: the engine keys (``engine.kind``, ``engine.vllm_*``), shown
  on what the run launches or connects to (a real vLLM run is ``make test-vllm``'s).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from grove.config import config_field_paths
from tests.e2e import test_train_fsdp as train_fsdp
from tests.integration.gateway import test_call_budget as call_budget
from tests.integration.gateway import test_image_limits as image_limits
from tests.integration.gateway import test_limits as limits
from tests.integration.gateway import test_reward_bound as reward_bound
from tests.unit.config import test_capture_keys as capture
from tests.unit.config import test_device_keys as device
from tests.unit.config import test_fork_keys as forks
from tests.unit.config import test_learner_keys as learner
from tests.unit.config import test_moe_run as moe
from tests.unit.config import test_refused_keys as refused
from tests.unit.config import test_run_keys as run
from tests.unit.config import test_sequence_packing_keys as packing
from tests.unit.config import test_tree_packing_key as tree
from tests.unit.jobs import test_engines as engines

EFFECTS: dict[str, Callable[..., None]] = {
    # the run
    "seed": run.test_seed_seeds_every_rollout,
    "model.path": run.test_model_path_is_the_policy_the_gateway_serves_and_trains,
    "model.dtype": run.test_model_dtype_is_the_dtype_the_policy_trains_in,
    "model.warm_start": run.test_model_warm_start_trains_from_the_warm_started_weights,
    "model.architecture": (
        moe.test_model_architecture_moe_is_the_policy_the_gateway_serves_and_trains
    ),
    "engine.host": run.test_engine_host_is_the_address_the_gateway_listens_on,
    "engine.port": run.test_engine_port_is_the_port_the_gateway_listens_on,
    "engine.auth_token": (
        run.test_engine_auth_token_guards_the_gateway_and_is_handed_to_the_harness
    ),
    "engine.default_max_tokens": run.test_engine_default_max_tokens_bounds_a_call_that_names_none,
    "engine.kind": engines.test_engine_kind_vllm_puts_a_vllm_server_behind_the_runs_gateway,
    "engine.vllm_launch": engines.test_vllm_launch_starts_vllm_on_the_runs_current_weights,
    "engine.vllm_url": engines.test_vllm_url_is_the_server_whose_weights_grove_reloads,
    "engine.vllm_python": engines.test_vllm_python_is_the_interpreter_that_runs_the_server,
    "engine.vllm_args": engines.test_vllm_args_follow_groves_own_arguments,
    "engine.vllm_start_timeout_s": (
        engines.test_vllm_start_timeout_stops_a_server_that_does_not_serve_in_time
    ),
    "engine.vllm_weights_dir": (
        engines.test_vllm_weights_dir_is_where_the_weights_and_the_servers_log_go
    ),
    # the gateway's limits
    "gateway.limits.max_body_bytes": (
        limits.test_a_content_length_over_max_body_bytes_is_refused_before_the_body_is_sent
    ),
    "gateway.limits.body_timeout_s": (
        limits.test_a_body_that_stops_arriving_is_refused_after_body_timeout_s
    ),
    "gateway.limits.header_timeout_s": (
        limits.test_a_head_sent_too_slowly_is_cut_off_after_header_timeout_s
    ),
    "gateway.limits.keep_alive_timeout_s": (
        limits.test_an_idle_keep_alive_connection_is_closed_after_keep_alive_timeout_s
    ),
    "gateway.limits.max_header_bytes": limits.test_a_head_over_max_header_bytes_is_refused,
    "gateway.limits.max_json_depth": (
        limits.test_a_body_deeper_than_max_json_depth_is_refused_before_parsing
    ),
    "gateway.limits.max_json_containers": (
        limits.test_a_body_of_more_containers_than_max_json_containers_is_refused_before_parsing
    ),
    "gateway.limits.max_messages": (
        limits.test_a_call_with_more_messages_than_max_messages_is_refused
    ),
    "gateway.limits.max_string_chars": (
        limits.test_a_string_longer_than_max_string_chars_is_never_written
    ),
    "gateway.limits.max_schema_bytes": limits.test_a_schema_over_max_schema_bytes_is_refused,
    "gateway.limits.max_schema_depth": limits.test_a_schema_over_max_schema_depth_is_refused,
    "gateway.limits.max_schema_nodes": limits.test_a_schema_over_max_schema_nodes_is_refused,
    "gateway.limits.max_image_bytes": (
        image_limits.test_an_image_over_max_image_bytes_is_refused_before_it_is_decoded
    ),
    "gateway.limits.max_image_pixels": (
        image_limits.test_an_image_over_max_image_pixels_is_refused
    ),
    "harness.target": run.test_harness_target_is_the_function_that_plays_each_rollout,
    "harness.concurrency": run.test_harness_concurrency_plays_that_many_rollouts_at_once,
    "harness.options": run.test_harness_options_are_the_harness_keyword_arguments,
    "data.path": run.test_data_path_is_the_task_file_the_harness_plays,
    "data.shuffle": run.test_data_shuffle_off_plays_the_tasks_in_file_order,
    "data.shuffle_seed": run.test_data_shuffle_seed_draws_another_task_order,
    "data.epochs": run.test_data_epochs_play_the_task_file_again_before_the_run_stops,
    "logging.tensorboard": run.test_logging_tensorboard_off_writes_no_event_files,
    "grpo.max_num_steps": run.test_max_num_steps_stops_the_run,
    "grpo.num_prompts_per_step": run.test_num_prompts_per_step_plays_that_many_tasks_per_step,
    "grpo.num_generations_per_prompt": (
        run.test_num_generations_per_prompt_plays_each_task_that_many_times
    ),
    "checkpointing.enabled": run.test_checkpointing_disabled_writes_no_checkpoint,
    "checkpointing.checkpoint_dir": run.test_checkpoint_dir_is_where_the_run_checkpoints_go,
    "checkpointing.save_period": run.test_save_period_checkpoints_every_nth_step,
    "token_capture.pending_call_timeout_s": (
        run.test_pending_call_timeout_masks_a_rollout_whose_call_outlives_it
    ),
    "token_capture.selection_policy": run.test_selection_policy_chooses_the_calls_that_train,
    "token_capture.strict": (
        capture.test_token_capture_strict_refuses_the_calls_the_template_cannot_continue
    ),
    "token_capture.forest_training": (
        run.test_forest_training_trains_a_rewritten_rollout_instead_of_masking_it
    ),
    "policy.max_total_sequence_length": (
        run.test_max_total_sequence_length_masks_an_over_long_rollout_and_caps_the_gateway_context
    ),
    "policy.data_parallel_size": (
        run.test_data_parallel_size_pads_each_step_to_its_execution_row_multiple
    ),
    "async_rl.rollout_failure.rollout_timeout_s": (
        run.test_rollout_timeout_s_abandons_a_rollout_whose_harness_has_not_returned_in_time
    ),
    "async_rl.rollout_failure.max_replacement_groups": (
        run.test_max_replacement_groups_replaces_a_dropped_group_before_the_step_trains
    ),
    "grpo.forks.per_step": (
        forks.test_forks_per_step_makes_one_group_of_step_1_a_fork_of_a_step_0_turn
    ),
    "grpo.forks.pick": (
        forks.test_forks_pick_low_reward_forks_a_turn_of_a_rollout_below_its_groups_mean
    ),
    "async_rl.max_policy_lag": (
        run.test_max_policy_lag_drops_a_group_whose_calls_span_more_policy_versions
    ),
    # the learner
    "grpo.normalize_rewards": learner.test_normalize_rewards_divides_advantages_by_the_group_std,
    "grpo.use_leave_one_out_baseline": learner.test_leave_one_out_baseline_changes_advantages,
    "grpo.advantage_clip_high": learner.test_advantage_clip_high_caps_each_rollouts_advantage,
    "grpo.advantage_clip_low": learner.test_advantage_clip_low_floors_each_rollouts_advantage,
    "grpo.masked_reward_policy": (
        learner.test_masked_reward_policy_include_keeps_a_filtered_rollouts_reward_in_the_baseline
    ),
    "grpo.overlong_filtering": (
        learner.test_overlong_filtering_excludes_a_rollout_that_hit_the_length_limit
    ),
    "grpo.seq_logprob_error_threshold": (
        learner.test_seq_logprob_error_threshold_excludes_a_rollout_the_trainer_disagrees_with
    ),
    "token_capture.min_valid_fraction_per_group": (
        learner.test_min_valid_fraction_per_group_drops_a_group_with_too_few_verified_rollouts
    ),
    "async_rl.rollout_failure.min_step_batch_fraction": (
        learner.test_min_step_batch_fraction_stops_a_step_that_retains_too_few_prompt_groups
    ),
    "loss_fn.ratio_clip_max": learner.test_ratio_clip_max_caps_the_ratio_of_a_positive_advantage,
    "loss_fn.ratio_clip_min": learner.test_ratio_clip_min_floors_the_ratio_of_a_negative_advantage,
    "policy.learning_rate": learner.test_learning_rate_is_the_size_of_the_first_adam_step,
    "policy.weight_decay": (
        learner.test_weight_decay_shrinks_every_weight_on_a_step_without_gradient
    ),
    "policy.max_grad_norm": learner.test_max_grad_norm_clips_the_gradient_the_optimizer_applies,
    "policy.lr_warmup_rollouts": (
        learner.test_lr_warmup_rollouts_ramps_the_learning_rate_over_logical_rollouts
    ),
    "policy.train_micro_batch_size": (
        learner.test_train_micro_batch_size_is_the_rows_of_each_forward_pass
    ),
    "policy.logprob_micro_batch_size": (
        learner.test_logprob_micro_batch_size_is_the_rows_of_each_recompute_pass
    ),
    "policy.train_global_batch_size": (
        learner.test_train_global_batch_size_is_the_logical_rollouts_of_every_step
    ),
    # refused unless left at their default
    "token_capture.enabled": refused.test_token_capture_disabled_is_refused,
    "token_capture.defer_routed_experts_to_policy": (
        refused.test_deferred_routed_experts_are_refused
    ),
    "grpo.calculate_advantages_on_gpu": refused.test_advantages_on_the_gpu_are_refused,
    "grpo.reward_shaping.enabled": refused.test_reward_shaping_is_refused,
    # the gateway
    "grpo.max_abs_reward": reward_bound.test_the_configuration_key_sets_the_bound_of_the_gateway,
    "loss_fn.token_level_loss": refused.test_sequence_level_loss_is_refused,
    "loss_fn.sequence_level_importance_ratios": (
        refused.test_sequence_level_importance_ratios_are_refused
    ),
    "policy.megatron_cfg.enabled": refused.test_megatron_learner_is_refused,
    "policy.megatron_cfg.virtual_pipeline_model_parallel_size": (
        refused.test_interleaved_pipeline_stages_are_refused
    ),
    "policy.automodel_cfg.enabled": refused.test_automodel_learner_is_refused,
    "policy.sequence_packing.enabled": (
        packing.test_sequence_packing_trains_bins_of_train_mb_tokens_with_the_same_loss
    ),
    "policy.sequence_packing.train_mb_tokens": (
        packing.test_bins_smaller_than_the_longest_row_are_refused
    ),
    "policy.sequence_packing.logprob_mb_tokens": (
        packing.test_logprob_mb_tokens_bounds_the_recompute_passes
    ),
    "policy.sequence_packing.algorithm": (
        packing.test_an_algorithm_other_than_first_fit_decreasing_is_refused
    ),
    "policy.device": device.test_device_cpu_puts_model_and_optimizer_state_on_the_cpu,
    "policy.precision": (
        device.test_precision_bfloat16_trains_float32_weights_from_bfloat16_logits
    ),
    "policy.dtensor_cfg.enabled": (
        train_fsdp.test_a_sharded_run_resumed_on_two_ranks_reaches_the_single_process_weights
    ),
    "policy.dtensor_cfg.activation_checkpointing": (
        device.test_activation_checkpointing_recomputes_layers_with_the_same_gradients
    ),
    "policy.dynamic_batching.enabled": refused.test_dynamic_batching_is_refused,
    "token_capture.max_model_calls": (
        call_budget.test_the_configuration_key_sets_the_budget_of_the_gateway
    ),
    "policy.tree_packing": (
        tree.test_tree_packing_computes_each_shared_prefix_once_with_the_same_loss
    ),
}
"""Each configuration key and the test that shows what changing it changes."""


def test_every_configuration_key_has_a_behavioural_test() -> None:
    keys = config_field_paths()
    untested = sorted(keys - set(EFFECTS))
    gone = sorted(set(EFFECTS) - keys)
    assert not untested, (
        f"keys without a test of their effect: {untested}; write one that changes the key and "
        "shows what happens (or remove the key if nothing reads it), and map it in EFFECTS"
    )
    assert not gone, f"EFFECTS maps keys the configuration no longer has: {gone}"


def test_each_key_has_its_own_collected_test() -> None:
    modules = {
        learner.__name__,
        refused.__name__,
        run.__name__,
        engines.__name__,
        capture.__name__,
        device.__name__,
        packing.__name__,
        forks.__name__,
        moe.__name__,
        tree.__name__,
        limits.__name__,
        image_limits.__name__,
        reward_bound.__name__,
        call_budget.__name__,
        train_fsdp.__name__,
    }
    for key, effect in EFFECTS.items():
        module = inspect.getmodule(effect)
        assert module is not None and module.__name__ in modules, key
        assert effect.__name__.startswith("test_"), key
        assert getattr(module, effect.__name__) is effect, key  # collected by pytest
    assert len(set(EFFECTS.values())) == len(EFFECTS), "one test per key"
