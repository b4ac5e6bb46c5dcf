"""Divergence diagnostics (capture/divergence.py): where two sides part, and the likely cause.

The classification runs on plain strings; locating tokens and windows uses the embedded
tokenizer's exact decode.
"""

from __future__ import annotations

import pytest

from grove.capture.divergence import (
    TOKEN_TEXT_LIMIT,
    WINDOW,
    Cause,
    Divergence,
    Side,
    TokenWindow,
    classify,
    common_prefix_length,
    diagnose,
    token_at,
)
from grove.capture.render import Renderer

HISTORY = "<|im_start|>system\nToday is 2025-01-01.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def cause(parent: str, request: str, *, decoded: str | None = None, same_ids: bool = False):
    """The cause of two texts whose request side decodes as itself unless ``decoded`` says."""
    return classify(
        parent,
        request,
        request_decoded=request if decoded is None else decoded,
        same_token_ids=same_ids,
    )


def test_a_changed_date_in_the_system_prompt_is_changed_content():
    assert cause(HISTORY, HISTORY.replace("2025-01-01", "2025-01-02")) is Cause.CHANGED_CONTENT


def test_trimmed_whitespace_around_an_output_is_changed_content():
    parent = "<|im_start|>assistant\n  Sunny. <|im_end|>\n<|im_start|>user\n"
    request = "<|im_start|>assistant\nSunny.<|im_end|>\n<|im_start|>user\n"
    assert cause(parent, request) is Cause.CHANGED_CONTENT


@pytest.mark.parametrize(
    "request_output",
    ["Sunny.<|im_end|>\n<|im_start|>user\nAnd tomorrow?", "<think></think>Sunny.<|im_end|>\n"],
    ids=["dropped", "emptied"],
)
def test_the_parents_reasoning_missing_from_the_request_is_stripped_reasoning(request_output):
    parent = "<|im_start|>assistant\n<think>look outside</think>Sunny.<|im_end|>\n"
    request = "<|im_start|>assistant\n" + request_output
    assert cause(parent, request) is Cause.STRIPPED_REASONING


def test_reasoning_the_request_also_carries_is_not_stripped_reasoning():
    parent = "<|im_start|>assistant\n<think>a</think>Sunny.<|im_end|>\n"
    request = "<|im_start|>assistant\n <think>a</think>Sunny.<|im_end|>\n"
    assert cause(parent, request) is Cause.CHANGED_CONTENT


def test_a_side_that_stops_early_is_truncation():
    assert cause(HISTORY, HISTORY[:-12]) is Cause.TRUNCATION
    assert cause(HISTORY[:30], HISTORY) is Cause.TRUNCATION


def test_texts_that_agree_once_the_request_is_tokenized_are_token_merging():
    # A tokenizer whose decode writes a space after a special token that the rendering has not.
    parent = "<|im_start|> user\nHi<|im_end|>"
    request = "<|im_start|>user\nHi<|im_end|>"
    assert cause(parent, request, decoded=parent) is Cause.TOKEN_MERGING


def test_equal_texts_with_other_token_ids_are_token_merging():
    assert cause(HISTORY, HISTORY, same_ids=False) is Cause.TOKEN_MERGING
    assert cause(HISTORY, HISTORY, same_ids=True) is Cause.UNKNOWN


def test_sides_that_never_agree_again_are_unknown():
    assert cause("abc" + "x" * 40, "abc" + "y" * 40) is Cause.UNKNOWN


def test_common_prefix_length_counts_shared_characters_and_ids():
    assert common_prefix_length("weather", "wealth") == 3
    assert common_prefix_length("", "abc") == 0
    assert common_prefix_length("abc", "abc") == 3
    assert common_prefix_length([1, 2, 3, 4], (1, 2, 9)) == 2  # a list and a tuple compare alike


