"""The engine a training run samples from, and how each optimizer step's weights reach it.

``open_policy_engine`` gives the gateway its engine for the run's model (``engine.kind``,
``docs/engines.md``). After every optimizer step the run calls ``publish(step)``: the next
rollouts must sample the new weights, so ``publish`` returns only once they are served.

- **embedded**: the engine samples in the training process from the trainer's own parameters, so
  the weights are already there and publishing only advances the policy version.
- **vllm**: a vLLM server, launched by Grove (``engine.vllm_launch``, :mod:`grove.engines.
  vllm_process`) or running at ``engine.vllm_url``. Each publish writes the trainer's weights as
  a Hugging Face directory (:func:`write_serving_directory`) under the weights directory, has
  the server reload them in place (:meth:`grove.capture.vllm.VllmEngine.reload_weights`: vLLM's
  ``reload_weights`` through its development endpoint ``/collective_rpc``) while the gateway's
  generations are held off, records the step as the server's weight version, and then checks
  that the server samples the trainer's distribution: one seeded probe generation whose
  logprobs must equal the trainer's, teacher-forced, within ``PROBE_TOLERANCE`` of the dtype.
  Only the newest step's directory is kept.

The directory unties the input embedding from the output layer (``tie_word_embeddings: false``,
``lm_head.weight`` written out): vLLM's CPU backend packs the output layer's matrix when it loads
a model, and a reload of a tied model refreshes the embedding but leaves that packed copy stale,
so the server would sample from the old output layer. A server at ``engine.vllm_url`` started
on a tied model is refused for that reason.

``open_serving_engine`` is the same choice for ``grove serve``: fixed weights, nothing to publish.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Final, Protocol

import torch
from safetensors.torch import save_file

from grove.capture.embedded import EmbeddedEngine
from grove.capture.embedded_vlm import EmbeddedVLMEngine, vision_token_ids
from grove.capture.engine import Engine, SamplingParams
from grove.capture.vllm import VllmEngine
from grove.config import GroveConfig
from grove.engines.models import LoadedModel, context_length, load_model, quiet_transformers
from grove.engines.vllm_process import VllmProcess
from grove.errors import JobError

__all__ = [
    "PROBE_TOLERANCE",
    "EmbeddedPolicy",
    "PolicyEngine",
    "VllmPolicy",
    "VllmWeightsError",
    "open_policy_engine",
    "open_serving_engine",
    "write_serving_directory",
]

PROBE_TOLERANCE: Final[dict[torch.dtype, float]] = {
    torch.float32: 1e-3,
    torch.float64: 1e-3,
    torch.bfloat16: 0.1,
    torch.float16: 0.05,
}
"""Largest |server - trainer| logprob a probe token may show after a publish, by parameter dtype.
vLLM's float32 kernels agree with transformers to about 1e-6 (``tests/vllm``); a server that kept
the old weights, or half of them, is off by far more once training has moved them."""

REQUEST_TIMEOUT_S: Final = 600.0
"""Bound of each exchange with the vLLM server: a generation, or a reload of the weights."""

_PROBE_TOKENS: Final = 8
_PROBE_MESSAGES: Final = [{"role": "user", "content": "Say something about the weather."}]
_WEIGHTS: Final = "model.safetensors"
_LOG: Final = "vllm.log"


class PolicyEngine(Protocol):
    """An engine serving the run's policy: ``engine`` for the gateway, ``policy_version`` the
    optimizer steps its weights include, ``context_length`` its longest sequence."""

    policy_version: int

    @property
    def engine(self) -> Engine:
        """What the gateway generates with (read-only here, so each policy names its own kind)."""
        ...

    @property
    def context_length(self) -> int:
        """Prompt and generation together, at most."""
        ...

    def publish(self, step: int) -> None:
        """Serve the weights of optimizer step ``step`` before the next rollout starts."""
        ...

    def updating(self) -> AbstractContextManager[None]:
        """A block in which the trainer changes its weights and publishes them: no generation
        samples from weights that are changing (an engine that samples the trainer's own
        parameters holds generations off for the whole block)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (processes, connections)."""
        ...


class VllmWeightsError(JobError):
    """Weights that could not be put on, or were not found on, the vLLM server; ``problem`` says
    what was seen and what to do."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(problem)


