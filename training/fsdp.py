"""The sharded learner: FSDP2 (``torch.distributed.fsdp.fully_shard``) over the data-parallel
ranks (``docs/train.md``, "Sharded training with FSDP2").

``shard_model`` applies ``fully_shard`` to every decoder layer and then to the root, so each
rank holds ``1/N`` of every parameter (a ``DTensor`` sharded on dim 0), and AdamW, built over
those parameters, holds ``1/N`` of the optimizer state (``rank_state_bytes`` measures it). A
layer's parameters are gathered for its forward and backward and freed again; its gradients are
reduce-scattered back to the shards.

How it departs from FSDP's defaults: gradients are *summed* over the ranks, never averaged.
Every rank's loss is already divided by the whole step's retained token count
(``grove.training.row_sharding``), so the sum is the gradient one process takes over all rows.
FSDP2 divides by the world size unless told otherwise: every FSDP module gets gradient divide
factor 1 and sum-only collectives (gloo has no pre-multiplied sum; NCCL takes the same path).

Collectives require every rank to run the same number of forward and backward passes per step;
``check_equal_passes`` refuses a micro batch plan that does not (fixed micro batches of a batch
laid out with ``row_multiple = data-parallel size x micro batch`` always do).

State crosses the sharding in Grove's ordinary one-process form, so a checkpoint of a sharded run
is an ordinary schema-5 checkpoint and resumes in one process or on any number of ranks:

- ``full_model_state`` gathers the full weights onto rank 0's CPU (rank 0's engine samples from
  an unsharded copy, refreshed after every step);
- ``full_optimizer_state`` gathers AdamW's state onto rank 0 in ``Optimizer.state_dict()``'s
  form (integer parameter ids in parameter order), as one process would write it;
- ``load_full_state`` takes rank 0's full weights and ordinary optimizer state and shards them
  onto every rank;
- ``UnshardedCopy`` is rank 0's whole model beside the shards: the weights the embedded engine
  samples and a vLLM engine is published, refreshed after every step, and with it a plain
  optimizer of the same kind into which a checkpoint is gathered or restored.

Every function here is collective: each rank calls it in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from grove.training.errors import BatchError

__all__ = [
    "UnshardedCopy",
    "check_equal_passes",
    "decoder_layers",
    "full_model_state",
    "full_optimizer_state",
    "load_full_state",
    "rank_state_bytes",
    "shard_model",
]

_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
_SCATTER = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers: modules of the classes a Hugging Face model names in
    ``_no_split_modules``, else the entries of its largest ``ModuleList``. Raises
    ``BatchError`` when there are none (nothing to shard per layer)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if layers:
        return layers
    lists: list[torch.nn.Module] = [
        m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0
    ]
    if lists:
        return list(max(lists, key=_parameter_count).children())
    raise BatchError(
        "decoder_layers",
        f"policy.dtensor_cfg.enabled shards a model per decoder layer, but {type(model).__name__} "
        "names no _no_split_modules and holds no ModuleList of layers; use a Hugging Face causal "
        "LM, or train without policy.dtensor_cfg.enabled",
    )


def _parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` sharded in place over the default process group: ``fully_shard`` per decoder
    layer, then the root, with gradients summed over the ranks (divide factor 1). Returns it."""
    first = next(model.parameters(), None)
    if first is not None and first.device.type == "cuda":
        torch.cuda.set_device(first.device)  # FSDP2 communicates on the current CUDA device
    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def check_equal_passes(planned: Sequence[slice], shards: Sequence[range]) -> None:
    """Refuse a step whose micro batches give the ranks different numbers of forward/backward
    passes (each pass runs FSDP collectives that every rank must join); ``shards`` are every
    rank's rows, ``planned`` the step's micro batches (a rank runs those that start in its
    shard)."""
    passes = [sum(s.start <= (p.start or 0) < s.stop for p in planned) for s in shards]
    if len(set(passes)) > 1:
        raise BatchError(
            "equal_passes",
            f"a sharded step needs the same number of micro batches on every rank, got {passes} "
            "(rank order): the micro batch plan keeps rows together across shard bounds. Train "
            "with fixed micro batches (policy.tree_packing: false), or without "
            "policy.dtensor_cfg.enabled",
        )


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of a sharded ``model`` on rank 0's CPU, keyed as ``state_dict()`` keys
    them (copies, never the live tensors); ``{}`` on the other ranks."""
    return {
        name: _copy(value) for name, value in get_model_state_dict(model, options=_GATHER).items()
    }


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state of a sharded ``model`` on rank 0, in one process's
    ``optimizer.state_dict()`` form (parameter ids in parameter-group order); ``{}`` on the
    other ranks."""
    named = cast(dict[str, Any], get_optimizer_state_dict(model, optimizer, options=_GATHER))
    if not named:
        return {}
    ids: dict[str, int] = {}
    groups = []
    for group in named["param_groups"]:
        start = len(ids)
        ids.update((name, start + index) for index, name in enumerate(group["params"]))
        groups.append({**group, "params": list(range(start, len(ids)))})
    # Copies: on CPU the gathered scalars (AdamW's ``step``) are the live optimizer's tensors.
    state = {
        ids[name]: {key: _copy(value) for key, value in values.items()}
        for name, values in named["state"].items()
    }
    return {"state": state, "param_groups": groups}


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _named_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]
) -> dict[str, Any]:
    """``state`` (one process's ``state_dict()`` form) keyed by parameter names instead of ids."""
    names = {id(param): name for name, param in model.named_parameters()}
    ordered = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    return {
        "state": {ordered[int(index)]: value for index, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [ordered[int(index)] for index in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def load_full_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    model_state: Mapping[str, torch.Tensor],
    optimizer_state: Mapping[str, Any] | None,
) -> None:
    """Shard rank 0's full ``model_state`` and, unless None, its ``optimizer_state`` (one
    process's ``state_dict()`` form) onto every rank's sharded ``model`` and ``optimizer``; the
    other ranks' arguments are ignored (pass ``{}``), but every rank must pass None or not."""
    set_model_state_dict(model, dict(model_state), options=_SCATTER)
    if optimizer_state is None:
        return
    # Copies: loading on CPU may adopt the given scalars, which the next step then advances.
    copied = {
        "state": {
            index: {key: _copy(value) for key, value in values.items()}
            for index, values in optimizer_state.get("state", {}).items()
        },
        "param_groups": optimizer_state.get("param_groups", []),
    }
    named = _named_optimizer_state(model, optimizer, copied) if optimizer_state else {}
    set_optimizer_state_dict(model, optimizer, named, options=_SCATTER)


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def rank_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of parameters and optimizer state this rank holds (its shards for a sharded model;
    everything in one process); a tied parameter counts once."""
    params = sum(_local_bytes(p) for p in model.parameters())
    state = sum(
        _local_bytes(value)
        for per_param in optimizer.state.values()
        for value in per_param.values()
        if isinstance(value, torch.Tensor)
    )
    return params + state


@dataclass(frozen=True)
class UnshardedCopy:
    """Rank 0's whole model beside the shards (producer: ``build_trainer``; consumers: the
    trainer, which refreshes it after every step, and rank 0's checkpoints and resume).

    ``model`` is the unsharded module the engine samples (None on the other ranks, which only
    join the gathers); ``optimizer`` a plain optimizer of the trainer's kind over its parameters,
    empty except while a checkpoint is gathered into it or restored from it."""

    model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer | None

    def refresh(self, sharded: torch.nn.Module) -> None:
        """Load the sharded model's full weights into ``model`` (collective)."""
        state = full_model_state(sharded)
        if self.model is not None:
            self.model.load_state_dict(state)

    def gather_optimizer(self, sharded: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load the sharded ``optimizer``'s full state into ``self.optimizer`` (collective)."""
        state = full_optimizer_state(sharded, optimizer)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state)

    def scatter(
        self, sharded: torch.nn.Module, optimizer: torch.optim.Optimizer, *, restored: bool
    ) -> None:
        """Shard ``model``'s weights and, when ``restored`` (the same on every rank), the state
        restored into ``self.optimizer`` onto every rank (collective); ``self.optimizer`` is
        emptied again."""
        model_state = self.model.state_dict() if self.model is not None else {}
        held = self.optimizer.state_dict() if self.optimizer is not None else {}
        load_full_state(
            sharded,
            optimizer,
            model_state=model_state,
            optimizer_state=held if restored else None,
        )
        self.clear()

    def clear(self) -> None:
        """Drop what ``self.optimizer`` holds (its state only; the hyperparameters stay)."""
        if self.optimizer is not None:
            self.optimizer.state.clear()
