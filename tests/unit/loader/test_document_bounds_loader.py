"""Document boundaries through the loader's workers (``inter_document_masking``)."""

from __future__ import annotations

import numpy as np

from support import FIXTURES
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.loader import build_dataloader

EOD = 999


def test_grouped_reads_of_a_worker_keep_each_rows_boundaries(tmp_path):
    """A loader worker reads several micro-batches in one read_batch and cuts the rows apart:
    each batch's cu_seqlens are those of its own samples."""
    folder = FIXTURES / "megatron" / "boundaries"
    cfg = MegatronDataConfig(
        sequence_length=5,
        blend=[str(folder / "eod_inside")],
        split="100,0,0",
        eod_id=EOD,
        inter_document_masking=True,
        path_to_cache=str(tmp_path),
    )
    train = build_datasets(cfg, [None, 0, 0])[0]
    loader = build_dataloader(
        train, micro_batch_size=3, num_workers=1, prefetch_factor=4, dp_rank=0, dp_size=1
    )
    try:
        for k, batch in enumerate(loader):
            want = train.__getitems__(np.arange(3 * k, 3 * k + 3))
            np.testing.assert_array_equal(batch["cu_seqlens"].numpy(), want["cu_seqlens"])
            np.testing.assert_array_equal(batch["max_seqlen"].numpy(), want["max_seqlen"])
            np.testing.assert_array_equal(batch["position_ids"].numpy(), want["position_ids"])
    finally:
        loader.close()
    assert k > 20
