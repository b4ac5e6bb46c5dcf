"""Router replay: the learner sends every token to the experts the engine used for it.

A mixture-of-experts layer's router picks ``top_k`` experts per token by score. The choice is
discontinuous: where two experts' scores are nearly tied, the rounding of one forward pass
against another (the engine's token-by-token decode, the learner's whole-row forward, other
kernels, other batch shapes) picks a different expert, and the token's output changes by a
whole expert's contribution. The learner would then compute a different function from the one
the engine sampled from, and the importance ratio would measure that, not the policy change
(``docs/moe.md``, "The value of replay").

Replay, per MoE layer and token, with the row's captured routes (``StepBatch.routes``,
``(R, T, layers, top_k)``, ``grove.training.rows``):

1. the router computes its scores as usual (softmax of its logits, in float32);
2. a token with a captured route takes exactly those experts, in that order; a token whose
   route holds ``ROUTE_MISSING_SENTINEL`` (the row's final token, and padding) keeps the
   router's own choice;
3. the chosen experts' gate weights are the router's softmax scores at those experts,
   renormalized over the ``top_k`` when the router renormalizes (``norm_topk_prob``; Mixtral
   always), cast as the router casts them.

So the experts are the engine's, and the gate weights are the learner's own differentiable
scores: gradients flow into the router through the chosen experts' weights, as they do without
replay. Where the captured experts equal the router's own choice, step 3 computes exactly what
the router computes, bit for bit.

Replay works on transformers' top-k routers whose forward returns ``(logits, scores, indices)``
(``REPLAYABLE_ROUTERS``), through a forward hook that replaces their output for the duration of
one forward; ``moe_routers`` finds them, and ``grove.train.preflight`` refuses an MoE model whose
routers are not among them before any rollout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final, cast

import torch

from grove.training.errors import RouteReplayError
from grove.training.rows import ROUTE_MISSING_SENTINEL
from grove.training.trainer import (
    LogprobFunction,
    StepBatch,
    causal_token_logprobs,
    recompute_token_logprobs,
    row_logprobs,
)

__all__ = [
    "REPLAYABLE_ROUTERS",
    "logprob_function",
    "moe_routers",
    "recompute_logprobs",
    "replayed_row_logprobs",
    "replaying",
]

REPLAYABLE_ROUTERS: Final = frozenset(
    {"Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "MixtralTopKRouter", "OlmoeTopKRouter"}
)
"""Class names of the routers replay can override: transformers' top-k routers that return
``(logits, scores, indices)`` for the flattened tokens of a forward."""


def moe_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's replayable routers, one per MoE layer, in layer order (empty: dense)."""
    return [m for m in model.modules() if type(m).__name__ in REPLAYABLE_ROUTERS]


