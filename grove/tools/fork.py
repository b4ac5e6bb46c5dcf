"""``grove fork KEY CALL_ID``: sample a recorded call again, beside its recorded answer.

The debugging question is "what does the model say here now, and how likely is what it said
then?" (``docs/fork.md``, "Debugging a call: grove fork"). The steps:

1. **The prompt.** Call ``C`` of attempt ``K`` must be committed (a call the harness rejected is
   committed too). Its exact prompt is its parent's chain, root first — each call's prompt delta
   and generated tokens, crossing into a fork's source as the fork's rows do (the chain
   ``grove.capture.forks.fork_source`` records for a fork) — followed by ``C``'s own prompt
   delta. Every token comes from the blobs (sizes and sha256 verified by the blob store) and the
   whole chain is checked against the chain digest each call's commit recorded; nothing is
   re-tokenized.
2. **The weights.** The model a run's configuration names (``model.path``: ``embedded`` or a
   local Hugging Face directory, ``grove/engines/models.py``), with the weights of a schema-5
   checkpoint (``training/checkpoint.py``; verified against its manifest, and refused unless its
   tensors are exactly the model's) or, without one, as configured (seed and warm start).
3. **The recorded answer.** Its logprobs *then* are those its blob stores (the engine's, when it
   sampled it); *now* they are recomputed by teacher forcing under the loaded weights with the
   trainer's own code (``grove.training.trainer.recompute_token_logprobs``: eval mode, at least
   float32). Its TMPE is ``grove.training.advantages.pooled_logprob_error`` over its tokens, the
   mean of ``exp(|now - then|)`` (``docs/metrics.md``): 1 when the weights are those that sampled
   it. A call decoded under an output constraint recorded the logprobs of the grammar's masked
   distribution; *now* is unmasked, so its TMPE is above 1 even under the same weights.
4. **The samples.** ``n`` generations after the same prompt by the embedded engine grove train
   samples with (``grove.engines.policy.EmbeddedPolicy``), sample ``i`` seeded with
   ``seed + i`` (so ``--n 1 --seed S+i`` repeats it alone), each with its own logprobs.

It reads the ledger and the blobs and writes neither; with a ``SampleRecorder``
(``grove.tools.fork_recording``, ``--record``) each sample is drawn and recorded as an attempt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerBase

from grove.capture.embedded import EmbeddedEngine
from grove.capture.engine import Generation, SamplingParams
from grove.capture.forks import chain_link, fork_source
from grove.config import GroveConfig, load_config
from grove.engines.models import LoadedModel, context_length, load_model
from grove.engines.policy import EmbeddedPolicy
from grove.errors import JobError
from grove.ledger.admission import CallStatus
from grove.ledger.attempt import AttemptLog, AttemptState, CallState
from grove.ledger.events import SourceCall
from grove.ledger.store import EventStore
from grove.storage import BlobRef, BlobStore, CallDelta, UnusableBlobError, row_chain_digests
from grove.train.runs import CONFIG_FILE, RunNotFound, find_run, run_path
from grove.training.advantages import pooled_logprob_error
from grove.training.checkpoint import latest_checkpoint, verify_checkpoint
from grove.training.placement import resolve_device
from grove.training.state_dict_fit import state_dict_fit
from grove.training.trainer import recompute_token_logprobs
from grove.workspace import Workspace

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "PROMPT_TAIL",
    "ForkError",
    "ForkModel",
    "ForkReport",
    "RecordedCall",
    "Sample",
    "SampleRecorder",
    "fork_call",
    "fork_configuration",
    "load_fork_model",
    "read_recorded_call",
    "render_fork",
]

DEFAULT_MAX_TOKENS: Final = 256
"""Tokens a sample may generate when ``--max-tokens`` is not given and the recorded answer did
not stop at a length limit (one that did names the limit: its own length)."""

PROMPT_TAIL: Final = 48
"""Tokens of the prompt's end that the terminal report shows before the recorded answer."""

