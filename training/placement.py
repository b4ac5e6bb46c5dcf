"""Where the learner runs and in what precision (``policy.device``, ``policy.precision``).

A ``Placement`` names a torch device and a compute precision. The model and its optimizer state
live on the device; each step's rows are moved there before they train (``move_batch``); the
forward runs inside ``Placement.autocast()``:

- ``float32``: no autocast, every operation in float32.
- ``bfloat16``: ``torch.autocast(device.type, dtype=torch.bfloat16)``. The parameters stay float32
  (the master weights, which AdamW updates, and its moments with them); autocast casts them to
  bfloat16 per matrix multiply. The logits come out in bfloat16 and ``causal_token_logprobs``
  upcasts them to float32 before the log-softmax, so logprobs, the loss, TMPE and generation KL
  are float32 arithmetic on bfloat16 logits (``docs/train.md``, "Devices, precision and
  activation checkpointing").

Autocast in bfloat16 runs on the CPU too, so the precision is tested where CUDA is absent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Final

import torch

from grove.training.errors import TrainingError

if TYPE_CHECKING:
    from grove.training.trainer import StepBatch

__all__ = ["CPU_FLOAT32", "PRECISIONS", "DeviceUnavailable", "Placement", "resolve_device"]

PRECISIONS: Final[dict[str, torch.dtype]] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""The ``policy.precision`` names and the compute dtype each runs the forward in."""


class DeviceUnavailable(TrainingError):
    """``policy.device`` names a device this machine does not have (``device`` as given)."""

    def __init__(self, device: str, message: str) -> None:
        self.device = device
        super().__init__("device_unavailable", message)


def resolve_device(name: str) -> torch.device:
    """The torch device ``policy.device`` names: ``auto`` is ``cuda`` when CUDA is available,
    else ``cpu``. Under ``torchrun`` (``LOCAL_RANK`` set) ``cuda`` is the rank's own GPU,
    ``cuda:LOCAL_RANK`` modulo the GPUs visible. Raises ``DeviceUnavailable`` for ``cuda``
    without CUDA, and for a name that is none of the three."""
    if name not in ("auto", "cpu", "cuda"):
        raise DeviceUnavailable(name, f"policy.device must be auto, cpu or cuda, got {name!r}")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceUnavailable(
            name,
            "policy.device: cuda, but torch sees no CUDA device on this machine "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False): run on a machine "
            "with a GPU and a CUDA build of torch, or set policy.device: cpu (or auto)",
        )
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is not None and local_rank.isdigit():
        return torch.device("cuda", int(local_rank) % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


@dataclass(frozen=True)
class Placement:
    """A device and a compute precision (``PRECISIONS``) for the learner's forward passes."""

    device: torch.device
    precision: str = "float32"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise TrainingError(
                "precision",
                f"policy.precision must be one of {sorted(PRECISIONS)}, got {self.precision!r}",
            )

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the forward's matrix multiplies run in."""
        return PRECISIONS[self.precision]

    @contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward's precision: bfloat16 autocast on the device, or nothing for float32."""
        if self.precision == "float32":
            yield
            return
        with torch.autocast(self.device.type, dtype=self.compute_dtype):
            yield

    def move_batch(self, batch: StepBatch) -> StepBatch:
        """``batch`` with every tensor on the device (the same object when already there)."""
        moved: dict[str, Any] = {
            field.name: value.to(self.device)
            for field in fields(batch)
            if isinstance(value := getattr(batch, field.name), torch.Tensor)
            and value.device != self.device
        }
        return replace(batch, **moved) if moved else batch


CPU_FLOAT32: Final = Placement(torch.device("cpu"))
"""The trainer's placement unless told otherwise: the CPU, float32."""
