"""Message normalization (docs/normalization.md) and item digests."""

from __future__ import annotations

import pytest

from grove.capture.errors import NormalizationError
from grove.capture.render import NORMALIZATION_VERSION, admission_items, normalize_messages

TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "search", "arguments": '{"query": "weather", "limit": 3}'},
}


def test_normalization_version_is_four() -> None:
    assert NORMALIZATION_VERSION == 4
    assert normalize_messages([{"role": "user", "content": "hi"}]).normalization_version == 4


def test_client_metadata_on_items_is_dropped_and_its_response_id_echoed() -> None:
    # The OpenAI Agents SDK keeps provider_data on the items of its sessions.
    provider = {"model": "m", "response_id": "resp-1"}
    request = normalize_messages(
        [
            {"role": "user", "content": "hi", "provider_data": provider},
            {
                "type": "message",
                "id": "__fake_id__",
                "role": "assistant",
                "status": "completed",
                "phase": "final_answer",
                "provider_data": provider,
                "content": [
                    {"type": "output_text", "text": "4", "annotations": [], "logprobs": []}
                ],
            },
        ]
    )
    assert request.messages == (
        {"content": "hi", "role": "user"},
        {"content": "4", "role": "assistant"},
    )
    assert request.echoed_ids == (("resp-1",), ("__fake_id__", "resp-1"))


def test_folded_output_items_echo_each_id_once() -> None:
    request = normalize_messages(
        [
            {"type": "reasoning", "id": "resp-1", "summary": [], "content": []},
            {
                "type": "function_call",
                "id": "resp-1",
                "call_id": "c1",
                "name": "f",
                "arguments": "{}",
            },
            {
                "type": "function_call",
                "id": "resp-1",
                "call_id": "c2",
                "name": "g",
                "arguments": "{}",
            },
        ]
    )
    assert len(request.messages) == 1
    assert request.echoed_ids == (("resp-1",),)


def test_item_ids_and_statuses_are_dropped_and_kept_as_echoed_ids() -> None:
    request = normalize_messages(
        [{"role": "assistant", "content": "4", "id": "msg_7", "status": "completed"}]
    )
    assert request.messages == ({"content": "4", "role": "assistant"},)
    assert request.echoed_ids == (("msg_7",),)


def test_none_values_are_dropped_at_every_depth() -> None:
    request = normalize_messages(
        [
            {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [{**TOOL_CALL, "index": None}],
            }
        ]
    )
    assert request.messages == (
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "function": {"arguments": {"limit": 3, "query": "weather"}, "name": "search"},
                    "id": "call_1",
                    "type": "function",
                }
            ],
        },
    )


def test_tool_call_arguments_are_parsed_so_spelling_does_not_matter() -> None:
    spaced = {
        **TOOL_CALL,
        "function": {"name": "search", "arguments": '{ "limit":3,"query":"weather"}'},
    }
    a = normalize_messages([{"role": "assistant", "tool_calls": [TOOL_CALL]}])
    b = normalize_messages([{"role": "assistant", "tool_calls": [spaced]}])
    assert a == b


def test_a_tool_calls_stream_index_and_client_parse_are_dropped() -> None:
    # The official client's stream helper keeps each call's delta index in the message it
    # accumulates; its parsing helpers add their own parse of the arguments.
    accumulated = {
        **TOOL_CALL,
        "index": 0,
        "function": {**TOOL_CALL["function"], "parsed_arguments": {"query": "weather"}},
    }
    plain = normalize_messages([{"role": "assistant", "tool_calls": [TOOL_CALL]}])
    streamed = normalize_messages([{"role": "assistant", "tool_calls": [accumulated]}])
    assert streamed == plain
    assert admission_items(streamed) == admission_items(plain)


def test_tool_call_arguments_that_are_not_json_are_kept_verbatim() -> None:
    call = {**TOOL_CALL, "function": {"name": "search", "arguments": "weather?"}}
    request = normalize_messages([{"role": "assistant", "tool_calls": [call]}])
    assert request.messages[0]["tool_calls"][0]["function"]["arguments"] == "weather?"