_WEIGHTS: Final = "model.safetensors"

Progress = Callable[[str], None]


class ForkError(JobError, ValueError):
    """``grove fork`` cannot sample the call: ``problem`` states the rule, the attempt and call,
    got versus expected, and what to do."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(problem)


@dataclass(frozen=True)
class RecordedCall:
    """A committed call as its blobs hold it (producer: :func:`read_recorded_call`; consumer:
    :func:`fork_call`). ``prompt`` is the exact token prompt the engine was given (the parent
    chain, then the call's prompt delta); ``generated`` and ``logprobs`` are its answer and the
    engine's logprob of each token (equal lengths). ``policy_version`` is the optimizer steps in
    the weights that sampled it (None: not recorded); ``constrained``: decoded under a grammar.
    ``chain`` names the blobs of its tokens, root first, the call itself last; its request had
    ``request_items`` conversation items under render options of ``render_options_digest``."""

    capture_key: str
    call_id: str
    parent_call_id: str | None
    source_capture_key: str | None
    prompt: tuple[int, ...]
    generated: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    policy_version: int | None
    constrained: bool
    chain: tuple[SourceCall, ...]
    request_items: int
    render_options_digest: str


def _called(state: AttemptState, call_id: str) -> CallState:
    """The committed call ``call_id`` of ``state``, or a ``ForkError`` saying what it is."""
    key = state.capture_key
    if state.opened is None:
        raise ForkError(
            f"There is no attempt {key!r} in this ledger (no attempt.opened): check the capture "
            "key (grove lineage lists an attempt's calls) and the --workdir/--database-url."
        )
    call = state.calls.get(call_id)
    if call is None:
        known = ", ".join(list(state.calls)[:20]) or "none"
        raise ForkError(
            f"Attempt {key!r} has no call {call_id!r} (its calls: {known}); pick one of them."
        )
    if call.status is not CallStatus.COMMITTED or call.committed is None:
        reason = f" ({call.failure.reason})" if call.failure is not None else ""
        raise ForkError(
            f"Call {call_id!r} of attempt {key!r} is {call.status.value}{reason}, so it has no "
            "stored answer to sample beside; grove fork samples committed calls only (grove "
            f"lineage {key} shows which are)."
        )
    return call


def _own_link(state: AttemptState, call: CallState) -> SourceCall:
    """``call`` itself as a link of its chain (what a fork's source chain records per call)."""
    committed = call.committed
    assert committed is not None  # _called checked it
    return chain_link(state.capture_key, committed)


def _chain(state: AttemptState, call: CallState) -> tuple[SourceCall, ...]:
    """The calls whose blobs hold ``call``'s tokens, root first, ``call`` last."""
    parent = call.parent_call_id
    if parent is None:
        above: Sequence[SourceCall] = ()
    elif call.intended.source_capture_key is not None:  # continues the fork's source call
        assert state.opened is not None and state.opened.fork_from is not None
        above = state.opened.fork_from.chain
    else:
        above = fork_source(state.capture_key, state, parent).chain
    return (*above, _own_link(state, call))


def _delta(link: SourceCall, blobs: BlobStore) -> CallDelta:
    ref = BlobRef(link.blob_key, link.blob_sha256, link.blob_bytes)
    try:
        return blobs.get_delta(ref)
    except UnusableBlobError as error:
        raise ForkError(
            f"The blob of call {link.call_id!r} of attempt {link.capture_key!r} "
            f"({ref.key}) cannot be read: {error}. Its tokens are gone or damaged, so the "
            "prompt cannot be rebuilt exactly; cleanup after a training step keeps only the "
            "selected calls of published rollouts (docs/storage.md): pick a call whose blobs "
            "remain."
        ) from error


def read_recorded_call(
    store: EventStore, blobs: BlobStore, capture_key: str, call_id: str
) -> RecordedCall:
    """Call ``call_id`` of attempt ``capture_key`` with its exact prompt and answer, read from
    the blobs of its chain (digests verified; a fork's chain continues in its source).
    Raises ``ForkError`` for an unknown attempt or call, a call that is not committed, and a
    missing or corrupt blob."""
    state = AttemptLog(store).load(capture_key)
    call = _called(state, call_id)
    links = _chain(state, call)
    deltas = [_delta(link, blobs) for link in links]
    tokens = torch.cat([part for d in deltas for part in (d.prompt_delta, d.generated)])
    lengths = [(len(d.prompt_delta), len(d.generated)) for d in deltas]
    for link, digest in zip(links, row_chain_digests(tokens, lengths), strict=True):
        if digest != link.chain_digest:
            raise ForkError(
                f"The tokens of call {link.call_id!r} of attempt {link.capture_key!r} do not "
                f"hash to the chain digest its commit recorded ({link.chain_digest[:12]}…, got "
                f"{digest[:12]}…): its chain's blobs are not the ones recorded, so the prompt "
                "cannot be trusted. Restore the blobs from a copy, or pick another call."
            )
    own = deltas[-1]
    committed = call.committed
    assert committed is not None
    ids = tokens.tolist()
    return RecordedCall(
        capture_key=capture_key,
        call_id=call_id,
        parent_call_id=call.parent_call_id,
        source_capture_key=call.intended.source_capture_key,
        prompt=tuple(ids[: len(ids) - len(own.generated)]),
        generated=tuple(own.generated.tolist()),
        logprobs=tuple(own.logprobs.tolist()),
        finish_reason=committed.finish_reason,
        policy_version=committed.policy_version,
        constrained=call.intended.constraint is not None,
        chain=links,
        request_items=call.intended.replay_summary.item_count,
        render_options_digest=call.intended.replay_summary.render_options_digest,
    )


@dataclass(frozen=True)
class ForkModel:
    """The weights ``grove fork`` samples and scores with (producer: :func:`load_fork_model`).
    ``checkpoint`` and ``step`` name the checkpoint loaded (None: the configured model, before
    any training step); ``autocast`` is the sampling precision of ``policy.precision``."""

    loaded: LoadedModel
    checkpoint: Path | None
    step: int | None
    autocast: torch.dtype | None

    def describe(self) -> str:
        """One line naming the model and its weights."""
        if self.checkpoint is None:
            return f"{self.loaded.name}, as configured (no checkpoint)"
        return f"{self.loaded.name}, checkpoint {self.checkpoint} (step {self.step})"


def fork_configuration(
    workspace: Workspace, *, config: Path | None, checkpoint: str, run: str | None
) -> tuple[GroveConfig, Path | None]:
    """The configuration that names the model, and the checkpoint whose weights to load (None:
    the model as configured).

    The configuration is ``config``; else the ``config.json`` beside ``checkpoint`` (the
    trainer writes it there); else that of the workdir's run ``run`` (default: the latest).
    ``checkpoint`` is a checkpoint directory, ``none`` (the model as configured), or ``latest``:
    the run's latest complete checkpoint, the configured model when it has none yet."""
    if checkpoint not in ("latest", "none"):
        path = Path(checkpoint)
        beside = path.parent / CONFIG_FILE
        if config is None and not beside.is_file():
            raise ForkError(
                f"No run configuration at {beside} (the trainer writes one beside its "
                f"checkpoints), so the model of checkpoint {path} is unknown: pass the run's "
                "configuration with --config CONFIG.yaml."
            )
        return load_config(config or beside), path
    if config is not None:
        settings = load_config(config)
    else:
        try:
            settings = load_config(run_path(workspace.workdir, run) / CONFIG_FILE)
        except RunNotFound as error:
            raise ForkError(
                f"{error}. grove fork takes its model from a run: pass --config CONFIG.yaml "
                "(the configuration grove train reads) or --checkpoint CKPT."
            ) from error
    if checkpoint == "none":
        return settings, None
    try:
        found = find_run(workspace, settings, run)
    except RunNotFound:
        if run is not None:
            raise
        return settings, None  # no run yet: the configured model
    return settings, latest_checkpoint(found.checkpoints)


def _load_checkpoint(loaded: LoadedModel, path: Path, origin: str) -> int:
    """Put ``path``'s weights into ``loaded.model``; returns its step. Refuses a checkpoint
    whose tensors are not exactly the model's (names, shapes, dtypes)."""
    metadata = verify_checkpoint(path)
    tensors = load_file(path / _WEIGHTS, device="cpu")
    fit = state_dict_fit(loaded.model, tensors)
    if not fit.same_layout or fit.retyped:
        shapes = [f"{name}: {saved} vs {wanted}" for name, saved, wanted in fit.reshaped]
        raise ForkError(
            f"Checkpoint {path} is not a checkpoint of the model {origin} names "
            f"({loaded.name}): only in the checkpoint {list(fit.unexpected[:5])}, only in the "
            f"model {list(fit.missing[:5])}, checkpoint vs model shape {shapes[:5]}, dtypes "
            f"{list(fit.retyped)}. Pass the configuration of the run that wrote it (--config), "
            "or a checkpoint of this model."
        )
    loaded.model.load_state_dict(tensors, strict=False)  # strict: checked by the fit
    return metadata.step


def load_fork_model(
    config: GroveConfig, checkpoint: Path | None, *, workdir: Path, origin: str
) -> ForkModel:
    """The model ``config`` names, with ``checkpoint``'s weights (None: as configured, warm
    start included, cached under ``workdir`` as grove train caches it), on ``policy.device``.
    ``origin`` names the configuration in errors."""
    loaded = load_model(
        config.model.path,
        dtype=config.model.dtype,
        seed=config.seed,
        # A checkpoint replaces every weight: the warm start would be fitted for nothing.
        warm_start_dir=workdir if config.model.warm_start and checkpoint is None else None,
        architecture=config.model.architecture,
    )
    step = None if checkpoint is None else _load_checkpoint(loaded, checkpoint, origin)
    # transformers types the wrapped ``to`` as taking the model again
    loaded.model.to(resolve_device(config.policy.device))  # type: ignore[arg-type]
    bfloat16 = config.policy.precision == "bfloat16"
    return ForkModel(loaded, checkpoint, step, torch.bfloat16 if bfloat16 else None)


@dataclass(frozen=True)
class Sample:
    """One new generation after the recorded prompt: its seed, tokens, decoded text (special
    tokens kept), finish reason and the engine's logprob of each token; ``attempt`` is the
    capture key of the attempt that records it (None: not recorded)."""

    seed: int
    tokens: tuple[int, ...]
    text: str
    finish_reason: str
    logprobs: tuple[float, ...]
    attempt: str | None = None


class SampleRecorder(Protocol):
    """Records each sample as an attempt of its own (``grove.tools.fork_recording``)."""

    def prepare(self, engine: EmbeddedEngine, sampling: Sequence[SamplingParams]) -> None:
        """Check everything the recording needs, before anything is written or sampled."""
        ...

    def record(self, index: int, sampling: SamplingParams) -> tuple[Generation, str]:
        """Sample ``index`` drawn and recorded: its generation and its attempt's capture key."""
        ...


@dataclass(frozen=True)
class ForkReport:
    """What ``grove fork`` found (producer: :func:`fork_call`; consumers: :func:`render_fork`
    and ``--json``). ``logprobs_now`` aligns with ``call.generated``; ``tmpe`` is None when no
    recorded token has finite logprobs; ``pieces`` is each recorded token decoded alone;
    ``prompt_tail`` the prompt's last ``PROMPT_TAIL`` tokens decoded (for a terminal)."""

    call: RecordedCall
    model: str
    checkpoint: Path | None
    step: int | None
    prompt_tail: str
    text: str
    pieces: tuple[str, ...]
    logprobs_now: tuple[float, ...]
    tmpe: float | None
    sampling: dict[str, Any]
    samples: tuple[Sample, ...]

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` document (docs/fork.md, "Debugging a call: grove fork")."""
        call = self.call
        return {
            "capture_key": call.capture_key,
            "call_id": call.call_id,
            "parent_call_id": call.parent_call_id,
            "source_capture_key": call.source_capture_key,
            "prompt_tokens": len(call.prompt),
            "weights": {
                "model": self.model,
                "checkpoint": None if self.checkpoint is None else str(self.checkpoint),
                "step": self.step,
            },
            "sampling": self.sampling,
            "recorded": {
                "tokens": list(call.generated),
                "text": self.text,
                "finish_reason": call.finish_reason,
                "policy_version": call.policy_version,
                "constrained": call.constrained,
                "logprobs_then": list(call.logprobs),
                "logprobs_now": list(self.logprobs_now),
                "tmpe": self.tmpe,
            },
            "samples": [
                {
                    "seed": s.seed,
                    "tokens": list(s.tokens),
                    "text": s.text,
                    "finish_reason": s.finish_reason,
                    "logprobs": list(s.logprobs),
                    "attempt": s.attempt,
                }
                for s in self.samples
            ],
        }


def _tmpe(then: Sequence[float], now: Sequence[float]) -> float | None:
    """The recorded answer's TMPE: its tokens pooled as one rollout's (docs/metrics.md)."""
    count = len(then)
    value = pooled_logprob_error(
        torch.tensor(then, dtype=torch.float64),
        torch.tensor(now, dtype=torch.float64),
        torch.ones(count, dtype=torch.bool),
        torch.zeros(count, dtype=torch.long),
        1,
    )[0]
    return None if math.isnan(float(value)) else float(value)


def _logprobs_now(
    model: torch.nn.Module, prompt: Sequence[int], answer: Sequence[int]
) -> list[float]:
    """The trainer's logprobs of ``answer`` after ``prompt``, teacher-forced."""
    device = next(model.parameters()).device
    ids = torch.tensor([[*prompt, *answer]], dtype=torch.long, device=device)  # (1, P + G)
    logprobs = recompute_token_logprobs(model, ids, micro_batch_size=1)  # (1, P + G)
    return logprobs[0, len(prompt) :].double().cpu().tolist()


def _max_tokens(call: RecordedCall, given: int | None, context: int) -> int:
    """``given``; else the recorded answer's length when it stopped at the limit (that was the
    limit), else ``DEFAULT_MAX_TOKENS`` — within the model's context either way."""
    if given is not None:
        return given
    wanted = len(call.generated) if call.finish_reason == "length" else DEFAULT_MAX_TOKENS
    return max(1, min(wanted, context - len(call.prompt)))


def _decoded(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[int]) -> str:
    """``tokens`` as text, special tokens kept."""
    return str(tokenizer.decode(list(tokens)))


def fork_call(
    call: RecordedCall,
    model: ForkModel,
    *,
    n: int,
    seed: int,
    temperature: float,
    max_tokens: int | None,
    progress: Progress | None = None,
    recorder: SampleRecorder | None = None,
) -> ForkReport:
    """Score ``call``'s recorded answer under ``model`` and draw ``n`` samples after its prompt
    (module docstring). Sampling settings the engine refuses (a temperature other than 1 on the
    embedded engine, a prompt and limit beyond the context) are refused before any work. With
    a ``recorder``, each sample is drawn and recorded by it."""
    loaded = model.loaded
    tokenizer = loaded.tokenizer
    policy = EmbeddedPolicy(loaded, seed=seed, autocast_dtype=model.autocast)
    limit = _max_tokens(call, max_tokens, context_length(loaded.model))
    sampling = [SamplingParams(limit, temperature, seed=seed + i) for i in range(n)]
    for params in sampling[:1]:
        policy.engine.check(call.prompt, params)
    if recorder is not None:
        recorder.prepare(policy.engine, sampling)
    now = _logprobs_now(loaded.model, call.prompt, call.generated)
    samples = []
    for index, params in enumerate(sampling):
        if progress is not None:
            progress(f"sample {index + 1}/{n} (seed {params.seed})")
        attempt = None
        if recorder is None:
            generation = policy.engine.generate(call.prompt, params)
        else:
            generation, attempt = recorder.record(index, params)
        samples.append(
            Sample(
                seed=seed + index,
                tokens=tuple(generation.token_ids),
                text=_decoded(tokenizer, generation.token_ids),
                finish_reason=generation.finish_reason,
                logprobs=tuple(generation.logprobs),
                attempt=attempt,
            )
        )
    return ForkReport(
        call=call,
        model=loaded.name,
        checkpoint=model.checkpoint,
        step=model.step,
        prompt_tail=_decoded(tokenizer, call.prompt[-PROMPT_TAIL:]),
        text=_decoded(tokenizer, call.generated),
        pieces=tuple(_decoded(tokenizer, [token]) for token in call.generated),
        logprobs_now=tuple(now),
        tmpe=_tmpe(call.logprobs, now),
        sampling={"n": n, "seed": seed, "temperature": temperature, "max_tokens": limit},
        samples=tuple(samples),
    )


def _mean(values: Sequence[float]) -> str:
    return f"{sum(values) / len(values):.4f}" if values else "-"


def render_fork(report: ForkReport, console: Console) -> None:
    """The report for a terminal: the call, the weights, the recorded answer with each token's
    logprob then and now and its TMPE, then each sample."""
    call = report.call
    where = "a root" if call.parent_call_id is None else f"a continuation of {call.parent_call_id}"
    if call.source_capture_key is not None:
        where += f" in {call.source_capture_key}"
    weights = "as configured" if report.checkpoint is None else f"checkpoint {report.checkpoint}"
    version = "unknown" if call.policy_version is None else str(call.policy_version)
    lines = [
        f"call {call.call_id} of attempt {call.capture_key}: {where}, prompt of "
        f"{len(call.prompt)} tokens, sampled at policy version {version}",
        f"now: {report.model}, {weights}"
        + ("" if report.step is None else f" (step {report.step})"),
    ]
    for line in lines:
        console.print(escape(line), highlight=False, soft_wrap=True)
    console.print(
        f"\n[bold]prompt[/] (its last {min(PROMPT_TAIL, len(call.prompt))} tokens):",
        highlight=False,
    )
    console.print(escape("…" + report.prompt_tail), highlight=False, soft_wrap=True)
    tmpe = "-" if report.tmpe is None else f"{report.tmpe:.6f}"
    console.print(
        f"\n[bold]recorded answer[/] ({call.finish_reason}, {len(call.generated)} tokens, "
        f"TMPE now {tmpe}" + (", decoded under a constraint" if call.constrained else "") + "):",
        highlight=False,
        soft_wrap=True,
    )
    console.print(escape(report.text), highlight=False, soft_wrap=True)
    table = Table("#", "token", "text", "logprob then", "logprob now", box=None)
    rows = zip(call.generated, report.pieces, call.logprobs, report.logprobs_now, strict=True)
    for index, (token, piece, then, now) in enumerate(rows):
        table.add_row(str(index), str(token), escape(repr(piece)), f"{then:.5f}", f"{now:.5f}")
    console.print(table)
    for number, sample in enumerate(report.samples, start=1):
        recorded = "" if sample.attempt is None else f", recorded as attempt {sample.attempt}"
        console.print(
            f"\n[bold]sample {number}[/] (seed {sample.seed}, {sample.finish_reason}, "
            f"{len(sample.tokens)} tokens, mean logprob {_mean(sample.logprobs)}{recorded}):",
            highlight=False,
            soft_wrap=True,
        )
        console.print(escape(sample.text), highlight=False, soft_wrap=True)
