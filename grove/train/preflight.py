"""Everything ``grove train`` checks before it starts anything: the model directory, the harness
and the task file, refused together in one bulleted ``ConfigurationError`` naming each key (and
the line of a malformed task), so a bad run fails in a second instead of after a model load.

Then, once the model is loaded and before any rollout, :func:`check_policy_model` checks the
actual model (``docs/moe.md``, "The setup check"): a dense model passes; a mixture-of-experts
model must use dropless per-token top-k routing that Grove can replay, without auxiliary losses
or capacity limits, and an engine that captures its routes. Everything else is refused with
every problem listed (``ModelCheckError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import torch

from grove.config import EMBEDDED, EXTERNAL, ConfigurationError, GroveConfig
from grove.engines.models import check_model_directory
from grove.errors import JobError
from grove.train.harness import Harness, HarnessError, resolve_harness
from grove.train.tasks import TaskFileError, load_tasks
from grove.training.route_replay import REPLAYABLE_ROUTERS, moe_routers

__all__ = ["ModelCheckError", "Preflight", "check_policy_model", "moe_problems", "preflight"]

MOE_RULE: Final = (
    "MoE models must use supported dropless per-token routing without auxiliary losses or "
    "capacity limits"
)
_EXPERT_COUNTS: Final = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_CAPACITY_KEYS: Final = (
    "capacity_factor",
    "expert_capacity",
    "moe_expert_capacity_factor",
    "moe_capacity_factor",
    "train_capacity_factor",
    "eval_capacity_factor",
)
_DROPPING_KEYS: Final = (
    "drop_tokens",
    "token_dropping",
    "moe_token_dropping",
    "moe_pad_expert_input_to_capacity",
)
_AUX_LOSS_KEYS: Final = (
    "moe_aux_loss_coeff",
    "aux_loss_alpha",
    "moe_z_loss_coeff",
    "router_z_loss_coef",
)
_MOE_MODULE_HINTS: Final = ("router", "moe", "experts")


class ModelCheckError(JobError, ValueError):
    """The loaded model fails the setup check before any rollout; ``problems`` lists why, one
    sentence each, and the message states the rule."""

    def __init__(self, name: str, problems: list[str]) -> None:
        self.name = name
        self.problems = problems
        listed = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(
            f"Model {name!r} is refused before any rollout: {MOE_RULE} (docs/moe.md).\n{listed}"
        )


@dataclass(frozen=True)
class Preflight:
    """What the checks loaded: the harness function (None: external) and the tasks."""

    harness: Harness | None
    tasks: list[dict[str, Any]]


def preflight(config: GroveConfig, source: str) -> Preflight:
    """Check ``config`` (read from ``source``) against the world; raises ``ConfigurationError``
    with every problem."""
    problems: list[str] = []
    if config.model.path != EMBEDDED:
        problems.extend(f"model.path: {p}" for p in check_model_directory(config.model.path))
    harness = None
    if config.harness.target != EXTERNAL:
        try:
            harness = resolve_harness(config.harness.target, config.harness.config_dir)
        except HarnessError as error:
            problems.append(str(error))
    tasks: list[dict[str, Any]] = []
    if config.data.path is not None:
        try:
            tasks = load_tasks(config.data.path)
        except TaskFileError as error:
            problems.append(f"data.path: {error}")
    if problems:
        raise ConfigurationError(source, problems)
    return Preflight(harness=harness, tasks=tasks)


def check_policy_model(model: torch.nn.Module, name: str, *, engine_kind: str) -> None:
    """Raise ``ModelCheckError`` unless ``model`` may train with Grove on ``engine_kind``: dense
    models pass; MoE models pass :func:`moe_problems`."""
    problems = moe_problems(model, engine_kind=engine_kind)
    if problems:
        raise ModelCheckError(name, problems)


def moe_problems(model: torch.nn.Module, *, engine_kind: str = "embedded") -> list[str]:
    """Why the loaded ``model`` cannot train with its routes replayed, one sentence each; empty
    for a dense model and for a supported MoE model. Reads the model's modules and config."""
    config = getattr(model, "config", None)
    routers = moe_routers(model)
    experts = max((_positive(getattr(config, key, None)) for key in _EXPERT_COUNTS), default=0)
    unknown = sorted(
        {
            type(m).__name__
            for m in model.modules()
            if any(hint in type(m).__name__.lower() for hint in _MOE_MODULE_HINTS)
            and not _part_of_replayable(type(m).__name__)
        }
    )
    if not routers and not experts and not unknown:
        return []  # dense
    problems = []
    if not routers:
        problems.append(
            f"its MoE layers ({', '.join(unknown) or f'{experts} experts in config.json'}) use "
            f"a router Grove cannot replay; supported: {', '.join(sorted(REPLAYABLE_ROUTERS))}"
        )
    for key in _CAPACITY_KEYS:
        value = getattr(config, key, None)
        if value not in (None, 0, 0.0, False):
            problems.append(
                f"config.{key} is {value!r}: a capacity limit drops the tokens beyond it, so the "
                "learner cannot compute what the engine sampled; set it to null (dropless)"
            )
    for key in _DROPPING_KEYS:
        if getattr(config, key, None):
            problems.append(
                f"config.{key} is {getattr(config, key)!r}: token dropping; set it to false"
            )
    for key in _AUX_LOSS_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, (int, float)) and value > 0:
            problems.append(
                f"config.{key} is {value!r}: an auxiliary router loss; set it to 0 (Grove "
                "trains the policy-gradient loss alone)"
            )
    coefficient = getattr(config, "router_aux_loss_coef", None)
    if getattr(config, "output_router_logits", False) and coefficient:
        problems.append(
            f"config.output_router_logits is true with router_aux_loss_coef {coefficient!r}: "
            "the load-balancing auxiliary loss is on; set output_router_logits to false"
        )
    jitter = getattr(config, "router_jitter_noise", None)
    if isinstance(jitter, (int, float)) and jitter > 0:
        problems.append(
            f"config.router_jitter_noise is {jitter!r}: the router's input is randomized in "
            "training, so the learner's gate weights are not the engine's; set it to 0"
        )
    if engine_kind != "embedded":
        problems.append(
            f"engine.kind {engine_kind!r} does not capture routed experts in Grove yet, and "
            "without them the learner cannot replay the engine's routing; use engine.kind: "
            'embedded (docs/moe.md, "vLLM")'
        )
    return problems


def _positive(value: object) -> int:
    """An expert count from config (an int, or a per-layer list), 0 when absent."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, (list, tuple)):
        return max((_positive(v) for v in value), default=0)
    return 0


def _part_of_replayable(class_name: str) -> bool:
    """True for the modules of a replayable MoE block: its router, experts and block."""
    families = {name.removesuffix("TopKRouter") for name in REPLAYABLE_ROUTERS}
    return any(class_name.startswith(family) for family in families)
