"""The warm start (``model.warm_start``): a short supervised fit of the embedded model, cached.

The embedded model's weights are random, so an agent that offers it a tool gets noise, never a
tool call, and GRPO has nothing to reinforce. The warm start fits it first, on the synthetic
conversations of ``grove/demo/agent_corpus.py`` (reasoning, a ``lookup`` tool call, its result,
the answer, sometimes a summary; ``WARM_START_CORPUS``), so a tool-using agent works from step 0
(``docs/train.md``, "The warm start"), yet only part of the time, which leaves GRPO room.

The fit is ordinary supervised fine-tuning, made deterministic and small:

- each step takes ``batch_size`` conversations in the order of a seeded shuffle (a fresh one per
  pass), right-padded to the longest; the loss is the mean cross-entropy of the next token over
  the batch's assistant tokens (``TrainingExample.loss_mask``) — prompts and tool results are
  context, never targets;
- AdamW (betas 0.9, 0.95, no weight decay) at ``learning_rate``, warmed up linearly over
  ``warmup_steps`` and decayed linearly to a tenth by the last step; gradients clipped to norm
  ``max_grad_norm``;
- ``steps`` steps on one CPU thread, so the core count does not change the sums; the batch order
  is the fit's only randomness (``seed``), and the global torch random state is left as it was:
  the same settings give the same weights, bit for bit.

The fitted weights are cached under ``WORKDIR/warm_start/KEY/`` (``model.safetensors`` and
``manifest.json``, which records the key and the weights' sha256 and size). ``KEY`` is the sha256
of everything that decides the weights: the corpus spec, the fit settings, the base model's seed
and configuration, the tokenizer and its chat template, and the torch version. A run with the same
key loads the cache instead of fitting. The cache is written to a temporary directory beside it
and renamed into place, so it is either whole or absent; one that does not verify (a manifest
that does not parse or names another key, weights of another digest or size, tensors that do not
fit the model) is removed and fitted again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model as load_weights
from safetensors.torch import save_model as save_weights
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grove.demo.agent_corpus import CorpusSpec, TrainingExample, corpus_examples
from grove.errors import JobError

__all__ = [
    "CACHE_DIRECTORY",
    "WARM_START_CORPUS",
    "FitSettings",
    "WarmStart",
    "WarmStartError",
    "fit",
    "warm_start",
    "warm_start_key",
]

CACHE_DIRECTORY: Final = "warm_start"
"""The directory under the workdir that holds the cached fits, one subdirectory per key."""

WARM_START_CORPUS: Final = CorpusSpec(noted_give_up_fraction=0.85)
"""The corpus ``model.warm_start`` fits on: a lookup agent that uses its tool and answers from
it in a fresh context, but in a context restarted from notes mostly answers ``I do not know.``
without the tool, so that GRPO has behaviour to improve."""

_WEIGHTS: Final = "model.safetensors"
_MANIFEST: Final = "manifest.json"
_FORMAT: Final = "grove.warm_start.v1"
_BETAS: Final = (0.9, 0.95)
_FINAL_LR_FRACTION: Final = 0.1
_POOL_BATCHES: Final = 8  # batches per length-sorted pool


class WarmStartError(JobError):
    """The warm start's cache cannot be written or read back: ``directory`` and the reason."""

    def __init__(self, directory: Path, problem: str) -> None:
        self.directory = directory
        self.problem = problem
        super().__init__(f"warm start cache {directory}: {problem}")


@dataclass(frozen=True)
class FitSettings:
    """How the warm start fits; every field is part of the cache key."""

    steps: int = 640
    """Optimizer steps."""

    batch_size: int = 4
    """Conversations per step."""

    learning_rate: float = 2e-2
    """Peak AdamW learning rate."""

    warmup_steps: int = 20
    """Steps of the linear warm-up to the peak."""

    max_grad_norm: float = 1.0
    """Gradient norm clip."""

    seed: int = 0
    """Seed of the batch order."""