class EmbeddedPolicy:
    """In-process sampling on the trainer's own parameters (``capture/embedded.py``; a
    vision-language model samples with its images, ``capture/embedded_vlm.py``).

    The parameters are the trainer's, so the engine samples on the trainer's device
    (``policy.device``); ``autocast_dtype`` (``torch.bfloat16`` under ``policy.precision:
    bfloat16``) runs its forward in the trainer's precision, so it samples the distribution the
    learner trains (``docs/train.md``, "Devices, precision and activation checkpointing")."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        seed: int,
        policy_version: int = 0,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        tokenizer = loaded.tokenizer
        self.engine: EmbeddedEngine
        if loaded.image_processor is not None:
            self.engine = EmbeddedVLMEngine(
                loaded.model,  # type: ignore[arg-type]
                stop_token_ids=[tokenizer.eos_token_id],
                excluded_token_ids=list(vision_token_ids(tokenizer).values()),  # type: ignore[arg-type]
                seed=seed,
                policy_version=policy_version,
                tokenizer=tokenizer,  # type: ignore[arg-type]
            )
        else:
            self.engine = EmbeddedEngine(
                loaded.model,
                stop_token_ids=[tokenizer.eos_token_id],
                seed=seed,
                policy_version=policy_version,
                tokenizer=tokenizer,
                autocast_dtype=autocast_dtype,
            )
        self.policy_version = policy_version
        self._context = context_length(loaded.model)

    @property
    def context_length(self) -> int:
        """The model's position embeddings."""
        return self._context

    def publish(self, step: int) -> None:
        """The engine already samples the trainer's parameters: only the version advances,
        between generations, so each generation reports the version of its weights."""
        with self.engine.updating():
            self.engine.policy_version = step
            self.policy_version = step

    @contextmanager
    def updating(self) -> Iterator[None]:
        """The engine's own: no generation runs while the trainer changes the parameters."""
        with self.engine.updating():
            yield

    def close(self) -> None:
        """Nothing to release."""


