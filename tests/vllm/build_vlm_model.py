"""Save the embedded vision-language model as a directory that vLLM can serve.

Built offline from ``capture/embedded_vlm.py`` (nothing is downloaded): ``config.json``
(``Qwen2VLForConditionalGeneration``, float32), ``model.safetensors``, the tokenizer with the
vision tokens and :data:`grove.capture.embedded_vlm.VLM_TEMPLATE`, ``preprocessor_config.json`` (the
Qwen2-VL image processor with the embedded pixel budget) and ``generation_config.json`` whose only
end-of-sequence token is end of turn. The width departs from the embedded default (64): vLLM's
CPU attention supports head sizes from 32 up, so the language model has 4 heads of 32.

Usage: ``python -m tests.vllm.build_vlm_model DIR``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

import torch
from transformers import GenerationConfig

from grove.capture.embedded_vlm import (
    build_image_processor,
    build_vlm_model,
    build_vlm_tokenizer,
)

__all__ = ["VLM_HIDDEN_SIZE", "save_tiny_vlm"]

VLM_HIDDEN_SIZE: Final = 128


def save_tiny_vlm(directory: Path, *, seed: int = 0) -> Path:
    """Write the tiny VLM, its tokenizer and processor under ``directory`` and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_vlm_tokenizer()
    model = build_vlm_model(tokenizer, seed=seed, hidden_size=VLM_HIDDEN_SIZE).to(torch.float32)
    model.config.dtype = torch.float32
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(directory)
    build_image_processor().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def main() -> None:
    """Command line: save the tiny VLM under the given directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(save_tiny_vlm(args.directory, seed=args.seed))


if __name__ == "__main__":
    main()
