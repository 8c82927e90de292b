"""Pieces of the Lightning tests that spawned processes import: a tiny dataset following the
tokenload dataset protocol, and a LightningModule that records the first token of every row."""

from __future__ import annotations

import json
import os
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch


class RangeDataset:
    """Sample k is ``[k, k + 1, ..., k + seq_len - 1]``: the first token names the sample."""

    def __init__(self, n: int, seq_len: int = 4, tag: str = "range") -> None:
        self.n, self.seq_len, self.tag = n, seq_len, tag

    def __len__(self) -> int:
        return self.n

    @property
    def fingerprint(self) -> str:
        return f"{self.tag}:{self.n}:{self.seq_len}"

    def __getitems__(self, indices) -> dict[str, np.ndarray]:
        k = np.asarray(indices, dtype=np.int64)
        if k.size and (k.min() < 0 or k.max() >= self.n):
            raise IndexError(f"sample indices must lie in [0, {self.n})")
        rows = k[:, None] + np.arange(self.seq_len + 1, dtype=np.int64)
        return {"tokens": rows[:, :-1], "labels": rows[:, 1:]}


class Recorder(pl.LightningModule):
    """Trains nothing (lr 0). Records ``[epoch, batches in the epoch, is_last_batch, tokens[:, 0]
    // divisor]`` of each training batch as Lightning sees them (so a wrong loader length shows),
    and ``tokens[:, 0] // divisor`` of each validation batch; writes them, per rank, to
    ``out_dir/<tag>-rank<r>.json`` when training ends."""

    def __init__(self, out_dir: str | None = None, tag: str = "run", divisor: int = 1) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.out_dir, self.tag, self.divisor = out_dir, tag, divisor
        self.train_seen: list[list] = []
        self.val_seen: list[list[int]] = []

    def _ids(self, batch) -> list[int]:
        return (batch["tokens"][:, 0] // self.divisor).tolist()

    def training_step(self, batch, batch_idx):
        seen = (
            self.trainer.num_training_batches,
            self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch,
        )
        self.train_seen.append([self.current_epoch, *seen, self._ids(batch)])
        return self.layer(torch.ones(batch["tokens"].shape[0], 1)).mean()

    def validation_step(self, batch, batch_idx):
        self.val_seen.append(self._ids(batch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def on_train_end(self) -> None:
        if self.out_dir is not None:
            path = os.path.join(self.out_dir, f"{self.tag}-rank{self.global_rank}.json")
            with open(path, "w") as f:
                json.dump({"train": self.train_seen, "val": self.val_seen}, f)


def trainer(**overrides) -> pl.Trainer:
    """A quiet CPU Trainer for tests."""
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    options.update(overrides)
    return pl.Trainer(**options)
