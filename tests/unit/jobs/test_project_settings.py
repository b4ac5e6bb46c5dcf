"""``grove project`` finalizes with the settings of the run's configuration file, mapped key by key
as the training run maps them (``grove/services/project.py``, ``projector_settings``)."""

from __future__ import annotations

from grove.capture.embedded import build_tokenizer
from grove.config import load_config
from grove.services.project import pad_token_id, projector_settings

RUN = {
    "grpo": {"num_generations_per_prompt": 3, "num_prompts_per_step": 5},
    "policy": {
        "train_global_batch_size": 15,
        "train_micro_batch_size": 2,
        "data_parallel_size": 3,
        "max_total_sequence_length": 777,
    },
    "token_capture": {"forest_training": True, "min_valid_fraction_per_group": 0.5},
    "async_rl": {"max_policy_lag": 2},
}


def test_each_projection_key_of_the_file_sets_its_projector_setting():
    settings = projector_settings(load_config(RUN), training_stream="t", capture_prefix="run-")
    assert (settings.rollouts_per_group, settings.groups_per_step) == (3, 5)
    assert settings.row_multiple == 6  # data_parallel_size 3 x train_micro_batch_size 2
    assert settings.max_row_tokens == 777
    assert settings.forest_training is True
    assert (settings.min_valid_fraction, settings.max_policy_lag) == (0.5, 2)
    assert (settings.training_stream, settings.capture_prefix) == ("t", "run-")


def test_without_a_file_a_shard_takes_the_schemas_defaults():
    defaults = load_config(None)
    settings = projector_settings(defaults)
    assert settings.forest_training is defaults.token_capture.forest_training is False
    assert (settings.rollouts_per_group, settings.groups_per_step) == (4, 4)
    assert settings.row_multiple == defaults.policy.execution_row_multiple == 4
    assert settings.max_row_tokens == defaults.policy.max_total_sequence_length


def test_a_shard_pads_with_the_models_padding_token():
    # the embedded tokenizer pads with <|endoftext|>, id 0 (its end of turn <|im_end|> is 2)
    assert build_tokenizer().pad_token_id == 0
    assert pad_token_id("embedded") == 0
    assert projector_settings(load_config(None)).pad_token_id == 0
