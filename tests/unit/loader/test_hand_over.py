"""The loader's hand-over: workers do not preempt the training loop when a credit wakes them, and
a batch the loop has dropped is not kept alive by the loader while it makes the next one (its
memory is reused, still in the CPU caches). The one-source repeat check is covered by
test_metrics (a cyclic loader past its dataset repeats)."""

from __future__ import annotations

import os
import weakref

import numpy as np

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.format import write_flat
from tokenload.loader import build_dataloader


class _Probe(FlatTokenDataset):
    """Records, at each read, whether the previous batch's tokens tensor is still alive."""

    watched: weakref.ref | None = None
    alive_at_read: list[bool]

    def __getitems__(self, indices):
        if self.watched is not None:
            self.alive_at_read.append(self.watched() is not None)
        return super().__getitems__(indices)


def test_a_dropped_batch_is_freed_before_the_next_is_read(tmp_path):
    write_flat(tmp_path / "train.bin", np.arange(20_000) % 60_000)
    ds = _Probe(tmp_path / "train.bin", FlatDatasetConfig(block_size=16, seed=5))
    ds.alive_at_read = []
    it = iter(build_dataloader(ds, micro_batch_size=4, num_workers=0, dp_rank=0, dp_size=1))
    for _ in range(3):
        batch = next(it)
        ds.watched = weakref.ref(batch["tokens"])
        del batch
    next(it)
    assert ds.alive_at_read == [False, False, False]



def test_workers_do_not_preempt_the_training_loop_when_woken(tmp_path):
    """Workers run as SCHED_BATCH: a credit that wakes one does not preempt the loop that sent it
    (on shared cores the loop waited for the worker's read inside next() after long steps)."""
    write_flat(tmp_path / "train.bin", np.arange(20_000) % 60_000)
    ds = FlatTokenDataset(tmp_path / "train.bin", FlatDatasetConfig(block_size=16, seed=5))
    loader = build_dataloader(ds, micro_batch_size=4, num_workers=2, dp_rank=0, dp_size=1)
    try:
        batches = iter(loader)
        next(batches), next(batches)  # worker w makes batches w, w + 2, ...: both have started
        policies = {os.sched_getscheduler(p.pid) for p in loader.worker_processes}
        assert policies == {os.SCHED_BATCH}
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the training process is left alone
    finally:
        loader.close()
