"""Save the embedded engine's tokenizer and model as a directory that ``vllm serve`` can load.

Built offline from ``capture/embedded.py`` (nothing is downloaded): ``config.json``
(``Qwen2ForCausalLM``, float32), ``model.safetensors``, the tokenizer files with the ChatML
template, and ``generation_config.json`` whose only end-of-sequence token is end of turn, as in
:class:`grove.capture.embedded.EmbeddedEngine`. The width departs from the embedded default (64):
vLLM's CPU attention supports head sizes from 32 up, so the model has 4 heads of 32 (hidden size
128).

Usage: ``python -m tests.vllm.build_model DIR``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

import torch
from transformers import GenerationConfig

from grove.capture.embedded import build_model, build_tokenizer

__all__ = ["HIDDEN_SIZE", "save_tiny_model"]

HIDDEN_SIZE: Final = 128  # 4 attention heads of 32: the smallest head size vLLM's CPU backend runs


def save_tiny_model(directory: Path, *, seed: int = 0) -> Path:
    """Write the tiny model and tokenizer under ``directory`` (created) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=seed, hidden_size=HIDDEN_SIZE).to(torch.float32)
    model.config.dtype = torch.float32
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def main() -> None:
    """Command line: save the tiny model under the given directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(save_tiny_model(args.directory, seed=args.seed))


if __name__ == "__main__":
    main()