def test_all_text_content_parts_are_joined_into_one_string() -> None:
    request = normalize_messages(
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Hello, "},
                    {"type": "text", "text": "world"},
                ],
            }
        ]
    )
    assert request.messages == ({"content": "Hello, world", "role": "user"},)


def test_content_with_an_image_part_keeps_its_parts() -> None:
    parts = [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "u"}}]
    request = normalize_messages([{"role": "user", "content": parts}])
    assert request.messages[0]["content"] == parts


def test_reasoning_key_becomes_reasoning_content() -> None:
    request = normalize_messages([{"role": "assistant", "content": "4", "reasoning": "2+2"}])
    assert request.messages == ({"content": "4", "reasoning_content": "2+2", "role": "assistant"},)


def test_responses_items_map_to_roles_and_fold_one_output_into_one_assistant_message() -> None:
    request = normalize_messages(
        [
            {"type": "message", "role": "user", "content": "weather?"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "look"}],
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "search",
                "arguments": '{"query": "weather", "limit": 3}',
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ]
    )
    chat = normalize_messages(
        [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "reasoning_content": "look", "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
    )
    assert request.messages == chat.messages
    assert request.echoed_ids == ((), ("rs_1", "fc_1"), ())


def test_a_second_assistant_text_item_starts_a_new_assistant_message() -> None:
    text = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "a"}],
    }
    request = normalize_messages([text, text])
    assert request.messages == ({"content": "a", "role": "assistant"},) * 2


def test_normalization_is_idempotent() -> None:
    request = normalize_messages(
        [
            {"role": "system", "content": "terse"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c",
                "output": [{"type": "input_text", "text": "ok"}],
            },
        ]
    )
    assert normalize_messages(request.messages).messages == request.messages


def test_unknown_role_raises_normalization_error() -> None:
    with pytest.raises(NormalizationError, match=r"item 1: role must be one of .*got 'robot'"):
        normalize_messages([{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}])


def test_unknown_item_type_raises_normalization_error() -> None:
    with pytest.raises(NormalizationError, match=r"item 0: a Responses item type .* got 'web'"):
        normalize_messages([{"type": "web", "role": "user"}])


def test_conflicting_reasoning_fields_raise_normalization_error() -> None:
    with pytest.raises(NormalizationError, match="reasoning and reasoning_content must agree"):
        normalize_messages([{"role": "assistant", "reasoning": "a", "reasoning_content": "b"}])


def test_content_of_another_type_raises_normalization_error() -> None:
    with pytest.raises(NormalizationError, match="content must be a string or a list of parts"):
        normalize_messages([{"role": "user", "content": 7}])


def test_item_digest_ignores_key_order_and_dropped_fields() -> None:
    a = admission_items(normalize_messages([{"role": "user", "content": "hi", "id": "x"}]))
    b = admission_items(normalize_messages([{"content": "hi", "name": None, "role": "user"}]))
    assert a[0].digest == b[0].digest
    assert a[0].echoed_ids == ("x",)
    assert b[0].echoed_ids == ()


def test_item_digest_differs_when_content_differs() -> None:
    a = admission_items(normalize_messages([{"role": "user", "content": "hi"}]))
    b = admission_items(normalize_messages([{"role": "user", "content": "hi "}]))
    assert a[0].digest != b[0].digest


def test_null_and_empty_tool_content_differ_strictly_but_share_a_canonical_digest() -> None:
    null, empty = admission_items(
        normalize_messages(
            [
                {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
            ]
        )
    )
    assert null.digest != empty.digest
    assert null.canonical_digest == empty.canonical_digest == null.digest


def test_empty_content_without_tool_calls_has_no_canonical_equivalent() -> None:
    (item,) = admission_items(normalize_messages([{"role": "assistant", "content": ""}]))
    assert item.canonical_digest == item.digest
    (other,) = admission_items(normalize_messages([{"role": "assistant"}]))
    assert other.canonical_digest != item.canonical_digest