def write_serving_directory(loaded: LoadedModel, directory: Path) -> Path:
    """Write ``loaded``'s current weights, config, generation config and tokenizer as a Hugging
    Face directory that vLLM loads and reloads: one ``model.safetensors`` holding every tensor
    of the state dict (a tensor shared by two names, such as a tied output layer, is written
    under both), and ``tie_word_embeddings: false``. Written beside ``directory`` and renamed
    into place when complete; an existing ``directory`` is replaced. Returns ``directory``."""
    model, tokenizer = loaded.model, loaded.tokenizer
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        save_file(_untied_tensors(model), staging / _WEIGHTS, metadata={"format": "pt"})
        config = copy.deepcopy(model.config)
        config.tie_word_embeddings = False
        if not getattr(config, "architectures", None):
            config.architectures = [type(model).__name__]
        generation = copy.deepcopy(getattr(model, "generation_config", None))
        with quiet_transformers():
            config.save_pretrained(staging)
            if generation is not None:
                if generation.eos_token_id is None:
                    generation.eos_token_id = tokenizer.eos_token_id
                generation.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _untied_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict as CPU tensors, each name with storage of its own (safetensors refuses
    shared storage; a second name of a shared tensor gets a copy)."""
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach()
        pointer = tensor.untyped_storage().data_ptr()
        copy_needed = pointer in seen or not tensor.is_contiguous() or tensor.device.type != "cpu"
        seen.add(pointer)
        tensors[name] = tensor.to("cpu").contiguous().clone() if copy_needed else tensor
    return tensors


class _Publisher:
    """Writes step directories under ``root`` and puts them on a server (module docstring)."""

    def __init__(self, loaded: LoadedModel, root: Path, *, temporary: bool) -> None:
        self.loaded = loaded
        self.root = root
        self.temporary = temporary
        self.current: Path | None = None
        self.seconds: float | None = None
        self._probe_prompt: list[int] | None = None

    def write(self, step: int) -> Path:
        """The trainer's weights of ``step`` as ``root/step-NNNNNN``."""
        return write_serving_directory(self.loaded, self.root / f"step-{step:06d}")

    def publish(self, engine: VllmEngine, step: int) -> None:
        """Write, reload on the server (generations held off), version, verify, drop the old."""
        started = time.monotonic()
        directory = self.write(step)
        with engine.updating():
            try:
                engine.reload_weights(str(directory), timeout_s=REQUEST_TIMEOUT_S)
            except JobError:
                raise
            except Exception as error:
                raise VllmWeightsError(
                    f"The vLLM server at {engine.base_url} did not reload the weights of step "
                    f"{step} from {directory}: {error}. The server must run with "
                    "VLLM_SERVER_DEV_MODE=1 and be able to read that directory (set "
                    "engine.vllm_weights_dir to a path it shares with Grove)."
                ) from error
            engine.policy_version = step
            engine.set_weight_version(str(step))
        self.verify(engine, step, directory)
        self._keep_only(directory)
        self.seconds = time.monotonic() - started

    def verify(self, engine: VllmEngine, step: int, directory: Path) -> None:
        """A seeded probe generation's logprobs equal the trainer's within the tolerance."""
        model = self.loaded.model
        prompt = self._prompt()
        generation = engine.generate(prompt, SamplingParams(max_tokens=_PROBE_TOKENS, seed=step))
        reference = _teacher_forced_logprobs(model, prompt, list(generation.token_ids))
        error = max(abs(a - b) for a, b in zip(generation.logprobs, reference, strict=True))
        dtype = next(model.parameters()).dtype
        tolerance = PROBE_TOLERANCE.get(dtype, 0.1)
        if not error <= tolerance:
            raise VllmWeightsError(
                f"After publishing step {step} ({directory}), the vLLM server at "
                f"{engine.base_url} does not sample the trainer's weights: a probe token's "
                f"logprob differs by {error:.3g} (at most {tolerance:g} for {dtype}). The server "
                "must serve the run's model, untied (tie_word_embeddings: false), in the run's "
                "dtype; see docs/engines.md."
            )

    def _prompt(self) -> list[int]:
        if self._probe_prompt is None:
            tokenizer = self.loaded.tokenizer
            text = tokenizer.apply_chat_template(
                _PROBE_MESSAGES, tokenize=False, add_generation_prompt=True
            )
            self._probe_prompt = list(tokenizer.encode(str(text), add_special_tokens=False))
        return self._probe_prompt

    def _keep_only(self, directory: Path) -> None:
        previous, self.current = self.current, directory
        if previous is not None and previous != directory:
            shutil.rmtree(previous, ignore_errors=True)

    def cleanup(self, *, keep_log: bool = False) -> None:
        """Remove the step directories; a temporary root goes too unless its log is kept."""
        if self.temporary and not keep_log:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        for child in self.root.glob("step-*"):
            shutil.rmtree(child, ignore_errors=True)


@torch.no_grad()
def _teacher_forced_logprobs(
    model: torch.nn.Module, prompt: list[int], generated: list[int]
) -> list[float]:
    """Log-softmax of ``model``'s logits at each generated token (eval mode for the pass)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        ids = torch.tensor([prompt + generated], device=device)  # (1, P + G)
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (G, V)
    finally:
        model.train(was_training)
    steps = torch.log_softmax(logits, dim=-1)  # (G, V)
    return [float(steps[i, token]) for i, token in enumerate(generated)]


class VllmPolicy:
    """Sampling on a vLLM server (module docstring). ``server`` is the process Grove launched,
    None for a server at a URL; without a publisher (``grove serve``) the weights are fixed."""

    def __init__(
        self,
        engine: VllmEngine,
        *,
        server: VllmProcess | None,
        publisher: _Publisher | None,
        policy_version: int,
    ) -> None:
        self.engine = engine
        self.server = server
        self.policy_version = policy_version
        self.engine.policy_version = policy_version
        self._publisher = publisher

    @property
    def context_length(self) -> int:
        """The server's ``max_model_len``."""
        return self.engine.context_length()

    @property
    def weights_dir(self) -> Path | None:
        """The directory the served weights were last written to (None: not published)."""
        return None if self._publisher is None else self._publisher.current

    @property
    def publish_seconds(self) -> float | None:
        """Seconds the last :meth:`publish` took: write, reload, verify."""
        return None if self._publisher is None else self._publisher.seconds

    def publish(self, step: int) -> None:
        """Write the trainer's weights, have the server reload them, verify; raises
        :class:`VllmWeightsError` when the server does not serve them afterwards."""
        if self._publisher is None:
            raise VllmWeightsError(
                "this vLLM engine serves fixed weights (grove serve): nothing publishes to it"
            )
        self._publisher.publish(self.engine, step)
        self.policy_version = step

    def updating(self) -> AbstractContextManager[None]:
        """Nothing to hold: the server samples its own copy of the weights, which changes only
        in :meth:`publish` (generations held off there, then the probe runs)."""
        return nullcontext()

    def close(self) -> None:
        """Close the client, stop a launched server, remove the weights written for it."""
        self.engine.close()
        if self.server is not None:
            self.server.stop()
        if self._publisher is not None:
            self._publisher.cleanup()


