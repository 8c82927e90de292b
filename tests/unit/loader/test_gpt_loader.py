"""Megatron-order datasets through the loader's workers (spawn, forkserver and fork; reading one,
two or four micro-batches at once): every batch equals an in-process read, padded validation
samples and blends included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.loader import build_dataloader


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gptloader")
    rng = np.random.default_rng(4)
    docs = [np.append(rng.integers(0, 999, size=int(n)), 999) for n in rng.integers(3, 80, size=300)]
    prefix = write_documents(folder / "data", docs)
    cfg = MegatronDataConfig(sequence_length=24, blend=[prefix], split="90,10,0", eod_id=999,
                             drop_last_partial_validation_sequence=False, eod_mask_loss=True,
                             path_to_cache=str(folder / "cache"))
    return build_datasets(cfg, [None, None, None])


@pytest.fixture(scope="module")
def blend(tmp_path_factory, splits):
    folder = tmp_path_factory.mktemp("gptblend")
    rng = np.random.default_rng(5)
    docs = [np.append(rng.integers(0, 999, size=int(n)), 999) for n in rng.integers(3, 30, size=200)]
    other = write_documents(folder / "other", docs)
    first = splits[0].source.idx_path[: -len(".idx")]
    cfg = MegatronDataConfig(sequence_length=24, blend=["30", first, "70", other], split="100,0,0",
                             eod_id=999, path_to_cache=str(folder / "cache"))
    return build_datasets(cfg, [500, 0, 0])[0]


@pytest.mark.parametrize("method,prefetch", [("spawn", 8), ("forkserver", 2), ("fork", 1)])
def test_workers_equal_in_process_reads(splits, blend, method, prefetch):
    train, valid, _ = splits
    assert hasattr(blend, "dataset_index")
    for ds in (train, valid, blend):
        loader = build_dataloader(ds, micro_batch_size=5, num_workers=2, multiprocessing_context=method,
                                  drop_last=False, prefetch_factor=prefetch)
        start = 0
        for batch in loader:
            n = len(batch["tokens"])
            want = ds.__getitems__(list(range(start, start + n)))
            assert set(batch) == set(want)
            for key, value in want.items():
                assert isinstance(batch[key], torch.Tensor)
                np.testing.assert_array_equal(batch[key].numpy(), value, err_msg=key)
            start += n
        assert start == len(ds)
        loader.close()
    padded = int(np.argmax(np.asarray(valid.shuffle_index)))  # the last sample in sample order
    assert valid.read_batch([padded])["padded"]
    assert valid.__getitems__([padded])["loss_mask"][0, -1] == 0  # its padded tail has no loss


@pytest.mark.parametrize("which", ["gpt", "blend"])
@pytest.mark.parametrize("workers", [0, 2])
def test_an_empty_last_micro_batch_of_a_rank(splits, blend, workers, which):
    """drop_last=False: like Megatron, every rank takes a last step; a rank with nothing left gets
    an empty micro-batch of the right width."""
    train = splits[0] if which == "gpt" else blend
    dp = 3
    mbs = next(m for m in range(2, 20) if 0 < len(train) % (m * dp) <= m)  # only rank 0 has a rest
    loader = build_dataloader(train, micro_batch_size=mbs, dp_rank=2, dp_size=dp, num_workers=workers,
                              drop_last=False)
    sizes = [tuple(b["tokens"].shape) for b in loader]
    assert sizes[-1] == (0, 24) and set(sizes[:-1]) == {(mbs, 24)}
    assert loader.state_dict()["consumed_samples"] == len(train)
    loader.close()
