"""Loading the policy model that ``grove train`` updates and the gateway serves (``model.path``).

``model.path`` is either the literal ``embedded`` — the tiny Qwen2-style model and byte-level
tokenizer that ``capture/embedded.py`` builds offline from a seed — or a local Hugging Face model
directory (docs/export.md): ``config.json``, safetensors weights, and a tokenizer with a chat
template and an end-of-sequence token. A directory is checked before its weights are read
(:func:`check_model_directory`, which configuration validation also calls so that a run fails
before anything starts); every refusal names the directory, the rule and what to do.

Nothing is downloaded: transformers is always called with ``local_files_only=True``. Weights
that transformers would silently initialize at random (a tensor missing from the files, or one
of another shape) are refused, since training from them would not be training the named model.
``save_embedded_model`` writes the embedded model as such a directory, so tests and users have a
"real" model directory offline; ``grove export`` (``grove/tools/export.py``) writes a trained
checkpoint the same way.

``model.warm_start`` fits the embedded model briefly before it is used
(``grove/demo/warm_start.py``, cached under the workdir); it starts from the same seeded weights
and applies to the embedded model only, since a directory brings its own trained weights.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import torch
import transformers
from packaging.version import Version
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as transformers_logging

from grove.capture.embedded import EMBEDDED_MODEL_NAME, build_model, build_tokenizer
from grove.capture.embedded_moe import EMBEDDED_MOE_MODEL_NAME, build_moe_model
from grove.capture.embedded_vlm import (
    EMBEDDED_VLM_NAME,
    build_image_processor,
    build_vlm_model,
    build_vlm_tokenizer,
)
from grove.demo.warm_start import warm_start
from grove.errors import JobError

__all__ = [
    "ARCHITECTURES",
    "DTYPES",
    "EMBEDDED",
    "LoadedModel",
    "ModelLoadError",
    "check_model_directory",
    "context_length",
    "load_model",
    "quiet_transformers",
    "save_embedded_model",
]

EMBEDDED: Final = "embedded"
"""The ``model.path`` that names the built-in model; a directory called so is ``./embedded``."""

ARCHITECTURES: Final = ("dense", "moe", "vlm")
"""The ``model.architecture`` values: the embedded models :func:`load_model` builds."""

DTYPES: Final[dict[str, torch.dtype]] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
"""The ``model.dtype`` names and the torch dtypes they load as."""

# transformers 4.56 renamed ``torch_dtype`` to ``dtype`` (the old name still works, with a
# deprecation warning, in 5.x); Grove allows transformers>=4.40.
_DTYPE_KWARG: Final = (
    "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
)
_TOKENIZER_FILES: Final = ("tokenizer.json", "tokenizer_config.json")


class ModelLoadError(JobError, ValueError):
    """A model that cannot be loaded: ``path`` as given, ``problem`` says the rule and the fix."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"Cannot load model {path!r}: {problem}")


@dataclass(frozen=True)
class LoadedModel:
    """A policy model ready to train and serve (producer: :func:`load_model`; consumers: the
    training job, the gateway's embedded engine, ``grove export``).

    ``model`` is a transformers causal LM in eval mode with the requested dtype; ``tokenizer``
    has a chat template and an eos token; ``name`` is the model name the gateway serves
    (``EMBEDDED_MODEL_NAME``, or the directory's name); ``source`` is ``"embedded"`` or the
    resolved directory. ``image_processor`` is the processor of a vision-language model (the
    gateway renders images with it, ``docs/media.md``); None for a text model.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    source: str
    image_processor: object | None = None


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars while loading or saving (commands print their own one-line result)."""
    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


