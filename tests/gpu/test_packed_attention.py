"""Sequence packing on CUDA: a bin's logprobs equal the unpacked rows' under sdpa attention (the
block-diagonal mask) and under flash attention, which passes no mask and reads each row's span
from the restarting position ids (``docs/train.md``, "Sequence packing")."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from grove.training.sequence_packing import bin_logprobs
from grove.training.trainer import causal_token_logprobs
from grove.training.tree_logprobs import tree_row_lengths
from tests.unit.trainer.tiny_lm import tiny_decoder
from tests.unit.training.test_tree_logprobs import FAMILY, computed, family_batch

TOLERANCE = {"sdpa": 1e-5, "flash_attention_2": 2e-2}
"""float32 under sdpa; flash attention computes in bfloat16, so its rows differ by rounding."""


@pytest.mark.parametrize("attention", ["sdpa", "flash_attention_2"])
def test_a_packed_bin_on_cuda_gives_the_rows_logprobs(attention: str) -> None:
    if attention.startswith("flash") and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash attention needs the flash-attn package on this GPU machine")
    dtype = torch.bfloat16 if attention.startswith("flash") else torch.float32
    batch = family_batch(FAMILY)
    model = tiny_decoder("llama", seed=0, attn_implementation=attention)
    model = model.to(device="cuda", dtype=dtype).eval()

    with torch.no_grad():
        packed = bin_logprobs(model, batch.token_ids, tree_row_lengths(batch.loss_mask))
        rows = causal_token_logprobs(model, batch.token_ids.to("cuda"))

    inside = computed(batch).to(packed.device)
    difference = (packed.float() - rows.float().to(packed.device))[inside].abs().max()
    assert float(difference) <= TOLERANCE[attention]
