"""The embedded mixture-of-experts model, and the experts its routers choose while it generates.

``build_moe_model`` is the MoE twin of ``grove.capture.embedded.build_model``: a Qwen2-MoE-style
causal LM sized for the embedded tokenizer, random weights from a fixed seed. Every decoder layer's
MLP is a sparse block: a top-k router picks ``top_k`` of ``num_experts`` experts per token
(Qwen2-MoE's shared expert runs for every token besides). It is what Grove can replay exactly
(``docs/moe.md``): per-token top-k routing that never drops a token (transformers runs every
routed token through its experts, with no capacity limit) and no auxiliary loss
(``router_aux_loss_coef`` 0 and ``output_router_logits`` off).

``RouteRecorder`` records the routed experts while the model runs: a forward hook on each
router keeps the expert indices it returned, so the routes are the very choices that shaped the
logits the engine sampled from, not a recomputation. A token's route is ``(layers, top_k)``:
its router's indices in each MoE layer, in layer order, in the router's own order (descending
score). ``RouteMemory`` keeps the routes of what the engine ran, so that a continuation's
prefill routes its parent's tokens as the parent's generation did (``docs/moe.md``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final, cast

import torch
from transformers import PreTrainedTokenizerFast, Qwen2MoeConfig, Qwen2MoeForCausalLM

from grove.capture.tiny_decoder import seeded, tiny_decoder_config

__all__ = [
    "EMBEDDED_MOE_MODEL_NAME",
    "ROUTER_CLASSES",
    "RouteMemory",
    "RouteRecorder",
    "build_moe_model",
    "router_modules",
]

EMBEDDED_MOE_MODEL_NAME: Final = "grove/embedded-tiny-moe"
ROUTER_CLASSES: Final = frozenset(
    {"Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "MixtralTopKRouter", "OlmoeTopKRouter"}
)
"""transformers' top-k routers whose forward returns ``(logits, scores, indices)`` for the
flattened tokens: the ones whose choices are recorded (and, in training, replayed)."""


def build_moe_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_experts: int = 4,
    top_k: int = 2,
    context_length: int = 2048,
    near_tie: float | None = None,
) -> Qwen2MoeForCausalLM:
    """A Qwen2-MoE-style causal LM sized for ``tokenizer``, with random weights from ``seed``.

    Every layer is sparse (``num_experts`` experts, ``top_k`` per token). ``near_tie`` makes
    expert 1's router weights expert 0's times ``1 + near_tie`` in every layer, so the two
    experts' scores differ by that relative amount for every token: with a value near float32
    rounding, which of the two a token takes depends on how the forward was computed, as it does
    at near-ties in any MoE (``docs/moe.md``, "The value of replay"). None leaves the routers
    as drawn. The global torch random state is left as it was.
    """
    shape = tiny_decoder_config(
        tokenizer, hidden_size=hidden_size, num_layers=num_layers, context_length=context_length
    )
    config = Qwen2MoeConfig(
        **shape,
        moe_intermediate_size=hidden_size,
        shared_expert_intermediate_size=hidden_size,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        output_router_logits=False,
        router_aux_loss_coef=0.0,
        use_sliding_window=False,
    )
    model = seeded(seed, lambda: Qwen2MoeForCausalLM(config))
    if near_tie is not None:
        with torch.no_grad():
            for router in router_modules(model):
                weight = cast(torch.Tensor, router.weight)  # the router's gate, a Parameter
                weight[1] = weight[0] * (1.0 + near_tie)
    return model


def router_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's top-k routers (``ROUTER_CLASSES``) in layer order; empty for a dense model."""
    return [m for m in model.modules() if type(m).__name__ in ROUTER_CLASSES]


