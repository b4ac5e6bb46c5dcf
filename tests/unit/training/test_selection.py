"""Selection policies, their evidence rules, policy resolution and the completion check."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Any

import pytest

from grove.training.errors import SelectionError, SelectionPolicyError
from grove.training.forest import MaskReason
from grove.training.selection import (
    REJECTED_BY_HARNESS,
    REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES,
    CapturedCall,
    SelectionRule,
    all_captured,
    completion_mask_reason,
    fingerprint_output,
    is_generated_item,
    resolve_selection_policy,
    returned_history,
    select_rollout,
)


def say(text: str, **extra: Any) -> dict[str, Any]:
    """An assistant message output item."""
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
        **extra,
    }


def tool(name: str, arguments: str, **extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "name": name, "arguments": arguments, **extra}


def observe(text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": "x", "output": text}


def committed(
    call_id: str,
    parent: str | None,
    items: list[dict[str, Any]],
    *,
    finish_reason: str = "stop",
    failure_reason: str | None = None,
) -> CapturedCall:
    return CapturedCall(
        call_id=call_id,
        parent_id=parent,
        status="committed",
        response_id=f"resp-{call_id}",
        output_fingerprint=fingerprint_output(items),
        finish_reason=finish_reason,
        failure_reason=failure_reason,
    )


def rejected(call_id: str, parent: str | None, items: list[dict[str, Any]]) -> CapturedCall:
    """A committed, complete response that the harness rejected before resampling."""
    return committed(call_id, parent, items, failure_reason=REJECTED_BY_HARNESS)


def failed(call_id: str, parent: str | None, reason: str = "engine_error") -> CapturedCall:
    return CapturedCall(call_id=call_id, parent_id=parent, status="failed", failure_reason=reason)


def pending(call_id: str, parent: str | None) -> CapturedCall:
    return CapturedCall(call_id=call_id, parent_id=parent, status="pending")


OUTPUTS = {
    "c1": [say("look"), tool("search", '{"q": "a"}')],
    "c2": [say("found a")],
    "c3": [say("summary done")],
    "c4": [say("bad answer")],
    "c5": [say("good answer")],
}


def compaction_capture() -> list[CapturedCall]:
    """docs/forest.md's walkthrough: rewrite before c3, c4 rejected, retry c5 accepted."""
    return [
        committed("c1", None, OUTPUTS["c1"]),
        committed("c2", "c1", OUTPUTS["c2"]),
        committed("c3", None, OUTPUTS["c3"]),
        committed("c4", "c3", OUTPUTS["c4"]),
        committed("c5", "c3", OUTPUTS["c5"]),
    ]


def rejected_capture() -> list[CapturedCall]:
    """The same walkthrough with c4's rejection recorded, as the gateway records it."""
    records = compaction_capture()
    records[3] = rejected("c4", "c3", OUTPUTS["c4"])
    return records


