"""Real multi-process runs (gloo, CPU): each epoch is split across ranks with no duplicate and no
gap, and a run resumed from a checkpoint, on the same or another data-parallel size, continues
exactly where an uninterrupted run would be."""

from __future__ import annotations

import numpy as np
import pytest

from .launch import run_ranks

MBS = 3
GBS = 24


def _dataset(path):
    from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset

    return FlatTokenDataset(path, FlatDatasetConfig(block_size=16, seed=11))


def _window_ids(batch):
    return (batch["tokens"][:, 0] // 16).tolist()


def epoch_on_rank(rank, world_size, path, num_workers, method):
    import torch.distributed as dist

    from tokenload.loader import build_dataloader

    # dp_rank / dp_size come from the initialized process group
    loader = build_dataloader(_dataset(path), micro_batch_size=MBS, num_workers=num_workers,
                              multiprocessing_context=method)
    assert (loader.dp_rank, loader.dp_size) == (dist.get_rank(), dist.get_world_size())
    mine = [_window_ids(b) for b in loader]
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    return everyone if rank == 0 else len(mine)


def steps_on_rank(rank, world_size, path, state, skip_global, take_global):
    """Micro-batches of global batches [skip, skip + take) on this rank, optionally after a resume."""
    from tokenload.loader import build_dataloader

    loader = build_dataloader(_dataset(path), micro_batch_size=MBS, num_workers=2, multiprocessing_context="fork")
    micro_per_global = GBS // (MBS * world_size)
    if state is not None:
        loader.load_state_dict(state)
    else:
        it = iter(loader)
        for _ in range(skip_global * micro_per_global):
            next(it)
    it = iter(loader)
    batches = [_window_ids(next(it)) for _ in range(take_global * micro_per_global)]
    return batches, loader.state_dict()


def _global_order(per_rank):
    """Interleave ranks' micro-batches back into the global order (Megatron's slicing)."""
    return [i for step in zip(*per_rank) for batch in step for i in batch]


@pytest.fixture(scope="module")
def flat_path(tmp_path_factory):
    from tokenload.format import write_flat

    path = tmp_path_factory.mktemp("flat") / "train.bin"
    write_flat(path, np.arange(64_000) % 65_000)
    return str(path)


@pytest.mark.parametrize("world_size,num_workers,method", [(4, 2, "fork"), (3, 2, "spawn"), (2, 0, None)])
def test_epoch_has_no_duplicates_and_no_gaps(flat_path, world_size, num_workers, method):
    everyone = run_ranks(world_size, epoch_on_rank, flat_path, num_workers, method)[0]
    windows = (64_000 - 1) // 16
    usable = windows - windows % (MBS * world_size)
    ids = [i for rank in everyone for batch in rank for i in batch]
    assert len(ids) == usable == len(set(ids))
    assert set(ids) <= set(range(windows))
    assert len({len(rank) for rank in everyone}) == 1  # equal batch counts: no rank waits on another


def test_resume_onto_same_and_other_world_sizes(flat_path):
    # uninterrupted 4-rank run: global batches [0, 20)
    reference = run_ranks(4, steps_on_rank, flat_path, None, 0, 20)
    ref_order = _global_order([b for b, _ in reference])
    # the checkpointed 4-rank run: 12 global batches, then save
    first = run_ranks(4, steps_on_rank, flat_path, None, 0, 12)
    states = [s for _, s in first]
    # the position in the order is the same on every rank; the metrics are each rank's own
    position = [{k: v for k, v in s.items() if k != "metrics"} for s in states]
    assert all(p == position[0] for p in position) and position[0]["consumed_samples"] == 12 * GBS
    assert all(s["metrics"]["steps"] == 12 * GBS // (MBS * 4) for s in states)  # micro-batches per rank
    for world in (4, 2, 8):
        resumed = run_ranks(world, steps_on_rank, flat_path, states[0], 0, 8)
        order = _global_order([b for b, _ in resumed])
        assert order == ref_order[12 * GBS : 20 * GBS], f"resume onto {world} ranks"
        if world == 4:  # same topology: every rank's next 8 global batches are identical
            for r in range(4):
                assert resumed[r][0] == reference[r][0][12 * 2 :], r