@dataclass(frozen=True)
class WarmStart:
    """What :func:`warm_start` did: the cache directory it used, its key, whether it fitted (or
    loaded), and the fit's record (``manifest.json``: the settings, the first step's loss, the
    final loss as the mean of the last tenth of the steps, the seconds and CPU seconds taken, and
    the weights' sha256 and size)."""

    directory: Path
    key: str
    fitted: bool
    manifest: dict[str, Any]


def warm_start_key(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    base_seed: int,
    corpus: CorpusSpec,
    settings: FitSettings,
) -> str:
    """The cache key of fitting ``model`` (built from ``base_seed``) with ``tokenizer``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    record = {
        "format": _FORMAT,
        "corpus": asdict(corpus),
        "fit": asdict(settings),
        "base_seed": base_seed,
        "model_config": model.config.to_diff_dict(),
        "tokenizer": None if backend is None else backend.to_str(),
        "chat_template": tokenizer.chat_template,
        "torch": torch.__version__,
    }
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _learning_rate_factor(step: int, settings: FitSettings) -> float:
    """Linear warm-up over ``warmup_steps``, then linear decay to ``_FINAL_LR_FRACTION``."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    remaining = (settings.steps - 1 - step) / max(settings.steps - settings.warmup_steps, 1)
    return _FINAL_LR_FRACTION + (1 - _FINAL_LR_FRACTION) * max(remaining, 0.0)


def _batches(lengths: Sequence[int], settings: FitSettings) -> Iterator[list[int]]:
    """Example indices of each step: per pass, a seeded shuffle cut into pools of
    ``_POOL_BATCHES`` batches, each pool sorted by length and cut into batches (so a batch pads
    little), and the pass's batches shuffled."""
    draw = random.Random(settings.seed)
    pool = settings.batch_size * _POOL_BATCHES
    steps = 0
    while True:
        order = list(range(len(lengths)))
        draw.shuffle(order)
        batches = []
        for start in range(0, len(order), pool):
            chunk = sorted(order[start : start + pool], key=lambda i: (lengths[i], i))
            step = settings.batch_size
            batches += [chunk[k : k + step] for k in range(0, len(chunk), step)]
        draw.shuffle(batches)
        for batch in batches:
            if steps == settings.steps:
                return
            steps += 1
            yield batch


def _padded(
    examples: Sequence[TrainingExample], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, attention mask and loss mask of ``examples``, right-padded; each (B, T)."""
    length = max(len(e.token_ids) for e in examples)
    ids = torch.full((len(examples), length), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(examples), length), dtype=torch.long)
    loss = torch.zeros((len(examples), length), dtype=torch.bool)
    for row, example in enumerate(examples):
        n = len(example.token_ids)
        ids[row, :n] = torch.tensor(example.token_ids)
        attention[row, :n] = 1
        loss[row, :n] = torch.tensor(example.loss_mask)
    return ids, attention, loss


def fit(
    model: PreTrainedModel,
    examples: Sequence[TrainingExample],
    settings: FitSettings,
    *,
    pad_token_id: int,
) -> list[float]:
    """Fit ``model`` (a causal LM with a ``model`` decoder and an ``lm_head``, as the embedded
    Qwen2 model is) in place on ``examples`` by the rules in the module docstring; returns each
    step's loss. The model is left in eval mode."""
    if not examples:
        raise ValueError("the warm start needs at least one training example, got none")
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.learning_rate, betas=_BETAS, weight_decay=0.0
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _learning_rate_factor(step, settings)
    )
    losses = []
    with _one_thread():
        for indices in _batches([len(e.token_ids) for e in examples], settings):
            ids, attention, mask = _padded([examples[i] for i in indices], pad_token_id)
            hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state
            targets = mask[:, 1:]  # (B, T-1): the token at t+1 is predicted at t
            logits = model.lm_head(hidden[:, :-1][targets])  # (N, V): predicting positions only
            loss = torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][targets])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
    model.eval()
    return losses