def returned(*call_ids: str) -> list[dict[str, Any]]:
    """A returned history: each generation followed by an observation."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for call_id in call_ids:
        items += OUTPUTS[call_id] + [observe(f"after {call_id}")]
    return items


def names(records: list[CapturedCall]) -> list[str]:
    return [record.call_id for record in records]


# --- returned_history ----------------------------------------------------------------------------


def test_returned_history_matches_whole_generations_by_content_in_returned_order() -> None:
    selected, terminal = returned_history(
        compaction_capture(), {"output": returned("c1", "c2", "c3", "c5")}
    )

    assert names(selected) == ["c1", "c2", "c3", "c5"]
    assert terminal == "resp-c5"


def test_returned_history_keeps_returned_order_not_capture_order() -> None:
    selected, _ = returned_history(
        compaction_capture(), {"output": returned("c3", "c5", "c1", "c2")}
    )

    assert names(selected) == ["c3", "c5", "c1", "c2"]


def test_returned_history_uses_explicit_terminal_response_id() -> None:
    result = {"output": returned("c1", "c2", "c3", "c5"), "terminal_response_id": "resp-c2"}

    assert returned_history(compaction_capture(), result)[1] == "resp-c2"


def test_terminal_response_id_outside_returned_history_raises_contradictory() -> None:
    result = {"output": returned("c1", "c2"), "terminal_response_id": "resp-c4"}

    with pytest.raises(SelectionError, match=r"contradictory_evidence.*'resp-c4'"):
        returned_history(compaction_capture(), result)


def test_response_identity_disambiguates_identical_generations() -> None:
    records = [committed("a", None, [say("ok")]), committed("b", "a", [say("ok")])]
    output = [say("ok", response_id="resp-a"), observe("o"), say("ok", response_id="resp-b")]

    assert names(returned_history(records, {"output": output})[0]) == ["a", "b"]


def test_identical_generations_without_identity_raise_ambiguous() -> None:
    records = [committed("a", None, [say("ok")]), committed("b", None, [say("ok")])]

    with pytest.raises(SelectionError, match=r"ambiguous_evidence.*\['a', 'b'\]") as raised:
        returned_history(records, {"output": [say("ok")]})

    assert raised.value.item_index == 0


def test_a_forks_source_answer_comes_before_its_own_identical_answer() -> None:
    # the fork's source call (named "src/c1") and its own call answered the same text; the
    # source was answered first, so the history's first "ok" is the source's (the fork names its
    # own response, as a harness names every response it got)
    records = [committed("src/c1", None, [say("ok")]), committed("f1", "src/c1", [say("ok")])]
    output = [say("ok"), observe("o"), say("ok", response_id="resp-f1")]

    assert names(returned_history(records, {"output": output})[0]) == ["src/c1", "f1"]


def test_a_forks_own_answer_alone_is_still_ambiguous_with_its_sources() -> None:
    records = [committed("src/c1", None, [say("ok")]), committed("f1", "src/c1", [say("ok")])]

    with pytest.raises(SelectionError, match=r"ambiguous_evidence.*\['f1', 'src/c1'\]"):
        returned_history(records, {"output": [say("ok")]})


def test_two_ways_to_split_the_returned_items_raise_ambiguous() -> None:
    records = [
        committed("a", None, [say("x")]),
        committed("b", "a", [say("y")]),
        committed("c", None, [say("x"), say("y")]),
    ]

    with pytest.raises(SelectionError, match=r"ambiguous_evidence"):
        returned_history(records, {"output": [say("x"), say("y")]})


def test_generation_with_a_missing_item_raises_missing_evidence() -> None:
    output = returned("c1", "c2")
    output.remove(OUTPUTS["c1"][1])  # the tool call of c1 is dropped from the history

    with pytest.raises(SelectionError, match=r"missing_evidence.*generated item 0") as raised:
        returned_history(compaction_capture(), {"output": output})

    assert raised.value.rule == SelectionRule.MISSING_EVIDENCE


def test_unmatched_generation_after_matched_ones_names_its_position() -> None:
    output = [*returned("c1", "c2"), say("never captured")]

    with pytest.raises(SelectionError, match=r"generated item 3 starts no whole generation"):
        returned_history(compaction_capture(), {"output": output})


def test_item_naming_a_response_with_other_content_raises_contradictory() -> None:
    output = [say("found a", response_id="resp-c5")]

    with pytest.raises(SelectionError, match=r"contradictory_evidence.*'resp-c5'") as raised:
        returned_history(compaction_capture(), {"output": output})

    assert raised.value.call_id == "c5"


def test_item_naming_an_unknown_response_raises_missing_evidence() -> None:
    with pytest.raises(SelectionError, match=r"missing_evidence.*'resp-zzz'"):
        returned_history(compaction_capture(), {"output": [say("found a", response_id="resp-zzz")]})


def test_generation_returned_twice_raises_duplicated() -> None:
    with pytest.raises(SelectionError, match=r"duplicated_evidence.*'c2'"):
        returned_history(compaction_capture(), {"output": returned("c1", "c2", "c2")})


def test_failed_and_pending_calls_are_never_matched() -> None:
    records = [failed("a", None), pending("b", None), committed("c", None, [say("hi")])]

    with pytest.raises(SelectionError, match=r"missing_evidence"):
        returned_history(records, {"output": [say("bye")]})
    assert names(returned_history(records, {"output": [say("hi")]})[0]) == ["c"]


def test_returned_history_never_matches_a_rejected_response_by_content() -> None:
    # the retry c5 generated the same text as the rejected c4: only c5 can be the returned one
    records = [
        committed("c3", None, OUTPUTS["c3"]),
        rejected("c4", "c3", OUTPUTS["c5"]),
        committed("c5", "c3", OUTPUTS["c5"]),
    ]

    selected, terminal = returned_history(records, {"output": [*OUTPUTS["c3"], *OUTPUTS["c5"]]})

    assert (names(selected), terminal) == (["c3", "c5"], "resp-c5")


@pytest.mark.parametrize(
    "result",
    [
        {"output": [say("bad answer", response_id="resp-c4")]},
        {"responses": [{"id": "resp-c4", "output": OUTPUTS["c4"]}]},
        {"model_calls": ["c4"]},
        {"model_calls": [{"response_id": "resp-c4"}]},
    ],
)
def test_returned_history_naming_a_rejected_response_raises_contradictory(
    result: dict[str, Any],
) -> None:
    with pytest.raises(SelectionError, match=r"contradictory_evidence.*'c4'.*rejected") as raised:
        returned_history(rejected_capture(), result)

    assert raised.value.call_id == "c4"


def test_responses_shape_matches_by_native_response_id() -> None:
    responses = [
        {"id": "resp-c1", "output": OUTPUTS["c1"]},
        {"id": "resp-c2", "output": OUTPUTS["c2"]},
    ]

    selected, terminal = returned_history(compaction_capture(), {"responses": responses})

    assert names(selected) == ["c1", "c2"]
    assert terminal == "resp-c2"


def test_responses_shape_falls_back_to_content_for_non_native_ids() -> None:
    responses = [{"id": "exporter-7", "output": OUTPUTS["c5"]}]

    assert names(returned_history(compaction_capture(), {"responses": responses})[0]) == ["c5"]


def test_response_with_native_id_and_other_content_raises_contradictory() -> None:
    responses = [{"id": "resp-c1", "output": OUTPUTS["c2"]}]

    with pytest.raises(SelectionError, match=r"contradictory_evidence.*'resp-c1'"):
        returned_history(compaction_capture(), {"responses": responses})


def test_model_call_references_select_calls_directly() -> None:
    result = {"model_calls": ["c1", {"call_id": "c2"}, {"response_id": "resp-c5"}]}

    assert names(returned_history(compaction_capture(), result)[0]) == ["c1", "c2", "c5"]


def test_trajectory_turn_references_are_flattened_in_order() -> None:
    result = {"trajectory": {"turns": [{"model_calls": ["c3"]}, {"model_calls": ["c5"]}]}}

    assert names(returned_history(compaction_capture(), result)[0]) == ["c3", "c5"]


def test_reference_to_an_unknown_call_raises_missing_evidence() -> None:
    with pytest.raises(SelectionError, match=r"missing_evidence.*reference 1"):
        returned_history(compaction_capture(), {"model_calls": ["c1", "c9"]})


def test_reference_whose_call_and_response_disagree_raises_contradictory() -> None:
    with pytest.raises(SelectionError, match=r"contradictory_evidence.*'c1'.*'resp-c2'"):
        returned_history(
            compaction_capture(), {"model_calls": [{"call_id": "c1", "response_id": "resp-c2"}]}
        )


def test_output_and_references_that_disagree_raise_contradictory() -> None:
    result = {"output": returned("c1", "c2"), "model_calls": ["c1"]}

    with pytest.raises(SelectionError, match=r"contradictory_evidence.*'output'.*'model_calls'"):
        returned_history(compaction_capture(), result)


def test_output_and_references_that_agree_select_once() -> None:
    result = {"output": returned("c1", "c2"), "model_calls": ["c1", "c2"]}

    assert names(returned_history(compaction_capture(), result)[0]) == ["c1", "c2"]


def test_model_calls_and_trajectory_that_disagree_raise_contradictory() -> None:
    result = {"model_calls": ["c1"], "trajectory": {"turns": [{"model_calls": ["c2"]}]}}

    with pytest.raises(SelectionError, match=r"contradictory_evidence"):
        returned_history(compaction_capture(), result)


def test_returned_history_without_any_generation_raises_missing_evidence() -> None:
    result = {"output": [{"role": "user", "content": "task"}]}

    with pytest.raises(SelectionError, match=r"missing_evidence.*no generated item"):
        returned_history(compaction_capture(), result)


def test_result_without_evidence_raises_missing_evidence() -> None:
    with pytest.raises(SelectionError, match=r"missing_evidence.*no 'output'"):
        returned_history(compaction_capture(), {"reward": 1.0})


@pytest.mark.parametrize(
    "result",
    [
        {"output": "text"},
        {"output": [1, 2]},
        {"responses": {"id": "r"}},
        {"model_calls": "c1"},
        {"model_calls": [7]},
        {"trajectory": {"turns": "t"}},
        {"output": [], "terminal_response_id": 5},
    ],
)
def test_malformed_result_shapes_raise_invalid_result(result: dict[str, Any]) -> None:
    with pytest.raises(SelectionError, match=r"invalid_result"):
        returned_history(compaction_capture(), result)


# --- fingerprints --------------------------------------------------------------------------------


def test_fingerprint_ignores_ids_statuses_and_empty_values() -> None:
    captured = [say("hi"), tool("f", '{"a": 1}', call_id="call_1")]
    echoed = [
        say("hi", id="msg_1", status="completed", annotations=[], refusal=None),
        tool("f", '{ "a" : 1 }', id="fc_1", call_id="call_9", status="completed"),
    ]

    assert fingerprint_output(echoed) == fingerprint_output(captured)


def test_fingerprint_treats_null_and_empty_tool_content_alike() -> None:
    calls = [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    with_null = {"role": "assistant", "content": None, "tool_calls": calls}
    with_empty = {"role": "assistant", "content": "", "tool_calls": calls}

    assert fingerprint_output([with_null]) == fingerprint_output([with_empty])


def test_fingerprint_depends_on_content_and_order() -> None:
    assert fingerprint_output([say("a")]) != fingerprint_output([say("b")])
    assert fingerprint_output([say("a"), say("b")]) != fingerprint_output([say("b"), say("a")])
    assert fingerprint_output([say("ab")]) != fingerprint_output([say("a"), say("b")])


@pytest.mark.parametrize(
    ("item", "generated"),
    [
        (say("x"), True),
        ({"type": "reasoning", "summary": [{"text": "t"}]}, True),
        (tool("f", "{}"), True),
        ({"role": "user", "content": "q"}, False),
        ({"role": "tool", "content": "r"}, False),
        (observe("r"), False),
    ],
)
def test_generated_items_are_assistant_reasoning_and_tool_calls(
    item: dict[str, Any], generated: bool
) -> None:
    assert is_generated_item(item) is generated


# --- all_captured --------------------------------------------------------------------------------


def test_all_captured_selects_abandoned_retries_and_branches_in_capture_order() -> None:
    result = {"output": returned("c1", "c2", "c3", "c5")}

    selected, terminal = all_captured(compaction_capture(), result)

    assert names(selected) == ["c1", "c2", "c3", "c4", "c5"]
    assert terminal == "resp-c5"


def test_all_captured_keeps_rejected_resamples_as_abandoned_retries() -> None:
    selection = select_rollout(
        "all_captured",
        rejected_capture(),
        {"output": returned("c1", "c2", "c3", "c5"), "reward": 1},
    )

    assert selection.call_ids == ("c1", "c2", "c3", "c4", "c5")
    assert selection.terminal_call_id == "c5"
    assert selection.mask_reason is None  # a rejection is not a failure


def test_all_captured_never_scores_a_rejected_response() -> None:
    with pytest.raises(SelectionError, match=r"contradictory_evidence.*'c4'.*rejected"):
        all_captured(rejected_capture(), {"terminal_response_id": "resp-c4"})


def test_all_captured_excludes_unscored_failed_pending_and_filtered_leaves() -> None:
    records = [
        committed("a", None, [say("a")]),
        failed("b", "a"),
        pending("c", "a"),
        committed("d", "a", [say("d")], finish_reason="content_filter"),
        committed("e", "a", [say("e")], finish_reason="length"),
        committed("f", "a", [say("f")]),
    ]

    selected, _ = all_captured(records, {"terminal_response_id": "resp-f"})

    assert names(selected) == ["a", "e", "f"]


def test_all_captured_keeps_an_incomplete_call_that_has_children_or_is_scored() -> None:
    records = [
        committed("a", None, [say("a")], finish_reason="content_filter"),
        committed("b", "a", [say("b")], finish_reason="content_filter"),
    ]

    selected, terminal = all_captured(records, {"terminal_response_id": "resp-b"})

    assert names(selected) == ["a", "b"]
    assert terminal == "resp-b"


def test_all_captured_scored_content_filter_call_masks_the_rollout() -> None:
    records = [
        committed("a", None, [say("a")]),
        committed("b", "a", [say("b")], finish_reason="content_filter"),
    ]

    selection = select_rollout(
        "all_captured", records, {"terminal_response_id": "resp-b", "reward": 1}
    )

    assert selection.call_ids == ("a", "b")
    assert selection.mask_reason == MaskReason.SELECTED_CALL_INCOMPLETE


def test_all_captured_content_filter_call_with_children_masks_the_rollout() -> None:
    records = [
        committed("a", None, [say("a")], finish_reason="content_filter"),
        committed("b", "a", [say("b")]),
    ]

    selection = select_rollout(
        "all_captured", records, {"terminal_response_id": "resp-b", "reward": 1}
    )

    assert selection.call_ids == ("a", "b")
    assert selection.mask_reason == MaskReason.SELECTED_CALL_INCOMPLETE


def test_all_captured_unscored_content_filter_leaf_is_excluded_and_masks_nothing() -> None:
    records = [
        committed("a", None, [say("a")]),
        committed("b", "a", [say("b")], finish_reason="content_filter"),
        committed("c", "a", [say("c")]),
    ]

    selection = select_rollout(
        "all_captured", records, {"terminal_response_id": "resp-c", "reward": 1}
    )

    assert selection.call_ids == ("a", "c")
    assert selection.mask_reason is None


def test_all_captured_finds_terminal_by_content_of_the_last_returned_generation() -> None:
    output = [*OUTPUTS["c3"], observe("o"), *OUTPUTS["c5"]]

    assert all_captured(compaction_capture(), {"output": output})[1] == "resp-c5"


def test_all_captured_finds_terminal_by_the_last_item_response_id() -> None:
    output = [say("good answer", response_id="resp-c5")]

    assert all_captured(compaction_capture(), {"output": output})[1] == "resp-c5"


def test_all_captured_finds_terminal_from_responses_and_references() -> None:
    records = compaction_capture()

    assert (
        all_captured(records, {"responses": [{"id": "resp-c2", "output": OUTPUTS["c2"]}]})[1]
        == "resp-c2"
    )
    assert all_captured(records, {"model_calls": ["c1", "c4"]})[1] == "resp-c4"


def test_all_captured_without_terminal_witness_raises_missing_terminal() -> None:
    with pytest.raises(
        SelectionError, match=r"missing_terminal.*capture order is not a terminal witness"
    ):
        all_captured(compaction_capture(), {"reward": 1.0})


def test_all_captured_with_unknown_terminal_raises_missing_evidence() -> None:
    with pytest.raises(SelectionError, match=r"missing_evidence.*'resp-nope'"):
        all_captured(compaction_capture(), {"terminal_response_id": "resp-nope"})


def test_all_captured_with_ambiguous_final_generation_raises() -> None:
    records = [committed("a", None, [say("same")]), committed("b", None, [say("same")])]

    with pytest.raises(SelectionError, match=r"ambiguous_evidence.*last returned generation"):
        all_captured(records, {"output": [say("same")]})


def test_all_captured_with_unmatched_final_generation_raises_missing_evidence() -> None:
    with pytest.raises(SelectionError, match=r"missing_evidence.*last returned generation"):
        all_captured(compaction_capture(), {"output": [say("unknown")]})


def test_all_captured_without_finish_reason_raises_missing_completion_metadata() -> None:
    records = [dataclasses.replace(committed("a", None, [say("a")]), finish_reason=None)]

    with pytest.raises(SelectionError, match=r"missing_completion_metadata.*'a'"):
        all_captured(records, {"terminal_response_id": "resp-a"})


# --- capture records -----------------------------------------------------------------------------


def test_committed_record_without_response_id_raises_missing_completion_metadata() -> None:
    records = [CapturedCall("a", None, "committed", output_fingerprint="f", finish_reason="stop")]

    with pytest.raises(SelectionError, match=r"missing_completion_metadata.*'a'"):
        returned_history(records, {"output": []})


def test_two_records_with_one_call_id_raise_duplicated() -> None:
    with pytest.raises(SelectionError, match=r"duplicated_evidence.*'a'"):
        returned_history([failed("a", None), failed("a", None)], {"model_calls": []})


def test_two_calls_serving_one_response_id_raise_duplicated() -> None:
    records = [
        committed("a", None, [say("a")]),
        dataclasses.replace(committed("b", None, [say("b")]), response_id="resp-a"),
    ]

    with pytest.raises(SelectionError, match=r"duplicated_evidence.*'resp-a'"):
        returned_history(records, {"model_calls": ["a"]})


@pytest.mark.parametrize(("call_id", "status"), [("", "committed"), ("a", "done")])
def test_invalid_captured_call_raises_invalid_record(call_id: str, status: str) -> None:
    with pytest.raises(SelectionError, match=r"invalid_record"):
        CapturedCall(call_id, None, status)


def test_records_of_another_type_raise_invalid_record() -> None:
    with pytest.raises(SelectionError, match=r"invalid_record.*dict"):
        returned_history([{"call_id": "a"}], {"output": []})  # type: ignore[list-item]


# --- select_rollout and the policy contract -------------------------------------------------------


def test_select_rollout_returns_the_checked_selection() -> None:
    result = {"output": returned("c1", "c2", "c3", "c5"), "reward": 1}

    selection = select_rollout("returned_history", compaction_capture(), result)

    assert selection.policy == "returned_history"
    assert selection.call_ids == ("c1", "c2", "c3", "c5")
    assert selection.terminal_response_id == "resp-c5"
    assert selection.terminal_call_id == "c5"
    assert selection.reward == 1.0
    assert selection.mask_reason is None


def test_select_rollout_names_a_builtin_passed_as_a_function() -> None:
    selection = select_rollout(
        all_captured, compaction_capture(), {"model_calls": ["c5"], "reward": 0.0}
    )

    assert selection.policy == "all_captured"


def test_select_rollout_carries_the_completion_mask_reason() -> None:
    records = [*compaction_capture(), pending("c6", "c5")]

    selection = select_rollout("returned_history", records, {"model_calls": ["c1"], "reward": 0.0})

    assert selection.mask_reason == MaskReason.CAPTURE_PENDING


@pytest.mark.parametrize("reward", [None, "1", True, float("nan"), float("inf")])
def test_select_rollout_requires_a_finite_reward(reward: object) -> None:
    with pytest.raises(SelectionError, match=r"invalid_result.*reward"):
        select_rollout(
            "returned_history", compaction_capture(), {"model_calls": ["c1"], "reward": reward}
        )


def test_select_rollout_requires_a_mapping_result() -> None:
    with pytest.raises(SelectionError, match=r"invalid_result.*mapping"):
        select_rollout("returned_history", compaction_capture(), ["c1"])  # type: ignore[arg-type]


RESULT = {"reward": 0.5}
RECORDS = compaction_capture()
REJECTED_RECORDS = rejected_capture()


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (lambda records, result: records, "must return"),
        (lambda records, result: ([], "resp-c1"), "nonempty"),
        (
            lambda records, result: ([dataclasses.replace(records[0], parent_id="c9")], "resp-c1"),
            "unchanged record",
        ),
        (lambda records, result: ([committed("zz", None, [])], "resp-zz"), "unchanged record"),
        (lambda records, result: ([records[0], records[0]], "resp-c1"), "selected twice"),
        (lambda records, result: ([records[0]], None), "no terminal_response_id"),
        (
            lambda records, result: ([records[0]], "resp-c2"),
            "'resp-c2' is not served by a selected record",
        ),
        (
            lambda records, result: ([records[2], records[3]], "resp-c4"),
            "'resp-c4' was rejected by the harness",
        ),
    ],
)
def test_custom_policy_result_that_breaks_the_contract_raises(policy: Any, message: str) -> None:
    with pytest.raises(SelectionError, match=rf"invalid_policy_result.*{message}"):
        select_rollout(policy, REJECTED_RECORDS, RESULT)


def test_custom_policy_selects_and_orders_freely() -> None:
    def latest_first(records: Any, result: Any) -> tuple[list[CapturedCall], str]:
        return [records[2], records[4]], "resp-c5"

    selection = select_rollout(latest_first, RECORDS, RESULT)

    assert selection.call_ids == ("c3", "c5")
    assert selection.policy.endswith("latest_first")


# --- policy resolution ---------------------------------------------------------------------------


@pytest.fixture
def policy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"grove_test_policy_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            NOT_A_FUNCTION = 3

            def select_calls(records, result):
                return [records[0]], records[0].response_id

            class Policies:
                @staticmethod
                def first(records, result):
                    return [records[0]], records[0].response_id
            """
        )
    )
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_builtin_policy_names_resolve_to_the_builtins() -> None:
    assert resolve_selection_policy("returned_history") is returned_history
    assert resolve_selection_policy("all_captured") is all_captured