def test_token_at_finds_the_token_that_holds_a_character(renderer: Renderer):
    ids = renderer.encode("The quick brown fox")
    texts = [renderer.decode([t]) for t in ids]
    starts = [sum(len(t) for t in texts[:i]) for i in range(len(ids))]
    for index, start in enumerate(starts):
        for char in range(start, start + len(texts[index])):
            assert token_at(ids, char, renderer.decode) == index
            assert token_at(ids, char, renderer.decode, known=index) == index
    assert token_at(ids, len("The quick brown fox"), renderer.decode) == len(ids)


def test_diagnose_locates_the_point_on_both_sides_with_bounded_windows(renderer: Renderer):
    parent_text = HISTORY * 8
    request_text = HISTORY * 6 + HISTORY.replace("2025-01-01", "2025-01-02") + HISTORY
    parent = Side("parent", "the parent", parent_text, tuple(renderer.encode(parent_text)))
    request = Side("request", "the request", request_text, tuple(renderer.encode(request_text)))
    divergence = diagnose(parent, request, message_index=12, decode=renderer.decode)

    at = len(HISTORY) * 6 + len("<|im_start|>system\nToday is 2025-01-0")
    assert (divergence.char_offset, divergence.message_index) == (at, 12)
    assert divergence.cause is Cause.CHANGED_CONTENT
    for side, window in ((parent, divergence.parent), (request, divergence.request)):
        before = renderer.decode(list(side.token_ids[: window.offset]))
        through = renderer.decode(list(side.token_ids[: window.offset + 1]))
        assert len(before) <= at < len(through)  # the offset token holds the point
        assert window.start == window.offset - WINDOW
        assert window.token_ids == side.token_ids[window.start : window.offset + WINDOW]
        assert window.texts == tuple(renderer.decode([t]) for t in window.token_ids)
    assert divergence.token_offset == divergence.parent.offset


def test_windows_are_cut_at_the_ends_of_a_side(renderer: Renderer):
    parent = Side("parent", "p", "Hi there", tuple(renderer.encode("Hi there")))
    request = Side("request", "r", "Ho there", tuple(renderer.encode("Ho there")))
    divergence = diagnose(parent, request, message_index=0, decode=renderer.decode)
    assert (divergence.parent.start, divergence.parent.token_ids) == (0, parent.token_ids)


def test_a_long_token_text_is_cut_in_the_record():
    long = "x" * (TOKEN_TEXT_LIMIT * 3)
    side = Side("parent", "p", long, (7,))
    other = Side("request", "r", "y", (8,))
    divergence = diagnose(side, other, message_index=0, decode=lambda ids: long if ids else "")
    assert len(divergence.parent.texts[0]) == TOKEN_TEXT_LIMIT


@pytest.fixture
def recorded() -> Divergence:
    window = TokenWindow(
        "parent", "the parent chain's exact tokens", 3, 5, (1, 2, 3, 4), ("a",) * 4
    )
    other = TokenWindow("request", "the history rendered", 3, 4, (1, 2, 9), ("a", "a", "b"))
    return Divergence(0, 33, Cause.CHANGED_CONTENT, window, other)


def test_a_divergence_reads_back_from_its_payload(recorded: Divergence):
    assert Divergence.from_payload(recorded.as_payload()) == recorded
    assert recorded.as_payload()["token_offset"] == 5


def test_a_divergence_describes_where_why_and_both_windows(recorded: Divergence):
    text = recorded.describe()
    assert text.splitlines()[0] == (
        "diverged at message 0, character 33, token 5 of the parent side and 4 of the request "
        "side; likely cause: changed content: the text differs there and agrees again after it "
        "(e.g. a date in the system prompt, trimmed whitespace)"
    )
    assert '    text "aa" ▶ "aa"' in text  # parent: tokens 3-4 before the offset, 5-6 from it
    assert "    ids  [1 2] ▶ [3 4]" in text
    assert "    ids  [1] ▶ [2 9]" in text
