"""Whether saved tensors fit a model's state dict: names, shapes and dtypes, tied weights once.

A checkpoint (``training/checkpoint.py``, on resume) and an export (``grove/tools/export.py``)
both load tensors written by ``safetensors.torch.save_model``, which stores a tied weight once,
under one of its names. The tensors fit the model when every name of its state dict is stored or
shares storage with a stored one (a tied weight), no stored name is foreign to the model, and
every stored tensor has its state-dict entry's shape; ``retyped`` lists the dtype pairs that
differ, for the caller that refuses a cast.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = ["StateDictFit", "state_dict_fit"]


@dataclass(frozen=True)
class StateDictFit:
    """How ``tensors`` differ from a model's state dict; every field is sorted and empty when
    they fit. ``reshaped`` holds ``(name, stored shape, model shape)``; ``retyped`` the distinct
    ``(stored dtype, model dtype)`` pairs, as ``str(torch.dtype)``."""

    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    reshaped: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]
    retyped: tuple[tuple[str, str], ...]

    @property
    def same_layout(self) -> bool:
        """Same names (up to tied weights) and shapes; dtypes aside."""
        return not (self.missing or self.unexpected or self.reshaped)


def state_dict_fit(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> StateDictFit:
    """Compare ``tensors`` (a loaded safetensors file) with ``model.state_dict()``."""
    state = model.state_dict()
    stored = {state[name].data_ptr() for name in tensors if name in state}
    shared = [name for name in tensors if name in state]
    return StateDictFit(
        missing=tuple(
            sorted(
                name
                for name in state
                if name not in tensors and state[name].data_ptr() not in stored
            )
        ),
        unexpected=tuple(sorted(name for name in tensors if name not in state)),
        reshaped=tuple(
            sorted(
                (name, tuple(tensors[name].shape), tuple(state[name].shape))
                for name in shared
                if tensors[name].shape != state[name].shape
            )
        ),
        retyped=tuple(
            sorted(
                {
                    (str(tensors[name].dtype), str(state[name].dtype))
                    for name in shared
                    if tensors[name].dtype != state[name].dtype
                }
            )
        ),
    )