def test_module_function_policy_resolves_and_runs(policy_module: str) -> None:
    policy = resolve_selection_policy(f"{policy_module}:select_calls")

    selection = select_rollout(f"{policy_module}:select_calls", RECORDS, RESULT)

    assert policy(RECORDS, RESULT) == ([RECORDS[0]], "resp-c1")
    assert selection.policy == f"{policy_module}:select_calls"
    assert selection.call_ids == ("c1",)


def test_dotted_attribute_policy_resolves(policy_module: str) -> None:
    assert (
        resolve_selection_policy(f"{policy_module}:Policies.first")(RECORDS, RESULT)[1] == "resp-c1"
    )


@pytest.mark.parametrize("spec", ["latest", "module:", ":function", "a:b:"])
def test_malformed_policy_name_raises(spec: str) -> None:
    with pytest.raises(SelectionPolicyError, match=r"malformed_name") as raised:
        resolve_selection_policy(spec)

    assert raised.value.spec == spec


def test_non_string_policy_name_raises_malformed() -> None:
    with pytest.raises(SelectionPolicyError, match=r"malformed_name"):
        resolve_selection_policy(7)  # type: ignore[arg-type]


def test_unknown_policy_module_raises() -> None:
    with pytest.raises(SelectionPolicyError, match=r"unknown_module.*no_such_grove_module"):
        resolve_selection_policy("no_such_grove_module.sub:select")