def open_policy_engine(config: GroveConfig, loaded: LoadedModel, *, step: int) -> PolicyEngine:
    """The engine of the run's configuration, serving the weights of optimizer step ``step``."""
    if config.engine.kind == "vllm":
        return _open_vllm_policy(config, loaded, step)
    bfloat16 = config.policy.precision == "bfloat16"
    return EmbeddedPolicy(
        loaded,
        seed=config.seed,
        policy_version=step,
        autocast_dtype=torch.bfloat16 if bfloat16 else None,
    )


def _python(configured: str | None) -> str:
    """``engine.vllm_python`` as an executable path (None: this python; a bare name: PATH)."""
    if configured is None:
        return sys.executable
    if "/" in configured:
        return configured
    found = shutil.which(configured)
    if found is None:
        raise JobError(
            f"engine.vllm_python {configured!r} is not on PATH; give the path of a python "
            "that has vLLM"
        )
    return found


def _open_vllm_policy(config: GroveConfig, loaded: LoadedModel, step: int) -> VllmPolicy:
    settings = config.engine
    if settings.vllm_weights_dir is None:
        root, temporary = Path(tempfile.mkdtemp(prefix="grove-vllm-")), True
    else:
        root, temporary = Path(settings.vllm_weights_dir), False
        root.mkdir(parents=True, exist_ok=True)
    publisher = _Publisher(loaded, root, temporary=temporary)
    server: VllmProcess | None = None
    engine: VllmEngine | None = None
    try:
        if settings.vllm_launch:
            directory = publisher.write(step)
            context = min(
                context_length(loaded.model),
                config.policy.max_total_sequence_length,
            )
            server = VllmProcess(
                python=_python(settings.vllm_python),
                model_dir=directory,
                served_model_name=loaded.name,
                dtype=config.model.dtype,
                max_model_len=context,
                seed=config.seed,
                args=settings.vllm_args,
                log=root / _LOG,
            ).start(settings.vllm_start_timeout_s)
            engine = VllmEngine(server.base_url, loaded.name, timeout_s=REQUEST_TIMEOUT_S)
            engine.policy_version = step
            engine.set_weight_version(str(step))
            publisher.verify(engine, step, directory)
            publisher.current = directory
        elif settings.vllm_url is not None:
            engine = _connect(settings.vllm_url, loaded, reloads=True)
            publisher.publish(engine, step)
        else:
            raise JobError(
                "engine.kind: vllm needs a server: set engine.vllm_launch: true or engine.vllm_url"
            )
    except BaseException:
        if engine is not None:
            engine.close()
        if server is not None:
            server.stop()
        publisher.cleanup(keep_log=server is not None)
        raise
    return VllmPolicy(engine, server=server, publisher=publisher, policy_version=step)