@contextmanager
def replaying(routers: Sequence[torch.nn.Module], routes: torch.Tensor) -> Iterator[None]:
    """Within the block, each forward of the model routes its ``(B, T)`` tokens as ``routes``
    (``(B, T, layers, top_k)``, sentinel: the router's own choice) says; see the module."""
    _check_routes(routers, routes)
    handles = [
        router.register_forward_hook(_replay_hook(router, routes[:, :, layer]))
        for layer, router in enumerate(routers)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def replayed_row_logprobs(model: torch.nn.Module, batch: StepBatch, rows: slice) -> torch.Tensor:
    """The ``LogprobFunction`` of an MoE model: ``grove.training.trainer.row_logprobs`` with the
    rows' captured routes replayed. Raises ``RouteReplayError`` when the batch carries no routes or
    routes that do not fit the model."""
    routers = moe_routers(model)
    if batch.routes is None:
        raise RouteReplayError(
            "routes_missing",
            f"the model has {len(routers)} MoE layers but the step's rows carry no captured "
            "routes; an MoE policy trains only on rows whose engine recorded its routed experts "
            "(engine.kind: embedded, docs/moe.md)",
        )
    with replaying(routers, batch.routes[rows]):
        return causal_token_logprobs(model, batch.token_ids[rows])


def logprob_function(model: torch.nn.Module) -> LogprobFunction:
    """The trainer's ``LogprobFunction`` for ``model``: ``replayed_row_logprobs`` for an MoE
    model (it has replayable routers), else ``row_logprobs``."""
    return replayed_row_logprobs if moe_routers(model) else row_logprobs


@torch.no_grad()
def recompute_logprobs(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    routes: torch.Tensor | None,
    *,
    micro_batch_size: int,
) -> torch.Tensor:
    """``grove.training.trainer.recompute_token_logprobs`` (``(R, T)``, eval mode, micro batches of
    rows), with ``routes`` replayed when ``model`` is an MoE model; the model's train/eval mode
    is restored afterwards. Raises ``RouteReplayError`` for an MoE model without routes."""
    routers = moe_routers(model)
    if not routers:
        return recompute_token_logprobs(model, token_ids, micro_batch_size=micro_batch_size)
    if routes is None:
        raise RouteReplayError(
            "routes_missing",
            f"the model has {len(routers)} MoE layers but the rows carry no captured routes "
            "(docs/moe.md)",
        )
    if micro_batch_size < 1:
        raise RouteReplayError(
            "micro_batch_size", f"micro batch size must be >= 1, got {micro_batch_size}"
        )
    was_training = model.training
    model.eval()
    try:
        parts = []
        for start in range(0, token_ids.shape[0], micro_batch_size):
            rows = slice(start, start + micro_batch_size)
            with replaying(routers, routes[rows]):
                parts.append(causal_token_logprobs(model, token_ids[rows]))
    finally:
        model.train(was_training)
    return torch.cat(parts)


def _count(router: torch.nn.Module, name: str) -> int:
    """The router's integer attribute ``name`` (``top_k``, ``num_experts``), which ``Module``'s
    types cannot name."""
    return int(getattr(router, name))


def _check_routes(routers: Sequence[torch.nn.Module], routes: torch.Tensor) -> None:
    if not routers:
        raise RouteReplayError("not_moe", "the model has no replayable router to override")
    top_ks = {_count(r, "top_k") for r in routers}
    expected = f"(rows, tokens, {len(routers)}, {top_ks.pop() if len(top_ks) == 1 else top_ks})"
    if (
        routes.ndim != 4
        or routes.shape[2] != len(routers)
        or any(routes.shape[3] != r.top_k for r in routers)
        or routes.dtype.is_floating_point
        or routes.dtype == torch.bool
    ):
        raise RouteReplayError(
            "routes_shape",
            f"routes must be integer {expected} for this model's MoE layers, got "
            f"{routes.dtype} {tuple(routes.shape)}",
        )
    for layer, router in enumerate(routers):
        chosen = routes[:, :, layer]  # (B, T, top_k)
        captured = chosen[(chosen != ROUTE_MISSING_SENTINEL).all(-1)]  # (N, top_k)
        if captured.numel() == 0:
            continue
        low, high = int(captured.min()), int(captured.max())
        if low < 0 or high >= _count(router, "num_experts"):
            raise RouteReplayError(
                "expert_out_of_range",
                f"MoE layer {layer} has experts [0, {router.num_experts}), but its captured "
                f"routes name experts from {low} to {high}",
            )
        ordered = captured.sort(-1).values
        if bool((ordered[:, 1:] == ordered[:, :-1]).any()):
            raise RouteReplayError(
                "expert_repeated",
                f"MoE layer {layer}: a captured route names one expert twice among its "
                f"{router.top_k}; a top-k route names distinct experts",
            )


Hook = Callable[[torch.nn.Module, object, object], object]


def _replay_hook(router: torch.nn.Module, layer_routes: torch.Tensor) -> Hook:
    """A forward hook that replaces the router's ``(logits, scores, indices)`` with the captured
    experts and their gate weights (the module's steps 2 and 3)."""
    top_k = _count(router, "top_k")
    flat = layer_routes.reshape(-1, top_k)  # (B*T, top_k), the router's token order
    own = (flat == ROUTE_MISSING_SENTINEL).any(-1, keepdim=True)  # (B*T, 1)
    renormalize = bool(getattr(router, "norm_topk_prob", True))

    def replay(_module: torch.nn.Module, _inputs: object, output: object) -> object:
        # the router's forward returns (logits, scores, indices), the module's step 1
        logits, scores, indices = cast("tuple[torch.Tensor, torch.Tensor, torch.Tensor]", output)
        if indices.shape != flat.shape:
            raise RouteReplayError(
                "routes_shape",
                f"the router saw {indices.shape[0]} tokens but the rows' routes hold "
                f"{flat.shape[0]}",
            )
        chosen = torch.where(own, indices, flat.to(device=indices.device, dtype=indices.dtype))
        probs = torch.nn.functional.softmax(logits, dim=-1, dtype=torch.float)  # (N, experts)
        weights = probs.gather(-1, chosen)  # (N, top_k)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(scores.dtype), chosen

    return replay
