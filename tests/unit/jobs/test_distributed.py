"""How ``grove train`` takes its data-parallel ranks from ``torchrun``
(``grove/train/distributed.py``); ranks training together are tested end to end in
``tests/e2e/test_data_parallel.py``."""

from __future__ import annotations

import pytest

from grove.config import load_config
from grove.train.distributed import DataParallelMismatch, data_parallel_ranks, is_main_rank
from grove.training.row_sharding import SingleProcess


def test_a_torchrun_world_size_other_than_the_data_parallel_size_is_refused() -> None:
    config = load_config({"policy": {"data_parallel_size": 1}})
    environ = {"WORLD_SIZE": "2", "RANK": "0"}

    with (
        pytest.raises(
            DataParallelMismatch,
            match=r"torchrun started 2 ranks \(WORLD_SIZE=2\), but policy.data_parallel_size is 1: "
            r".*Set policy.data_parallel_size: 2, or launch torchrun --nproc-per-node 1",
        ) as caught,
        data_parallel_ranks(config, environ),
    ):
        pass
    assert (caught.value.world_size, caught.value.data_parallel_size) == (2, 1)


def test_without_torchrun_one_process_trains_every_ranks_shard() -> None:
    config = load_config({"policy": {"data_parallel_size": 2, "train_micro_batch_size": 1}})

    with data_parallel_ranks(config, {}) as ranks:
        assert isinstance(ranks, SingleProcess)
        assert (ranks.rank, ranks.world_size, ranks.shards) == (0, 1, 2)
        assert ranks.own_shards(4) == (range(0, 2), range(2, 4))


def test_only_rank_zero_or_a_process_outside_torchrun_is_the_main_rank() -> None:
    assert is_main_rank({})
    assert is_main_rank({"RANK": "0", "WORLD_SIZE": "2"})
    assert not is_main_rank({"RANK": "1", "WORLD_SIZE": "2"})
