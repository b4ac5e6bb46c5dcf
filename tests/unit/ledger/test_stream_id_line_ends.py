"""Stream ids (capture keys) end where their text ends: ``"k\\n"``, which a ``$`` anchor lets
through, is refused like any other character outside the alphabet."""

from __future__ import annotations

import pytest

from grove.ledger.errors import StreamIdError
from grove.ledger.store import STREAM_ID_PATTERN, validate_stream_id


@pytest.mark.parametrize("stream_id", ["k\n", "k\r\n", "k\r", "\nk", "a\nb"])
def test_a_stream_id_with_a_line_end_is_refused(stream_id: str):
    with pytest.raises(StreamIdError, match="use 1-200 characters"):
        validate_stream_id(stream_id)


def test_a_stream_id_of_the_alphabet_is_accepted():
    assert validate_stream_id("attempt:7@host_1.run-2") == "attempt:7@host_1.run-2"


def test_the_public_stream_id_pattern_refuses_a_newline_even_with_match():
    assert STREAM_ID_PATTERN.match("k\n") is None
    assert STREAM_ID_PATTERN.match("k" * 200) is not None
    assert STREAM_ID_PATTERN.match("k" * 201) is None