class RouteRecorder:
    """Records the expert indices every router returns while :meth:`recording` is active.

    Each forward of the model appends, per router, its ``(tokens, top_k)`` indices; tokens are
    the forward's input positions in order (batch of one). :meth:`routes` stacks them as int16
    ``(tokens so far, layers, top_k)``.

    ``forced`` (``(n, layers, top_k)``) routes the first ``n`` positions of the first forward
    (the prefill) to those experts instead of the router's choice, with the router's own
    softmax scores at them as gate weights (renormalized when the router renormalizes): the
    computation ``grove.training.route_replay`` replays, bit for bit the router's own where the
    experts agree. The recorded routes are the forced ones there.
    """

    def __init__(self, routers: list[torch.nn.Module], forced: torch.Tensor | None = None) -> None:
        self.routers = routers
        self.forced = forced
        self._chosen: list[list[torch.Tensor]] = [[] for _ in routers]

    @contextmanager
    def recording(self) -> Iterator[RouteRecorder]:
        """Hooks on every router for the block; removed afterwards, even on error."""
        handles = [
            router.register_forward_hook(self._hook(layer, router))
            for layer, router in enumerate(self.routers)
        ]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _hook(  # a torch forward hook
        self, layer: int, router: torch.nn.Module
    ) -> Callable[[torch.nn.Module, object, object], object]:
        renormalize = bool(getattr(router, "norm_topk_prob", True))

        def keep(_module: torch.nn.Module, _inputs: object, output: object) -> object:
            # the router's forward returns (logits, scores, indices); indices: (tokens, top_k)
            logits, scores, indices = cast(
                "tuple[torch.Tensor, torch.Tensor, torch.Tensor]", output
            )
            if self.forced is not None and not self._chosen[layer]:  # the prefill
                n = min(self.forced.shape[0], indices.shape[0])
                indices = indices.clone()
                indices[:n] = self.forced[:n, layer].to(indices.dtype)
                probs = torch.nn.functional.softmax(logits, dim=-1, dtype=torch.float)
                weights = probs.gather(-1, indices)  # (tokens, top_k)
                if renormalize:
                    weights = weights / weights.sum(dim=-1, keepdim=True)
                scores = torch.where(
                    torch.arange(indices.shape[0])[:, None] < n, weights.to(scores.dtype), scores
                )
            self._chosen[layer].append(indices.detach().to(torch.int16))
            return logits, scores, indices

        return keep

    def routes(self) -> torch.Tensor:
        """int16 ``(tokens, layers, top_k)``: every recorded token's experts, layer by layer."""
        return torch.stack([torch.cat(chosen) for chosen in self._chosen], dim=1)


class RouteMemory:
    """The routes of the sequences an engine ran (prompt and generation, every token routed),
    so that a later prompt that extends one is routed as it was (``docs/moe.md``, "Capture").

    A continuation's prompt is its parent's exact tokens plus new ones; prefilling it again
    would route the parent's tokens anew, and where experts are nearly tied, rounding would
    pick others than the parent's generation used. The row trains both calls with one route per
    token, so the engine forces the parent's: as a prefix cache would, which reuses the
    computation instead of redoing it. Holds the ``capacity`` latest sequences.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._sequences: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()

    def remember(self, tokens: Sequence[int], routes: torch.Tensor) -> None:
        """Keep ``routes`` (``(len(tokens), layers, top_k)``) for ``tokens``."""
        key = tuple(tokens)
        self._sequences[key] = routes
        self._sequences.move_to_end(key)
        while len(self._sequences) > self.capacity:
            self._sequences.popitem(last=False)

    def prefix_routes(self, prompt: Sequence[int]) -> torch.Tensor | None:
        """The routes of the longest remembered sequence that ``prompt`` starts with, or None."""
        prompt = tuple(prompt)
        best: tuple[int, ...] | None = None
        for sequence in self._sequences:
            longer = best is None or len(sequence) > len(best)
            if longer and len(sequence) <= len(prompt) and prompt[: len(sequence)] == sequence:
                best = sequence
        if best is None:
            return None
        self._sequences.move_to_end(best)
        return self._sequences[best]
