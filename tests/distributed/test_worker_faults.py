"""Issue 24 (6): a worker killed or stopped on one rank mid-epoch is replaced there; every rank
finishes with the batches of the fault-free run, and a collective after every step (as a
training step's gradient all-reduce) never goes out of step."""

from __future__ import annotations

import numpy as np
import pytest

from .launch import run_ranks

MBS = 3
STEPS = 40


def _dataset(path):
    from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset

    return FlatTokenDataset(path, FlatDatasetConfig(block_size=16, seed=11))


def faulty_epoch_on_rank(rank, world_size, path, method, victim_rank, fault):
    """STEPS micro-batches with an all-reduce after each; on ``victim_rank`` one worker gets
    ``fault`` (SIGKILL or SIGSTOP) after step 5. Returns this rank's batch digests per step, the
    step counter every rank agreed on, and the loader's worker metrics."""
    import hashlib
    import os
    import signal

    import torch
    import torch.distributed as dist

    from tokenload.loader import build_dataloader

    loader = build_dataloader(_dataset(path), micro_batch_size=MBS, num_workers=2,
                              multiprocessing_context=method, worker_timeout=2.0)
    steps, agreed = [], 0
    for step, batch in zip(range(STEPS), loader):
        steps.append(hashlib.sha256(batch["tokens"].numpy().tobytes()).hexdigest())
        count = torch.ones(1)
        dist.all_reduce(count)  # a rank that fell out of step would hang or miscount here
        agreed += int(count.item()) == world_size
        if step == 5 and rank == victim_rank:
            sig = signal.SIGKILL if fault == "kill" else signal.SIGSTOP
            os.kill(loader.worker_processes[1].pid, sig)
    health = loader.metrics()["workers"]
    loader.close()
    return steps, agreed, health


@pytest.fixture(scope="module")
def flat_path(tmp_path_factory):
    from tokenload.format import write_flat

    path = tmp_path_factory.mktemp("flat") / "train.bin"
    write_flat(path, np.arange(48_000) % 65_000)
    return str(path)


@pytest.mark.parametrize("method,fault", [("fork", "kill"), ("spawn", "stop")])
def test_a_rank_whose_worker_fails_recovers_and_every_rank_gets_the_fault_free_batches(
    flat_path, method, fault
):
    world = 2
    clean = run_ranks(world, faulty_epoch_on_rank, flat_path, method, -1, fault)
    faulty = run_ranks(world, faulty_epoch_on_rank, flat_path, method, 1, fault)
    for rank in range(world):
        steps, agreed, health = faulty[rank]
        assert len(steps) == STEPS and agreed == STEPS, rank
        assert steps == clean[rank][0], rank  # the same bytes, step for step
        assert health["restarts"] == (1 if rank == 1 else 0), (rank, health)
        assert health["stalls"] == (1 if rank == 1 and fault == "stop" else 0), (rank, health)
    assert all(clean[r][2]["restarts"] == 0 for r in range(world))
