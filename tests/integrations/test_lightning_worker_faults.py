"""Issue 24 (6) under Lightning DDP (2 ranks, CPU, gloo, ddp_spawn): a loader worker killed on
one rank mid-epoch is replaced; both ranks train on the batches of the fault-free run, and the
DataModule takes ``worker_timeout``/``max_worker_restarts`` as keywords."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.errors import ConfigError
from tokenload.format import write_flat
from tokenload.integrations.lightning import TokenloadDataModule

from .lightning_app import Recorder, trainer

BLOCK, MBS, WORLD, STEPS = 16, 2, 2, 12


class KillingRecorder(Recorder):
    """Records like Recorder; at step 3 rank 1 kills its training loader's worker 1."""

    def training_step(self, batch, batch_idx):
        if batch_idx == 3 and self.global_rank == 1:
            os.kill(self.trainer.train_dataloader.loader.worker_processes[1].pid, signal.SIGKILL)
        return super().training_step(batch, batch_idx)

    def on_train_end(self) -> None:
        served = self.trainer.train_dataloader
        assert served is not None
        health = served.loader.metrics()["workers"]
        self.train_seen.append(["restarts", health["restarts"]])
        super().on_train_end()


def _fit(dataset, out_dir, tag, module):
    dm = TokenloadDataModule(train=dataset, micro_batch_size=MBS, num_workers=2,
                             multiprocessing_context="fork", worker_timeout=30.0,
                             max_worker_restarts=1)
    trainer(devices=WORLD, strategy="ddp_spawn", max_steps=STEPS).fit(
        module(str(out_dir), tag, divisor=BLOCK), dm
    )
    return [json.loads((out_dir / f"{tag}-rank{r}.json").read_text())["train"]
            for r in range(WORLD)]


@pytest.mark.timeout(240)  # one 2-rank fit
def test_a_killed_worker_on_one_rank_leaves_every_rank_the_fault_free_batches(tmp_path):
    # Token t of the file is t, so a row's first token // BLOCK names its window.
    write_flat(tmp_path / "train.bin", np.arange(BLOCK * 200 + 1))
    dataset = FlatTokenDataset(tmp_path / "train.bin", FlatDatasetConfig(block_size=BLOCK, seed=3))
    faulty = _fit(dataset, tmp_path, "faulty", KillingRecorder)
    # Megatron's slicing: step j covers global samples [j * MBS * WORLD, ...), rank r its r-th MBS
    windows = (dataset.window_starts(np.arange(STEPS * MBS * WORLD)) // BLOCK).tolist()
    for rank in range(WORLD):
        *seen, (_, restarts) = faulty[rank]
        assert restarts == (1 if rank == 1 else 0), rank
        assert len(seen) == STEPS, rank
        for j, (*_, ids) in enumerate(seen):
            start = j * MBS * WORLD + rank * MBS
            assert ids == windows[start : start + MBS], (rank, j)


@pytest.mark.parametrize("options", [{"worker_timeout": 0}, {"max_worker_restarts": -1}])
def test_the_datamodule_checks_the_fault_keywords(options):
    with pytest.raises(ConfigError, match=next(iter(options))):
        TokenloadDataModule(train=None, micro_batch_size=2, **options)
