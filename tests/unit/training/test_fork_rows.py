"""A fork's rows against an independent construction, on thousands of random forks.

A fork's calls hang off a source chain (calls of another attempt, ``src/s0`` .. ``src/sK``, a
line root first). The rows carry that chain as context: its tokens appear in every row that
descends from it, never with loss, and the fork's own selected generated tokens are trained
exactly once. Token ids encode their origin (as in ``test_forest_reference.py``): call ``i``'s
prompt token ``j`` is ``1000 * i + j``, its generated token ``j`` is ``1000 * i + 500 + j``;
source calls take indices from 100 up, so a token tells whether it belongs to the source.
Each fork is its own logical rollout: its own reward and advantage, broadcast to its rows.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grove.training.advantages import (
    AdvantageConfig,
    RolloutOutcome,
    broadcast_to_rows,
    compute_advantages,
)
from grove.training.forest import CallRecord, Forest, build_forest
from tests.fixtures.fork_reference import ForkCase, reference_row_tokens

SOURCE_BASE = 100  # source call k has token index SOURCE_BASE + k


def _record(
    index: int, call_id: str, parent: str | None, prompt: int, generated: int
) -> CallRecord:
    return CallRecord(
        call_id=call_id,
        parent_id=parent,
        prompt_tokens=[1000 * index + j for j in range(prompt)],
        generated_tokens=[1000 * index + 500 + j for j in range(generated)],
        logprobs=[-(1000 * index + j) / 7 for j in range(generated)],
    )


@st.composite
def fork_cases(draw: st.DrawFn) -> ForkCase:
    depth = draw(st.integers(1, 4))
    source = []
    for k in range(depth):
        parent = None if k == 0 else f"src/s{k - 1}"
        prompt = draw(st.integers(1 if k == 0 else 0, 3))
        source.append(
            _record(SOURCE_BASE + k, f"src/s{k}", parent, prompt, draw(st.integers(0, 3)))
        )
    own = []
    count = draw(st.integers(1, 6))
    for i in range(count):
        # a fork call continues the source's last call, an earlier fork call, or is a new root
        parent_index = draw(st.integers(-2, i - 1))
        parent = {-2: None, -1: source[-1].call_id}.get(parent_index, f"f{parent_index}")
        prompt = draw(st.integers(1 if parent is None else 0, 3))
        own.append(_record(i, f"f{i}", parent, prompt, draw(st.integers(0, 3))))
    # close the selection over the fork's own parents, in a drawn order
    order = draw(st.permutations([call.call_id for call in own]))
    chosen = [c for c in order if draw(st.booleans())] or [order[0]]
    parent_of = {call.call_id: call.parent_id for call in own}
    for call_id in list(chosen):
        parent = parent_of[call_id]
        while parent is not None and parent in parent_of and parent not in chosen:
            chosen.insert(chosen.index(call_id), parent)
            parent = parent_of[parent]
    return ForkCase(source, own, chosen)


def _continues_source(case: ForkCase) -> bool:
    by_id = {call.call_id: call for call in case.own}
    return any(by_id[c].parent_id == case.source[-1].call_id for c in case.selected)


def _context(case: ForkCase) -> list[str]:
    return [call.call_id for call in case.source] if _continues_source(case) else []


def _forest(case: ForkCase) -> Forest:
    context = _context(case)
    calls = [*case.source, *case.own] if context else case.own
    return build_forest(calls, [*context, *case.selected], context=context)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fork_cases())
def test_a_forks_rows_match_an_independent_construction(case: ForkCase) -> None:
    forest = _forest(case)
    assert forest.masked_reason is None
    by_id = {call.call_id: call for call in case.own}
    for row, endpoint in zip(forest.rows, forest.endpoints, strict=True):
        assert row.token_ids == reference_row_tokens(case, endpoint)
    trained = Counter(
        token
        for row in forest.rows
        for token, mask in zip(row.token_ids, row.loss_mask, strict=True)
        if mask
    )
    # the fork's own selected generations exactly once; no source token ever
    assert trained == Counter(t for c in case.selected for t in by_id[c].generated_tokens)
    for row in forest.rows:
        for token, mask, logprob in zip(row.token_ids, row.loss_mask, row.logprobs, strict=True):
            call_index, position = divmod(token, 1000)
            if call_index >= SOURCE_BASE:
                assert (mask, logprob) == (0, 0.0)
            else:
                assert logprob == (-(1000 * call_index + position - 500) / 7 if mask else 0.0)
        assert not set(row.owned_call_ids) & {call.call_id for call in case.source}


def test_a_fork_that_continues_nothing_of_the_source_has_no_source_tokens():
    source = [_record(SOURCE_BASE, "src/s0", None, 2, 2)]
    own = [_record(0, "f0", None, 2, 2)]
    forest = _forest(ForkCase(source, own, ["f0"]))
    (row,) = forest.rows
    assert row.token_ids == [0, 1, 500, 501]
    assert row.call_ids == ["f0"]


def test_two_forks_of_one_call_each_carry_the_source_and_own_only_their_tokens():
    source = [_record(SOURCE_BASE, "src/s0", None, 2, 1)]
    # worked out: source tokens 100000, 100001 (prompt), 100500 (generated)
    rows = []
    for index in (1, 2):
        own = [_record(index, f"f{index}", "src/s0", 1, 2)]
        (row,) = _forest(ForkCase(source, own, [f"f{index}"])).rows
        rows.append(row)
    assert rows[0].token_ids == [100000, 100001, 100500, 1000, 1500, 1501]
    assert rows[1].token_ids == [100000, 100001, 100500, 2000, 2500, 2501]
    assert [row.loss_mask for row in rows] == [[0, 0, 0, 0, 1, 1]] * 2


def test_each_fork_is_its_own_rollout_with_its_own_advantage():
    # Two forks of one call in one group (rewards 1 and 0) and the source in its own group:
    # mean 0.5, std (unbiased) sqrt(0.5), so the forks get +-0.5 / (sqrt(0.5) + 1e-6) and the
    # lone source 0.
    outcomes = [
        RolloutOutcome("fork-1", "g-fork", 1.0),
        RolloutOutcome("fork-2", "g-fork", 0.0),
        RolloutOutcome("src", "g-src", 1.0),
    ]
    advantages = compute_advantages(outcomes, AdvantageConfig()).advantages
    expected = 0.5 / (0.5**0.5 + 1e-6)
    assert advantages.tolist() == pytest.approx([expected, -expected, 0.0], rel=1e-6)
    # one row each, in rollout order: each row carries its own rollout's advantage
    rows = broadcast_to_rows(advantages, torch.tensor([0, 1, 2, -1]))
    assert rows.tolist() == pytest.approx([expected, -expected, 0.0, 0.0], rel=1e-6)