def test_policy_module_failing_at_import_raises(policy_module: str) -> None:
    with pytest.raises(SelectionPolicyError, match=r"module_import_failed.*boom at import"):
        resolve_selection_policy(f"{policy_module}_broken:select")


def test_policy_module_importing_a_missing_dependency_raises_import_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "grove_test_needs_dep.py").write_text("import grove_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(
        SelectionPolicyError, match=r"module_import_failed.*grove_missing_dependency_xyz"
    ):
        resolve_selection_policy("grove_test_needs_dep:select")


def test_missing_policy_attribute_raises(policy_module: str) -> None:
    with pytest.raises(SelectionPolicyError, match=r"missing_attribute.*'nope'"):
        resolve_selection_policy(f"{policy_module}:nope")


def test_non_callable_policy_raises(policy_module: str) -> None:
    with pytest.raises(SelectionPolicyError, match=r"not_callable.*int"):
        resolve_selection_policy(f"{policy_module}:NOT_A_FUNCTION")


def test_policy_errors_are_value_errors_for_configuration_validation() -> None:
    with pytest.raises(ValueError, match=r"unknown_module"):
        resolve_selection_policy("no_such_grove_module:select")


# --- the completion check ------------------------------------------------------------------------


def completion(*records: CapturedCall, selected: tuple[str, ...] = ("a",)) -> MaskReason | None:
    return completion_mask_reason(list(records), list(selected))