def _connect(url: str, loaded: LoadedModel, *, reloads: bool) -> VllmEngine:
    """A client of the server at ``url``, on the model it serves; one that ``reloads`` weights
    must not have been started on a tied model."""
    probe = VllmEngine(url, loaded.name, timeout_s=REQUEST_TIMEOUT_S)
    try:
        cards = probe.model_cards()
    finally:
        probe.close()
    names = [str(card.get("id")) for card in cards]
    if loaded.name in names:
        card = cards[names.index(loaded.name)]
    elif len(cards) == 1:
        card = cards[0]
    else:
        raise JobError(
            f"The vLLM server at {url} serves {names}, none of them named {loaded.name!r}: "
            "serve the run's model alone, or under that name (--served-model-name)"
        )
    if reloads:
        _refuse_tied(url, card)
    return VllmEngine(url, str(card.get("id")), timeout_s=REQUEST_TIMEOUT_S)


def _refuse_tied(url: str, card: dict[str, object]) -> None:
    """A server started on a directory whose config ties the output layer to the embedding
    cannot take new weights correctly on vLLM's CPU backend (module docstring)."""
    root = card.get("root")
    config = Path(str(root)) / "config.json" if isinstance(root, str) else None
    if config is None or not config.is_file():
        return  # not a local directory: the probe after each publish still checks
    try:
        tied = bool(json.loads(config.read_text()).get("tie_word_embeddings", False))
    except (OSError, ValueError, AttributeError):
        return
    if tied:
        raise JobError(
            f"The vLLM server at {url} was started on {root}, whose config.json ties the "
            "output layer to the input embedding (tie_word_embeddings: true); vLLM's CPU "
            "backend keeps a packed copy of that layer that a weight reload leaves stale. "
            "Restart the server on an untied copy (write one with grove.engines.policy."
            "write_serving_directory), or let Grove launch it (engine.vllm_launch: true)."
        )


def open_serving_engine(
    kind: str,
    model_path: str,
    *,
    vllm_url: str | None = None,
    vllm_launch: bool = False,
    vllm_python: str | None = None,
    vllm_args: tuple[str, ...] = (),
    dtype: str = "float32",
    start_timeout_s: float = 600.0,
    log_dir: Path | None = None,
    architecture: str = "dense",
) -> tuple[PolicyEngine, LoadedModel]:
    """The engine ``grove serve`` puts behind the gateway, and the model it serves: embedded (in
    process; ``architecture`` picks the embedded model, as ``model.architecture`` does), or vLLM
    launched on ``model_path`` itself or running at ``vllm_url`` (fixed weights: nothing is
    written). Close the engine when done."""
    if kind == "embedded":
        loaded = load_model(model_path, dtype=dtype, architecture=architecture)
        return EmbeddedPolicy(loaded, seed=0), loaded
    if kind != "vllm":
        raise JobError(f"--engine must be embedded or vllm, got {kind!r}")
    if architecture != "dense":
        raise JobError(
            f"--architecture {architecture} builds an embedded model, which vLLM does not "
            "serve: use --engine embedded (docs/media.md, docs/moe.md)"
        )
    if model_path == "embedded":
        raise JobError(
            "--engine vllm needs --model DIR, the Hugging Face directory the server serves "
            "(Grove reads its tokenizer); vLLM does not serve the built-in embedded model"
        )
    if (vllm_url is None) == (not vllm_launch):
        raise JobError("--engine vllm needs exactly one of --vllm-url URL and --vllm-launch")
    loaded = load_model(model_path, dtype=dtype)
    if vllm_url is not None:
        engine = _connect(vllm_url, loaded, reloads=False)
        return VllmPolicy(engine, server=None, publisher=None, policy_version=0), loaded
    log = (log_dir or Path(tempfile.mkdtemp(prefix="grove-serve-vllm-"))) / _LOG
    server = VllmProcess(
        python=_python(vllm_python),
        model_dir=Path(loaded.source),
        served_model_name=loaded.name,
        dtype=dtype,
        max_model_len=context_length(loaded.model),
        seed=0,
        args=vllm_args,
        log=log,
    ).start(start_timeout_s)
    engine = VllmEngine(server.base_url, loaded.name, timeout_s=REQUEST_TIMEOUT_S)
    return VllmPolicy(engine, server=server, publisher=None, policy_version=0), loaded
