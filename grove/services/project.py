"""``grove project``: one projector shard, run until its steps are published or it is stopped.

The shard (``training/projector_shards.py``) finalizes the ready attempts of the prompt groups it
leases in PostgreSQL (``ledger/leases.py``); start as many as the work needs, on any machines that
reach the ledger and the blob store. With ``steps`` it also publishes: a ``Projector`` created
with ``finalize=False`` reads the shards' finalizations and publishes steps ``0..steps-1`` in
order of completion, as the trainer's projector would (each step once, whichever shard gets
there first: the training stream's expected version), and the command returns when all are
published. Without ``steps`` it finalizes until stopped (SIGTERM, Ctrl-C).

Every shard of a ledger must run with the settings of the run that trains on it (group size,
forest mode, row limit): they decide ``rollout.finalized``, which ``grove replay --verify``
checks against the same settings. So a shard reads the run's configuration file:
``projector_settings`` maps its keys to the projector's settings as the training run does —
``grpo.num_generations_per_prompt`` and ``grpo.num_prompts_per_step`` (group size, groups per
step), ``policy.execution_row_multiple`` (data-parallel size x micro batch),
``token_capture.forest_training``, ``policy.max_total_sequence_length`` (the row limit),
``token_capture.min_valid_fraction_per_group`` and ``async_rl.max_policy_lag`` (the group
rules) — and pads with the padding token of ``model.path``'s tokenizer (its end-of-sequence
token when it has none). With ``model.architecture: vlm`` it holds each rollout's images to the
embedded Qwen2-VL's media rules (its image token and merge size, read from its configuration),
as the training run does.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grove.config import EMBEDDED, GroveConfig
from grove.ledger.leases import Leases
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from grove.training.media_checks import MediaRules, media_rules
from grove.training.projector import Projector, ProjectorSettings
from grove.training.projector_shards import ProjectorShard
from grove.workspace import Workspace

if TYPE_CHECKING:  # transformers loads only when a pad id is asked for
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "ShardReport",
    "holder_name",
    "model_media_rules",
    "pad_token_id",
    "projector_settings",
    "run_shard",
]


def pad_token_id(model_path: str) -> int:
    """The padding token of ``model_path``'s tokenizer (``embedded``: the built-in one), or its
    end-of-sequence token when it has none, as the training run pads."""
    from grove.engines.models import quiet_transformers

    tokenizer: PreTrainedTokenizerBase
    with quiet_transformers():
        if model_path == EMBEDDED:
            from grove.capture.embedded import build_tokenizer

            tokenizer = build_tokenizer()
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad)


def projector_settings(
    config: GroveConfig, *, training_stream: str = "training", capture_prefix: str = ""
) -> ProjectorSettings:
    """The projector settings of ``config`` (the module docstring names each key), publishing
    on ``training_stream`` and following the attempts whose capture keys start with
    ``capture_prefix``."""
    policy = config.policy
    return ProjectorSettings(
        rollouts_per_group=config.grpo.num_generations_per_prompt,
        groups_per_step=config.grpo.num_prompts_per_step,
        row_multiple=policy.execution_row_multiple,
        pad_token_id=pad_token_id(config.model.path),
        training_stream=training_stream,
        capture_prefix=capture_prefix,
        forest_training=config.token_capture.forest_training,
        max_row_tokens=policy.max_total_sequence_length,
        min_valid_fraction=config.token_capture.min_valid_fraction_per_group,
        max_policy_lag=config.async_rl.max_policy_lag,
        media_rules=model_media_rules(config),
    )


def model_media_rules(config: GroveConfig) -> MediaRules | None:
    """The media rules of ``config``'s model: the embedded Qwen2-VL's for
    ``model.architecture: vlm`` (from its configuration; no weights are built), else None."""
    if config.model.architecture != "vlm":
        return None
    from grove.capture.embedded_vlm import build_vlm_config, build_vlm_tokenizer
    from grove.engines.models import quiet_transformers

    with quiet_transformers():
        rules = media_rules(build_vlm_config(build_vlm_tokenizer()))
    assert rules is not None  # the embedded Qwen2-VL has an image token
    return rules


@dataclass(frozen=True)
class ShardReport:
    """What one shard did: the attempts it finalized and the steps it published itself."""

    holder: str
    finalized: int
    published: tuple[int, ...]

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {"holder": self.holder, "finalized": self.finalized, "published": self.published}


def holder_name() -> str:
    """This process's name as a lease holder: ``grove-project HOST pid PID`` (at most 63
    characters, PostgreSQL's ``application_name`` limit)."""
    return f"grove-project {socket.gethostname()[:32]} pid {os.getpid()}"


def run_shard(
    workspace: Workspace,
    settings: ProjectorSettings,
    *,
    max_groups: int,
    steps: int = 0,
    poll_s: float = 0.2,
) -> ShardReport:
    """Run one shard over ``workspace``'s ledger and blob store (see the module docstring)."""
    store = EventStore.open(workspace.database_url)
    holder = holder_name()
    try:
        blobs = open_blob_store(workspace.blob_url)
        shard = ProjectorShard(
            store, blobs, settings, Leases.open(store.engine, holder), max_groups=max_groups
        )
        publisher = Projector(store, blobs, settings, finalize=False) if steps else None
        published: list[int] = []
        try:
            while True:
                shard.poll()
                if publisher is not None:
                    publisher.poll()
                    while publisher.published_steps < steps:
                        batch = publisher.batch_for_step(publisher.published_steps)
                        if batch is None:
                            break
                        if not batch.rebuilt:
                            published.append(batch.step)
                    if publisher.published_steps >= steps:
                        return ShardReport(holder, len(shard.finalized_here), tuple(published))
                time.sleep(poll_s)
        finally:
            shard.close()
    finally:
        store.close()