def test_complete_capture_masks_nothing() -> None:
    assert completion(committed("a", None, [say("a")])) is None


def test_failed_call_outside_the_selection_masks_the_rollout() -> None:
    # a partial history never trains: the abandoned request may have held accepted work
    assert completion(committed("a", None, [say("a")]), failed("b", "a")) == (
        MaskReason.CAPTURE_FAILED
    )


@pytest.mark.parametrize(
    "reason", [REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES, REJECTED_BY_HARNESS, "storage_error"]
)
def test_failure_outside_the_selection_on_a_call_that_never_committed_masks_whatever_the_reason(
    reason: str,
) -> None:
    assert completion(committed("a", None, []), failed("b", "a", reason)) == (
        MaskReason.CAPTURE_FAILED
    )


def test_rejected_resample_outside_the_selection_masks_nothing() -> None:
    assert completion(committed("a", None, []), rejected("b", None, [say("b")])) is None


def test_rejected_resample_inside_the_selection_masks_nothing() -> None:
    records = rejected_capture()

    assert completion_mask_reason(records, ["c1", "c2", "c3", "c4", "c5"]) is None


def test_selected_call_stopped_for_content_filter_masks_incomplete() -> None:
    record = committed("a", None, [say("a")], finish_reason="content_filter")

    assert completion(record) == MaskReason.SELECTED_CALL_INCOMPLETE


