"""Finding a lone UTF-16 surrogate in parsed JSON: where it is, in keys, values and list items,
at any depth, without recursion; pairs decoded into one character are text."""

from __future__ import annotations

import json

import pytest

from grove.capture.surrogates import MAX_PATH_CHARS, lone_surrogate_at


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('"\\ud800"', ""),
        ('{"a": "x\\udfff"}', "a"),
        ('{"a": [1, {"b": "\\ud800z"}]}', "a.1.b"),
        ('{"a": {"\\ud800": 1}}', "a"),
        ('["ok", "\\udbff"]', "1"),
    ],
)
def test_a_lone_surrogate_is_found_where_it_is(text: str, where: str):
    assert lone_surrogate_at(json.loads(text)) == where


@pytest.mark.parametrize(
    "text", ['"\\ud83d\\ude00"', '{"caf\\u00e9": "\\u4e2d"}', "[1, 2.5, null, true]", '"plain"']
)
def test_text_without_a_lone_surrogate_passes(text: str):
    assert lone_surrogate_at(json.loads(text)) is None


def test_a_surrogate_under_deep_nesting_is_found_without_recursion():
    value: object = "\ud800"
    for _ in range(100_000):  # far past Python's recursion limit
        value = [value]
    assert lone_surrogate_at(value) == "..." + ".".join(["0"] * 100_000)[-MAX_PATH_CHARS:]


def test_a_long_path_is_named_by_its_last_200_characters():
    value = {"k" * 150: {"a" * 150: ["\ud800"]}}
    assert (
        lone_surrogate_at(value) == "..." + ("k" * 150 + "." + "a" * 150 + ".0")[-MAX_PATH_CHARS:]
    )
