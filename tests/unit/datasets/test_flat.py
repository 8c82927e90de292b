"""nanoGPT flat files: windows, an order computed on demand, one epoch covers every window once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.errors import ConfigError
from tokenload.format import write_flat
from tokenload.index.permutation import KeyedPermutation


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 5000), seed=st.integers(0, 2**63), epoch=st.integers(0, 100))
def test_keyed_permutation_is_a_bijection(n, seed, epoch):
    perm = KeyedPermutation(n, seed, epoch)(np.arange(n))
    assert np.array_equal(np.sort(perm), np.arange(n))


def test_keyed_permutation_depends_on_key_and_looks_shuffled():
    n = 100_000
    a = KeyedPermutation(n, 1, 0)(np.arange(n))
    b = KeyedPermutation(n, 1, 1)(np.arange(n))
    c = KeyedPermutation(n, 2, 0)(np.arange(n))
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    # far from the identity and from each other: few fixed points, near-zero rank correlation
    assert np.count_nonzero(a == np.arange(n)) < 20
    assert abs(np.corrcoef(a, np.arange(n))[0, 1]) < 0.02
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02


def test_huge_domain_needs_no_table():
    n = 8_000_000_000 // 1024  # windows of a 16 GB uint16 OpenWebText file at block 1024
    perm = KeyedPermutation(n, 1234)
    sample = perm(np.arange(1000) * 7_000)
    assert sample.min() >= 0 and sample.max() < n and len(set(sample.tolist())) == 1000


@pytest.fixture
def flat_file(tmp_path):
    tokens = np.arange(60_000) % 65_000
    path = tmp_path / "train.bin"
    write_flat(path, tokens)
    return str(path), tokens


def test_windows_cover_each_window_once_per_epoch(flat_file):
    path, tokens = flat_file
    ds = FlatTokenDataset(path, FlatDatasetConfig(block_size=16, seed=3, num_epochs=2))
    n = (60_000 - 1) // 16
    assert len(ds) == 2 * n
    batch = ds.__getitems__(np.arange(len(ds)))
    starts = batch["tokens"][:, 0]
    assert sorted(starts[:n].tolist()) == list(range(0, n * 16, 16))
    assert sorted(starts[n:].tolist()) == list(range(0, n * 16, 16))
    assert not np.array_equal(starts[:n], starts[n:])
    np.testing.assert_array_equal(batch["labels"][:, :-1], batch["tokens"][:, 1:])
    np.testing.assert_array_equal(batch["labels"][:, -1], batch["tokens"][:, -1] + 1)
    assert batch["tokens"].dtype == np.int64 and batch["tokens"].shape == (2 * n, 16)


def test_unshuffled_is_file_order(flat_file):
    path, _ = flat_file
    ds = FlatTokenDataset(path, FlatDatasetConfig(block_size=100, shuffle=False))
    assert ds.__getitems__([0, 1, 5])["tokens"][:, 0].tolist() == [0, 100, 500]
    assert ds[2]["labels"][0] == 201


def test_bad_configs(flat_file, tmp_path):
    path, _ = flat_file
    with pytest.raises(ConfigError):
        FlatDatasetConfig(block_size=0)
    with pytest.raises(ConfigError, match="fewer than one window"):
        FlatTokenDataset(path, FlatDatasetConfig(block_size=60_000))
    with pytest.raises(IndexError):
        FlatTokenDataset(path, FlatDatasetConfig(block_size=16)).__getitems__([10**9])
