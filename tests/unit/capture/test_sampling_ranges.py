"""``SamplingParams`` holds only values every engine takes and the ledger records: a seed is a
non-negative signed 64-bit integer, ``max_tokens`` and ``top_k`` fit an ``integer`` column. The
gateway builds it before the call's intent, so an out-of-range value writes nothing."""

from __future__ import annotations

import pytest

from grove.capture.engine import SamplingParams
from grove.capture.errors import InvalidSamplingError
from grove.ledger.bounds import MAX_COUNT, MAX_SEED


@pytest.mark.parametrize("seed", [MAX_SEED + 1, 2**64, -1, True, 1.5])
def test_a_seed_outside_signed_64_bits_is_refused(seed: object):
    with pytest.raises(InvalidSamplingError, match=r"seed: got .*\[0, 9223372036854775807\]"):
        SamplingParams(max_tokens=1, seed=seed)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [None, 0, MAX_SEED])
def test_a_seed_in_range_is_kept(seed: int | None):
    assert SamplingParams(max_tokens=1, seed=seed).seed == seed


@pytest.mark.parametrize("max_tokens", [0, MAX_COUNT + 1, 2**70, 2.0])
def test_max_tokens_outside_one_to_the_integer_column_is_refused(max_tokens: object):
    with pytest.raises(InvalidSamplingError, match=r"max_tokens: got .*\[1, 2147483647\]"):
        SamplingParams(max_tokens=max_tokens)  # type: ignore[arg-type]


def test_max_tokens_at_the_integer_column_is_kept():
    assert SamplingParams(max_tokens=MAX_COUNT).max_tokens == MAX_COUNT


@pytest.mark.parametrize("top_k", [-1, MAX_COUNT + 1])
def test_top_k_out_of_range_is_refused(top_k: int):
    with pytest.raises(InvalidSamplingError, match="top_k"):
        SamplingParams(max_tokens=1, top_k=top_k)