@pytest.mark.parametrize("finish_reason", ["stop", "length", "tool_calls", None])
def test_selected_call_that_stopped_complete_or_for_length_masks_nothing(
    finish_reason: str | None,
) -> None:
    record = committed("a", None, [say("a")], finish_reason="stop")
    record = dataclasses.replace(record, finish_reason=finish_reason)

    assert completion(record) is None


def test_selected_call_without_record_masks_missing() -> None:
    assert (
        completion(committed("a", None, []), selected=("a", "b"))
        == MaskReason.SELECTED_CALL_MISSING
    )


def test_selected_pending_call_masks_pending() -> None:
    assert completion(pending("a", None)) == MaskReason.SELECTED_CALL_PENDING


def test_selected_failed_call_masks_failed() -> None:
    assert completion(failed("a", None)) == MaskReason.SELECTED_CALL_FAILED


def test_selected_committed_call_with_any_failure_masks_failed() -> None:
    record = committed("a", None, [], failure_reason=REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES)

    assert completion(record) == MaskReason.SELECTED_CALL_FAILED


def test_unselected_pending_call_masks_capture_pending() -> None:
    assert completion(committed("a", None, []), pending("b", "a")) == MaskReason.CAPTURE_PENDING


def test_exempt_cancellation_on_a_committed_call_outside_the_selection_masks_nothing() -> None:
    cancelled = committed("b", "a", [], failure_reason=REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES)

    assert completion(committed("a", None, []), cancelled) is None


def test_exempt_cancellation_with_a_pending_call_still_masks() -> None:
    cancelled = committed("b", "a", [], failure_reason=REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES)

    assert (
        completion(committed("a", None, []), cancelled, pending("c", "a"))
        == MaskReason.CAPTURE_PENDING
    )


def test_other_failure_on_a_committed_call_outside_the_selection_masks_capture_failed() -> None:
    broken = committed("b", "a", [], failure_reason="storage_error")

    assert completion(committed("a", None, []), broken) == MaskReason.CAPTURE_FAILED