def _sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _load_cached(model: PreTrainedModel, directory: Path, key: str) -> dict[str, Any] | None:
    """The manifest of a cache entry that verifies, after loading its weights into ``model``;
    None when there is no entry, or one that does not verify (then ``model`` may be changed)."""
    try:
        manifest = json.loads((directory / _MANIFEST).read_text())
        weights = directory / _WEIGHTS
        valid = (
            isinstance(manifest, dict)
            and manifest.get("key") == key
            and manifest.get("weights_bytes") == weights.stat().st_size
            and manifest.get("weights_sha256") == _sha256(weights)
        )
        if not valid:
            return None
        missing, unexpected = load_weights(model, weights, strict=False)
    except (OSError, ValueError, SafetensorError, RuntimeError):
        return None
    return manifest if not missing and not unexpected else None


def _write_cache(model: PreTrainedModel, root: Path, key: str, record: dict[str, Any]) -> Path:
    """Write ``model``'s weights and the manifest to a temporary directory under ``root`` and
    rename it to ``root/key``; returns that directory. If another process renamed its own copy
    first, that one stays."""
    root.mkdir(parents=True, exist_ok=True)
    temporary = root / f".{key}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    temporary.mkdir()
    try:
        save_weights(model, str(temporary / _WEIGHTS))
        weights = temporary / _WEIGHTS
        manifest = {
            **record,
            "weights_sha256": _sha256(weights),
            "weights_bytes": weights.stat().st_size,
        }
        (temporary / _MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        final = root / key
        with contextlib.suppress(OSError):  # another process's copy is already in place
            temporary.rename(final)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return root / key


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cache_root: Path,
    *,
    base_seed: int,
    corpus: CorpusSpec | None = None,
    settings: FitSettings | None = None,
) -> WarmStart:
    """Give ``model`` (the embedded model built from ``base_seed``, float32) its warm-started
    weights: loaded from ``cache_root/warm_start/KEY`` when a verified entry is there, fitted and
    cached otherwise. ``model`` is left in eval mode."""
    corpus = corpus or WARM_START_CORPUS
    settings = settings or FitSettings()
    key = warm_start_key(model, tokenizer, base_seed=base_seed, corpus=corpus, settings=settings)
    root = Path(cache_root) / CACHE_DIRECTORY
    directory = root / key
    pristine = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    manifest = _load_cached(model, directory, key)
    if manifest is not None:
        return WarmStart(directory, key, fitted=False, manifest=manifest)
    model.load_state_dict(pristine)  # a cache entry that failed half-way may have written some
    shutil.rmtree(directory, ignore_errors=True)
    started = time.perf_counter()
    cpu = time.process_time()
    examples = corpus_examples(tokenizer, corpus)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    losses = fit(model, examples, settings, pad_token_id=int(pad))
    tail = max(len(losses) // 10, 1)  # the final loss: the mean of the last tenth of the steps
    record = {
        "key": key,
        "format": _FORMAT,
        "corpus": asdict(corpus),
        "fit": asdict(settings),
        "base_seed": base_seed,
        "examples": len(examples),
        "trained_tokens_per_pass": sum(sum(e.loss_mask) for e in examples),
        "first_loss": losses[0],
        "final_loss": sum(losses[-tail:]) / tail,
        "seconds": round(time.perf_counter() - started, 3),
        "cpu_seconds": round(time.process_time() - cpu, 3),
    }
    try:
        directory = _write_cache(model, root, key, record)
    except OSError as error:
        raise WarmStartError(
            directory,
            f"cannot write the fitted weights ({error}); give a workdir Grove may write to",
        ) from error
    manifest = _load_cached(model, directory, key)
    if manifest is None:
        raise WarmStartError(
            directory,
            "the entry just written is not in place or does not verify; check that the workdir "
            "is writable and the disk sound, remove the directory and run again",
        )
    return WarmStart(directory, key, fitted=True, manifest=manifest)
