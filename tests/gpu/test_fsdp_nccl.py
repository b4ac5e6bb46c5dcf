"""FSDP2 on NCCL at world size 1: ``build_trainer`` on ``ShardedRanks`` over a
``cpu:gloo,cuda:nccl`` process group trains the model on the GPU to the weights an unsharded
trainer of the same model reaches (``docs/train.md``, "Sharded training with FSDP2")."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from bench.support.learner_workload import bench_model, learner_config, rows_batch
from grove.train.training_run import build_trainer
from grove.training.data_parallel import ShardedRanks
from grove.training.fsdp import full_model_state

TOLERANCE = 1e-5  # float32: FSDP's reduce and the unsharded step sum in another order


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def nccl_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A one-rank default process group: gloo for CPU tensors, NCCL for CUDA ones, as
    ``grove train`` starts it under ``torchrun`` on a GPU machine."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dist.init_process_group(backend="cpu:gloo,cuda:nccl", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp2_on_nccl_trains_to_the_unsharded_weights(nccl_group: None) -> None:
    batch = rows_batch([48, 32, 24, 16])
    config = learner_config(4, {"device": "cuda", "learning_rate": 1e-3})
    sharded = build_trainer(config, bench_model(), ranks=ShardedRanks())
    single = build_trainer(config, bench_model())

    sharded.train_step(batch)
    single.train_step(batch)

    gathered = full_model_state(sharded.model)
    expected = {name: value.cpu() for name, value in single.model.state_dict().items()}
    assert gathered.keys() == expected.keys()
    assert {p.device.type for p in sharded.model.parameters()} == {"cuda"}
    initial = bench_model().state_dict()
    moved = max(float((initial[n] - expected[n]).abs().max()) for n in expected)
    largest = max(float((gathered[n] - expected[n]).abs().max()) for n in expected)
    assert moved > 100 * TOLERANCE  # the step moved the weights far more than the tolerance
    assert largest <= TOLERANCE
