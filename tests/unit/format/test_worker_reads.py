"""A torch DataLoader with 2 workers reads token files correctly under fork and spawn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tokenload.format import ReadMode, TokenFile


class SequenceDataset(Dataset):
    """Each item is (index, tokens padded to 300, length)."""

    def __init__(self, prefix: str, mode: str) -> None:
        self.file = TokenFile(prefix, mode=mode)

    def __len__(self) -> int:
        return len(self.file)

    def __getitem__(self, i: int):
        tokens = self.file[i].astype(np.int64)
        out = np.zeros(300, dtype=np.int64)
        out[: tokens.size] = tokens
        return i, torch.from_numpy(out), tokens.size


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("mode", [ReadMode.MMAP, ReadMode.PREAD])
def test_two_workers(random_file, start_method, mode):
    prefix, docs = random_file
    ds = SequenceDataset(prefix, mode.value)
    ds.file[0]  # opened in the parent before the workers start: they must not reuse it
    loader = DataLoader(ds, batch_size=16, num_workers=2, multiprocessing_context=start_method)
    seen = 0
    for index, tokens, length in loader:
        for i, row, n in zip(index.tolist(), tokens, length.tolist()):
            assert n == len(docs[i])
            np.testing.assert_array_equal(row[:n].numpy(), docs[i])
            seen += 1
    assert seen == len(docs)
