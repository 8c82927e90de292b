"""TokenloadDataModule hands Lightning's training_step the document boundaries of
``inter_document_masking`` (cu_seqlens, max_seqlen, per-document position_ids) unchanged."""

from __future__ import annotations

import numpy as np
import torch

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.integrations.lightning import TokenloadDataModule

from .lightning_app import Recorder, trainer


class FieldRecorder(Recorder):
    def training_step(self, batch, batch_idx):
        self.train_seen.append(
            {k: batch[k].clone() for k in ("cu_seqlens", "max_seqlen", "position_ids")}
        )
        return self.layer(torch.ones(batch["tokens"].shape[0], 1)).mean()


def test_training_step_gets_the_boundaries(tmp_path):
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 999, int(n)) for n in rng.integers(0, 30, 200)]  # no EOD
    prefix = write_documents(tmp_path / "docs", docs)
    cfg = MegatronDataConfig(
        sequence_length=16,
        blend=[prefix],
        split="100,0,0",
        inter_document_masking=True,
        path_to_cache=str(tmp_path / "cache"),
    )
    train = build_datasets(cfg, [None, 0, 0])[0]
    model = FieldRecorder()
    trainer(max_steps=6).fit(
        model, TokenloadDataModule(train=train, micro_batch_size=4, num_workers=0)
    )
    assert len(model.train_seen) == 6
    for k, seen in enumerate(model.train_seen):
        want = train.__getitems__(np.arange(4 * k, 4 * k + 4))
        for field, value in seen.items():
            np.testing.assert_array_equal(value.numpy(), want[field], err_msg=field)
    assert any((s["cu_seqlens"][:, 1] < 16).any() for s in model.train_seen)
