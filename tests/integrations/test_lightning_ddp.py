"""TokenloadDataModule under a real 2-process Lightning Trainer (CPU, gloo, ddp_spawn): the ranks
read disjoint micro-batches that together cover the global order exactly, and a run resumed
from a checkpoint gives every rank the same batches as the uninterrupted run."""

from __future__ import annotations

import json

import lightning.pytorch as pl
import numpy as np
import torch

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.format import write_flat
from tokenload.integrations.lightning import TokenloadDataModule
from tokenload.loader import build_dataloader

from .lightning_app import Recorder, trainer

BLOCK, MBS, WORLD, ACCUMULATE, STEPS, SAVED = 16, 2, 2, 2, 6, 3
GBS = MBS * WORLD * ACCUMULATE
MICRO = STEPS * ACCUMULATE  # micro-batches per rank in the whole run


def _fit(dataset, out_dir, tag, ckpt_dir=None, ckpt_path=None):
    dm = TokenloadDataModule(
        train=dataset,
        micro_batch_size=MBS,
        global_batch_size=GBS,
        num_workers=2,
        multiprocessing_context="fork",
    )
    options = dict(
        devices=WORLD, strategy="ddp_spawn", accumulate_grad_batches=ACCUMULATE, max_steps=STEPS
    )
    if ckpt_dir is not None:
        save = pl.callbacks.ModelCheckpoint(
            dirpath=ckpt_dir, every_n_train_steps=SAVED, save_top_k=-1
        )
        options.update(enable_checkpointing=True, callbacks=[save])
    trainer(**options).fit(Recorder(str(out_dir), tag, divisor=BLOCK), dm, ckpt_path=ckpt_path)
    return [
        json.loads((out_dir / f"{tag}-rank{r}.json").read_text())["train"] for r in range(WORLD)
    ]


def test_two_ranks_split_the_order_and_resume_exactly(tmp_path):
    # Token t of the file is t, so a row's first token // BLOCK names its window.
    write_flat(tmp_path / "train.bin", np.arange(BLOCK * 200 + 1))
    dataset = FlatTokenDataset(tmp_path / "train.bin", FlatDatasetConfig(block_size=BLOCK, seed=3))
    full = _fit(dataset, tmp_path, "full", ckpt_dir=tmp_path / "ckpt")

    # Megatron's slicing: micro-batch step j covers global samples [j * MBS * WORLD, ...), rank r
    # takes its r-th MBS of them; global sample k is window p(k) of the keyed permutation.
    windows = (dataset.window_starts(np.arange(MICRO * MBS * WORLD)) // BLOCK).tolist()
    for rank, seen in enumerate(full):
        assert len(seen) == MICRO
        for j, (*_, ids) in enumerate(seen):
            start = j * MBS * WORLD + rank * MBS
            assert ids == windows[start : start + MBS], f"rank {rank} micro-batch {j}"
    per_rank = [{i for *_, ids in seen for i in ids} for seen in full]
    assert not per_rank[0] & per_rank[1]
    assert per_rank[0] | per_rank[1] == set(windows) and len(set(windows)) == len(windows)
    assert windows != sorted(windows)  # the order really is shuffled

    ckpt = next((tmp_path / "ckpt").glob(f"*step={SAVED}.ckpt"))
    state = torch.load(ckpt, weights_only=False)["TokenloadDataModule"]
    reference = build_dataloader(
        dataset, micro_batch_size=MBS, dp_rank=0, dp_size=WORLD, num_workers=0
    )
    assert state["consumed_samples"] == SAVED * GBS and state["dp_size"] == WORLD
    assert state["fingerprint"] == reference.fingerprint

    resumed = _fit(dataset, tmp_path, "resumed", ckpt_path=ckpt)
    for rank in range(WORLD):
        assert resumed[rank] == full[rank][SAVED * ACCUMULATE :], f"rank {rank}"
