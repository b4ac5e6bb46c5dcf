"""build_forest against a brute-force reference on thousands of random forests.

The reference enumerates every root-to-leaf path of the selected graph by naive recursion, orders
the paths by their leaf's selection position, hands each generated span to the first path that
contains it, and decides masking by reading the rules one by one. Token ids are unique per call
and position (call ``i``'s prompt token ``j`` is ``1000 * i + j``, its generated token ``j`` is
``1000 * i + 500 + j``), so every token in a row can be traced to its origin.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grove.training.forest import CallRecord, Forest, MaskReason, build_forest


@dataclass(frozen=True)
class Case:
    calls: list[CallRecord]
    selected: list[str]
    terminal: str | None


@st.composite
def cases(draw: st.DrawFn) -> Case:
    count = draw(st.integers(1, 10))
    calls = []
    for index in range(count):
        parent = draw(st.integers(-1, index - 1)) if index else -1
        status = draw(st.sampled_from(["committed"] * 12 + ["failed", "pending"]))
        prompt = draw(st.integers(1 if parent < 0 else 0, 3))
        generated = draw(st.integers(0, 3))
        calls.append(
            CallRecord(
                call_id=f"c{index}",
                parent_id=None if parent < 0 else f"c{parent}",
                prompt_tokens=[1000 * index + j for j in range(prompt)],
                generated_tokens=[1000 * index + 500 + j for j in range(generated)],
                logprobs=[-(1000 * index + j) / 7 for j in range(generated)],
                status=status,
                finish_reason=draw(st.sampled_from(["stop", "stop", "tool_calls", "length"])),
            )
        )
    order = draw(st.permutations([call.call_id for call in calls]))
    chosen = [call_id for call_id in order if draw(st.booleans())]
    if draw(st.booleans()):  # close the selection over parents most of the time
        parent_of = {call.call_id: call.parent_id for call in calls}
        for call_id in list(chosen):
            parent = parent_of[call_id]
            while parent is not None and parent not in chosen:
                chosen.insert(draw(st.integers(0, len(chosen))), parent)
                parent = parent_of[parent]
    if draw(st.integers(0, 20)) == 0:
        chosen.insert(draw(st.integers(0, len(chosen))), "ghost")
    terminal = draw(st.one_of(st.none(), st.sampled_from([*order, "ghost"])))
    return Case(calls, chosen, terminal)


def reference_mask(case: Case) -> MaskReason | None:
    by_id = {call.call_id: call for call in case.calls}
    if not case.selected:
        return MaskReason.EMPTY_SELECTION
    if any(call_id not in by_id for call_id in case.selected):
        return MaskReason.SELECTED_CALL_MISSING
    statuses = [by_id[call_id].status for call_id in case.selected]
    if "pending" in statuses:
        return MaskReason.SELECTED_CALL_PENDING
    if "failed" in statuses:
        return MaskReason.SELECTED_CALL_FAILED
    for call_id in case.selected:
        parent = by_id[call_id].parent_id
        if parent is not None and parent not in case.selected:
            return MaskReason.SELECTION_NOT_CLOSED
    if case.terminal is not None and case.terminal not in case.selected:
        return MaskReason.TERMINAL_NOT_SELECTED
    return None


def reference_paths(case: Case) -> list[list[str]]:
    """Every root-to-leaf path of the selected graph, by recursion, in leaf selection order."""
    by_id = {call.call_id: call for call in case.calls}
    selected = set(case.selected)

    def walk(call_id: str, prefix: list[str]) -> list[list[str]]:
        path = [*prefix, call_id]
        children = [c for c in case.selected if by_id[c].parent_id == call_id]
        if not children:
            return [path]
        return [p for child in children for p in walk(child, path)]

    roots = [
        c for c in case.selected if by_id[c].parent_id is None or by_id[c].parent_id not in selected
    ]
    paths = [p for root in roots for p in walk(root, [])]
    return sorted(paths, key=lambda p: case.selected.index(p[-1]))


def context_of(call_id: str, by_id: dict[str, CallRecord]) -> list[int]:
    """The exact tokens a call was conditioned on: its ancestors' deltas, then its own prompt."""
    call = by_id[call_id]
    before = (
        []
        if call.parent_id is None
        else context_of(call.parent_id, by_id) + by_id[call.parent_id].generated_tokens
    )
    return before + call.prompt_tokens


def check_against_reference(case: Case, forest: Forest) -> None:
    by_id = {call.call_id: call for call in case.calls}
    assert forest.masked_reason == reference_mask(case)
    if forest.masked_reason is not None:
        assert forest.rows == [] and forest.endpoints == []
        return
    paths = reference_paths(case)
    assert [row.call_ids for row in forest.rows] == paths
    assert len(forest.rows) == len(forest.endpoints) == len(paths)
    assert forest.endpoints == [path[-1] for path in paths]
    owned: set[str] = set()
    for row, path in zip(forest.rows, paths, strict=True):
        assert row.owned_call_ids == [c for c in path if c not in owned]
        owned.update(path)
        assert row.token_ids == context_of(path[-1], by_id) + by_id[path[-1]].generated_tokens
        for segment in row.segments:
            call = by_id[segment.call_id]
            assert row.token_ids[: segment.generated_start] == context_of(call.call_id, by_id)
            assert row.token_ids[segment.generated_start : segment.end] == call.generated_tokens
    trained = Counter(
        token
        for row in forest.rows
        for token, mask in zip(row.token_ids, row.loss_mask, strict=True)
        if mask
    )
    expected = Counter(
        token for call_id in case.selected for token in by_id[call_id].generated_tokens
    )
    assert trained == expected  # every selected generated token exactly once, nothing else
    for row in forest.rows:
        for token, mask, logprob in zip(row.token_ids, row.loss_mask, row.logprobs, strict=True):
            call_index, position = divmod(token, 1000)
            assert logprob == (-(1000 * call_index + position - 500) / 7 if mask else 0.0)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_build_forest_matches_brute_force_reference(case: Case) -> None:
    forest = build_forest(case.calls, case.selected, case.terminal)

    check_against_reference(case, forest)
    shuffled = list(case.calls)
    random.Random(len(shuffled)).shuffle(shuffled)
    assert build_forest(shuffled, case.selected, case.terminal) == forest
