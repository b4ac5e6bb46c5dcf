"""Training on forest rows equals training on every selected call independently.

For an order-sensitive causal model in float64 (embedding, GRU, linear head), the summed masked
negative log-likelihood over a forest's rows, and its gradient, must equal those of scoring each
selected call alone: its exact conditioning context (its ancestors' tokens and its own prompt)
followed by its generated tokens, with loss on the generated tokens. Tolerance 1e-10.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from grove.training.forest import CallRecord, Forest, build_forest

VOCAB = 40
TOLERANCE = 1e-10


class TinyRecurrentLM(nn.Module):
    """A causal language model whose every output depends on the order of all earlier tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 12)
        self.recurrent = nn.GRU(12, 16, batch_first=True)
        self.head = nn.Linear(16, VOCAB)

    def token_nll(self, tokens: list[int]) -> torch.Tensor:
        """``(T,)``: -log p(token t | tokens before t); 0 at t = 0, which nothing predicts."""
        ids = torch.tensor(tokens)[None]  # (1, T)
        hidden, _ = self.recurrent(self.embed(ids))  # (1, T, H)
        logprobs = torch.log_softmax(self.head(hidden[0, :-1]), dim=-1)  # (T - 1, V)
        nll = -logprobs.gather(1, ids[0, 1:, None])[:, 0]
        return torch.cat([torch.zeros(1, dtype=nll.dtype), nll])


def model() -> TinyRecurrentLM:
    torch.manual_seed(0)
    return TinyRecurrentLM().double()


def forest_loss(lm: TinyRecurrentLM, forest: Forest) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for row in forest.rows:
        mask = torch.tensor(row.loss_mask, dtype=torch.float64)
        total = total + (lm.token_nll(row.token_ids) * mask).sum()
    return total


def independent_loss(
    lm: TinyRecurrentLM, calls: list[CallRecord], selected: list[str]
) -> torch.Tensor:
    by_id = {call.call_id: call for call in calls}
    total = torch.zeros((), dtype=torch.float64)
    for call_id in selected:
        call = by_id[call_id]
        context: list[int] = []
        ancestor = call
        while ancestor.parent_id is not None:
            parent = by_id[ancestor.parent_id]
            context = parent.prompt_tokens + parent.generated_tokens + context
            ancestor = parent
        context = [*context, *call.prompt_tokens]
        nll = lm.token_nll(context + call.generated_tokens)
        total = total + nll[len(context) :].sum()
    return total


def loss_and_gradient(lm: TinyRecurrentLM, loss: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    gradients = torch.autograd.grad(loss, list(lm.parameters()))
    return loss.item(), [g.clone() for g in gradients]


def call(call_id: str, parent: str | None, prompt: list[int], generated: list[int]) -> CallRecord:
    return CallRecord(call_id, parent, prompt, generated, [-1.0] * len(generated))


def compaction_example() -> tuple[list[CallRecord], list[str]]:
    """The docs/forest.md walkthrough: rewrite before call 3, call 4 rejected, retry 5 accepted."""
    calls = [
        call("c1", None, [1, 2, 3], [10, 11]),
        call("c2", "c1", [4, 5], [12, 13]),
        call("c3", None, [1, 2, 30, 31], [14]),
        call("c4", "c3", [6], [15, 16]),
        call("c5", "c3", [6], [17, 18]),
    ]
    return calls, ["c1", "c2", "c3", "c5"]


def random_forest(seed: int) -> tuple[list[CallRecord], list[str]]:
    """Up to 12 calls with random parents (roots included) and a random closed selection."""
    rng = random.Random(seed)
    calls = []
    for index in range(rng.randint(2, 12)):
        parent = rng.choice([None, *[f"c{i}" for i in range(index)]]) if index else None
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1 if parent is None else 0, 4))]
        generated = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 4))]
        calls.append(call(f"c{index}", parent, prompt, generated))
    parent_of = {c.call_id: c.parent_id for c in calls}
    chosen: list[str] = []
    for c in rng.sample(calls, rng.randint(1, len(calls))):
        chain = [c.call_id]
        while parent_of[chain[-1]] is not None:
            chain.append(parent_of[chain[-1]])  # type: ignore[arg-type]
        chosen += [x for x in reversed(chain) if x not in chosen]
    rng.shuffle(chosen)
    return calls, chosen


CASES = {
    "compaction_example": compaction_example(),
    "shared_ancestor": (
        [call("a", None, [1, 2], [3]), call("b", "a", [4], [5, 6]), call("c", "a", [7], [8])],
        ["a", "b", "c"],
    ),
    **{f"random_{seed}": random_forest(seed) for seed in range(25)},
}


@pytest.mark.parametrize("name", list(CASES))
def test_forest_rows_loss_and_gradient_equal_independent_per_call_scoring(name: str) -> None:
    calls, selected = CASES[name]
    forest = build_forest(calls, selected)
    assert forest.trainable
    lm = model()

    forest_value, forest_gradient = loss_and_gradient(lm, forest_loss(lm, forest))
    reference_value, reference_gradient = loss_and_gradient(
        lm, independent_loss(lm, calls, selected)
    )

    assert forest_value == pytest.approx(reference_value, abs=TOLERANCE, rel=0)
    for got, expected in zip(forest_gradient, reference_gradient, strict=True):
        torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=0)


def test_training_every_path_without_ownership_overcounts_a_shared_ancestor() -> None:
    calls, selected = CASES["shared_ancestor"]
    forest = build_forest(calls, selected)
    lm = model()
    every_generation = sum(
        (lm.token_nll(row.token_ids)[segment.generated_start : segment.end]).sum()
        for row in forest.rows
        for segment in row.segments
    )

    assert every_generation.item() > independent_loss(lm, calls, selected).item() + 1e-3
