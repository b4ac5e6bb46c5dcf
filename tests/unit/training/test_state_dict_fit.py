"""``state_dict_fit``: saved tensors against a model's state dict, tied weights stored once."""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_model

from grove.training.state_dict_fit import StateDictFit, state_dict_fit


class Tied(torch.nn.Module):
    """An embedding and an output head sharing one weight, as tied language models do."""

    def __init__(self, vocab: int = 5, hidden: int = 3) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight


def saved(model: torch.nn.Module, tmp_path) -> dict[str, torch.Tensor]:
    """The model as ``save_model`` writes it (a tied weight under one name) and reads back."""
    path = tmp_path / "model.safetensors"
    save_model(model, str(path))
    return load_file(str(path))


def test_a_tied_weight_stored_under_one_name_fits(tmp_path) -> None:
    model = Tied()
    tensors = saved(model, tmp_path)

    assert len(tensors) == 1  # save_model kept one of the two names
    assert state_dict_fit(model, tensors) == StateDictFit((), (), (), ())


def test_names_the_model_lacks_and_the_file_lacks(tmp_path) -> None:
    tensors = {"embed.weight": torch.zeros(5, 3), "extra.bias": torch.zeros(2)}
    untied = torch.nn.ModuleDict({"embed": torch.nn.Embedding(5, 3), "norm": torch.nn.LayerNorm(3)})

    fit = state_dict_fit(untied, tensors)

    assert (fit.unexpected, fit.missing) == (("extra.bias",), ("norm.bias", "norm.weight"))
    assert not fit.same_layout


def test_a_tensor_of_another_shape_is_named_with_both_shapes(tmp_path) -> None:
    fit = state_dict_fit(Tied(), {"embed.weight": torch.zeros(6, 3)})

    assert fit.reshaped == (("embed.weight", (6, 3), (5, 3)),)
    assert not fit.same_layout


def test_another_dtype_keeps_the_layout_and_names_the_pair(tmp_path) -> None:
    fit = state_dict_fit(Tied(), {"embed.weight": torch.zeros(5, 3, dtype=torch.bfloat16)})

    assert fit.same_layout
    assert fit.retyped == (("torch.bfloat16", "torch.float32"),)