def _torch_dtype(path: str, dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ModelLoadError(
            path, f"model.dtype must be one of {sorted(DTYPES)}, got {dtype!r}; pick one of them."
        )
    return DTYPES[dtype]


def _file_problems(directory: Path) -> list[str]:
    """The problems visible from file names and config.json alone (no tokenizer, no weights)."""
    if not directory.exists():
        return [
            f"directory {directory} does not exist; give model.path as `embedded` or the path "
            "of a local Hugging Face model directory (nothing is downloaded)"
        ]
    if not directory.is_dir():
        return [f"{directory} is a file, not a model directory; give the directory that holds it"]
    problems = []
    config = directory / "config.json"
    if not config.is_file():
        problems.append(
            f"{directory} has no config.json, which every Hugging Face model directory holds; "
            "point model.path at the directory that contains config.json"
        )
    else:
        try:
            with quiet_transformers():
                AutoConfig.from_pretrained(directory, local_files_only=True)
        except Exception as error:  # transformers raises many types; all mean the same here
            problems.append(f"{config} cannot be read by transformers ({error}); repair it")
    if not any(directory.glob("*.safetensors")):
        pickled = sorted(path.name for path in directory.glob("*.bin"))
        hint = (
            f" (found {', '.join(pickled)}: convert them to safetensors, e.g. load the model "
            "and call save_pretrained)"
            if pickled
            else ""
        )
        problems.append(f"{directory} has no weights: expected *.safetensors files, got none{hint}")
    problems.extend(_missing_shards(directory))
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        problems.append(
            f"{directory} has no tokenizer: expected tokenizer.json or tokenizer_config.json; "
            "save the tokenizer into the directory with tokenizer.save_pretrained(DIR)"
        )
    return problems


def _missing_shards(directory: Path) -> list[str]:
    """Shards that a safetensors index names but the directory lacks."""
    problems = []
    for index in sorted(directory.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            problems.append(f"{index} is not a readable safetensors index ({error!r}); repair it")
            continue
        missing = sorted(name for name in shards if not (directory / name).is_file())
        if missing:
            problems.append(
                f"{index.name} names weight files that {directory} lacks: {missing}; copy them "
                "into the directory"
            )
    return problems


def _tokenizer_problems(
    directory: Path,
) -> tuple[list[str], PreTrainedTokenizerBase | None]:
    """Load the directory's tokenizer and check that the gateway can use it."""
    try:
        with quiet_transformers():
            tokenizer = _as_saved(
                directory, AutoTokenizer.from_pretrained(directory, local_files_only=True)
            )
    except Exception as error:  # transformers raises many types; all mean the same here
        return [f"the tokenizer in {directory} cannot be loaded by transformers ({error})"], None
    problems = []
    if not tokenizer.chat_template:
        problems.append(
            f"the tokenizer in {directory} has no chat template, which the gateway needs to "
            "render conversations; add chat_template.jinja (or a chat_template entry in "
            "tokenizer_config.json)"
        )
    if tokenizer.eos_token is None:
        problems.append(
            f"the tokenizer in {directory} has no eos token, at which generation stops; set "
            "eos_token in tokenizer_config.json to the end-of-turn token"
        )
    return problems, tokenizer


def _pipeline(tokenizer: object) -> dict[str, object] | None:
    """The parts of a fast tokenizer's pipeline that decide which ids a text becomes."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    return _pipeline_of(json.loads(backend.to_str()))


def _pipeline_of(serialized: dict[str, object]) -> dict[str, object]:
    return {key: serialized.get(key) for key in ("normalizer", "pre_tokenizer", "model")}


def _as_saved(directory: Path, tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """``tokenizer``, or the directory's tokenizer.json loaded as it is where the class that
    AutoTokenizer picked rebuilt another pipeline.

    transformers 5 loads every ``qwen2`` directory with ``Qwen2Tokenizer``, which replaces the
    saved normalizer and pre-tokenizer with Qwen2's own; the embedded tokenizer pre-tokenizes as
    GPT-2 does, so its saved directory would turn the same text into other ids. tokenizer.json is
    what the model was trained with, so it wins (docs/export.md, "Tokenizer").
    """
    saved = directory / "tokenizer.json"
    loaded = _pipeline(tokenizer)
    if loaded is None or not saved.is_file():
        return tokenizer
    try:
        expected = _pipeline_of(json.loads(saved.read_text()))
    except (OSError, ValueError, AttributeError):
        return tokenizer  # AutoTokenizer read it; a file it tolerates is not this check's concern
    if loaded == expected:
        return tokenizer
    return PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True)


def _inspect(directory: Path) -> tuple[list[str], PreTrainedTokenizerBase | None]:
    problems = _file_problems(directory)
    if not directory.is_dir() or not any((directory / n).is_file() for n in _TOKENIZER_FILES):
        return problems, None
    tokenizer_problems, tokenizer = _tokenizer_problems(directory)
    return problems + tokenizer_problems, tokenizer


def _directory(path: str) -> Path:
    return Path(path).expanduser().resolve()


def check_model_directory(path: str) -> list[str]:
    """The problems that stop ``path`` loading as a model directory, one sentence each (empty if
    none); reads config.json and the tokenizer but not the weights. ``embedded`` has none."""
    if path == EMBEDDED:
        return []
    return _inspect(_directory(path))[0]


def context_length(model: PreTrainedModel) -> int:
    """The longest sequence ``model`` takes: its config's ``max_position_embeddings``, or its
    text config's (a vision-language model keeps it there)."""
    config = model.config
    length = getattr(config, "max_position_embeddings", None)
    if length is None:
        length = config.get_text_config().max_position_embeddings
    return int(length)


def _load_embedded(
    dtype: torch.dtype, seed: int, warm_start_dir: Path | None, architecture: str = "dense"
) -> LoadedModel:
    if architecture == "vlm":
        if warm_start_dir is not None:
            raise ModelLoadError(
                EMBEDDED,
                "model.warm_start fits the text models only (its corpus has no images): "
                "remove model.warm_start, or set model.architecture: dense",
            )
        vlm_tokenizer = build_vlm_tokenizer()
        # transformers types the wrapped ``to`` as taking the model again
        vlm = build_vlm_model(vlm_tokenizer, seed=seed).to(dtype).eval()  # type: ignore[arg-type]
        return LoadedModel(
            model=vlm,
            tokenizer=vlm_tokenizer,
            name=EMBEDDED_VLM_NAME,
            source=EMBEDDED,
            image_processor=build_image_processor(),
        )
    tokenizer = build_tokenizer()
    model: PreTrainedModel
    if architecture == "moe":
        model = build_moe_model(tokenizer, seed=seed)
        name = EMBEDDED_MOE_MODEL_NAME
    else:
        model, name = build_model(tokenizer, seed=seed), EMBEDDED_MODEL_NAME
    if warm_start_dir is not None:
        warm_start(model, tokenizer, warm_start_dir, base_seed=seed)
    model = model.to(dtype).eval()  # type: ignore[arg-type]  # as above
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=EMBEDDED)


def load_model(
    path: str,
    *,
    dtype: str = "float32",
    seed: int = 0,
    warm_start_dir: Path | None = None,
    architecture: str = "dense",
) -> LoadedModel:
    """The model that ``model.path`` names, with parameters in ``dtype``, in eval mode.

    ``embedded`` builds the embedded model of ``architecture`` (``model.architecture``: ``dense``,
    ``moe`` (``docs/moe.md``) or ``vlm``, the vision-language model of ``docs/media.md``) from
    ``seed``, warm-started (``model.warm_start``) when
    ``warm_start_dir`` names the directory that caches the fit (the workdir); otherwise ``path``
    is a local Hugging Face directory, checked first by :func:`check_model_directory`, and a warm
    start is refused. Raises ``ModelLoadError`` (every problem listed) rather than load a model
    with missing or misshapen weights.
    """
    torch_dtype = _torch_dtype(path, dtype)
    if architecture not in ARCHITECTURES:
        raise ModelLoadError(
            path,
            f"model.architecture must be one of {', '.join(ARCHITECTURES)}, got "
            f"{architecture!r}; pick one",
        )
    if path == EMBEDDED:
        return _load_embedded(torch_dtype, seed, warm_start_dir, architecture)
    if architecture != "dense":
        raise ModelLoadError(
            path,
            f"model.architecture: {architecture} builds the embedded model only; a model "
            "directory's config.json names its architecture: remove model.architecture",
        )
    if warm_start_dir is not None:
        raise ModelLoadError(
            path,
            "model.warm_start fits the embedded model only, and a model directory brings its "
            "own trained weights: remove model.warm_start, or set model.path: embedded",
        )
    directory = _directory(path)
    problems, tokenizer = _inspect(directory)
    if problems or tokenizer is None:
        raise ModelLoadError(path, "; ".join(problems))
    try:
        with quiet_transformers():
            # output_loading_info=True: the model and its loading info, typed as the model
            model, info = cast(
                "tuple[PreTrainedModel, dict[str, Any]]",
                AutoModelForCausalLM.from_pretrained(
                    directory,
                    local_files_only=True,
                    output_loading_info=True,
                    **{_DTYPE_KWARG: torch_dtype},
                ),
            )
    except Exception as error:  # transformers raises many types; all mean the same here
        raise ModelLoadError(
            path,
            f"transformers cannot load a causal LM from {directory} ({type(error).__name__}: "
            f"{error}); check that config.json names a causal-LM architecture this transformers "
            f"({transformers.__version__}) supports and that the weights match it",
        ) from error
    missing = sorted(info.get("missing_keys", ()))
    mismatched = sorted(str(key) for key in info.get("mismatched_keys", ()))
    if missing or mismatched:
        raise ModelLoadError(
            path,
            f"the weights in {directory} do not cover the model that config.json describes "
            f"(missing: {missing[:10]}, other shape: {mismatched[:10]}); transformers would "
            "initialize those at random. Use weights saved from this architecture",
        )
    name = directory.name or str(getattr(model.config, "_name_or_path", "")) or str(directory)
    return LoadedModel(model=model.eval(), tokenizer=tokenizer, name=name, source=str(directory))


def save_embedded_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Write the embedded model built from ``seed`` and its tokenizer (chat template included)
    as a Hugging Face directory at ``out_dir`` (safetensors weights); returns ``out_dir``."""
    loaded = _load_embedded(torch.float32, seed, None)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        loaded.model.save_pretrained(out_dir)
        loaded.tokenizer.save_pretrained(out_dir)
    return out_dir
