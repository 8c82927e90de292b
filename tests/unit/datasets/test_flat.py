"""nanoGPT flat files: windows, an order computed on demand, one epoch covers every window once."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time

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
    path, _tokens = flat_file
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


def _fingerprint(path, **config) -> str:
    return FlatTokenDataset(path, FlatDatasetConfig(block_size=16, **config)).fingerprint


def test_fingerprint_is_the_content_not_the_name_or_folder(flat_file, tmp_path):
    path, _tokens = flat_file
    first = _fingerprint(path)
    (tmp_path / "elsewhere").mkdir()
    moved = tmp_path / "elsewhere" / "train.bin"
    os.rename(path, moved)
    assert _fingerprint(moved) == first
    renamed = tmp_path / "elsewhere" / "owt_train.bin"
    shutil.copyfile(moved, renamed)
    assert _fingerprint(renamed) == first
    assert _fingerprint(renamed, mode="pread") == first  # how it is read is not what it holds
    assert _fingerprint(renamed, seed=6) != first


def test_fingerprint_tells_same_size_files_apart(flat_file, tmp_path):
    path, tokens = flat_file
    first = _fingerprint(path)
    other = tmp_path / "other" / "train.bin"
    other.parent.mkdir()
    write_flat(other, tokens[::-1])
    assert os.path.getsize(other) == os.path.getsize(path)
    assert _fingerprint(other) != first
    write_flat(other, np.concatenate([tokens[:30_000], [7], tokens[30_001:]]))  # one token
    assert _fingerprint(other) != first


def test_fingerprint_of_a_large_file_samples_it(tmp_path):
    """Over 4 MiB only sampled blocks are read, the first and the last among them."""
    tokens = np.random.default_rng(1).integers(0, 50_000, size=3_000_000)  # 6 MB
    path = tmp_path / "big.bin"
    write_flat(path, tokens)
    first = _fingerprint(path)
    for position in (0, len(tokens) - 1):
        changed = tokens.copy()
        changed[position] ^= 1
        write_flat(path, changed)
        assert _fingerprint(path) != first, position
    write_flat(path, tokens)
    assert _fingerprint(path) == first


def test_fingerprint_of_a_100_gb_file_is_cheap(tmp_path):
    path = tmp_path / "huge.bin"
    with open(path, "wb") as f:
        f.truncate(100 << 30)  # sparse: no disk used
    start = time.perf_counter()
    fingerprint = _fingerprint(path)
    assert time.perf_counter() - start < 5  # reading it whole would take minutes
    assert len(fingerprint) == 16


def _handles(path) -> tuple[set, set]:
    """This process's open descriptors and mappings of ``path`` (from /proc)."""
    real = os.path.realpath(path)
    fds = {int(fd) for fd in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{fd}") == real}
    with open("/proc/self/maps") as maps:
        mapped = {line.split()[0] for line in maps if line.rstrip().endswith(real)}
    return fds, mapped


def _read_in_child(dataset, queue) -> None:
    batch = dataset.__getitems__([3, 4])
    queue.put((batch["tokens"], _handles(dataset.path)))


@pytest.mark.parametrize("mode", ["mmap", "pread"])
def test_a_forked_process_opens_the_file_again(flat_file, mode):
    """A mapping or descriptor inherited through fork is the parent's: a child (a loader worker)
    must read through its own."""
    path, _ = flat_file
    ds = FlatTokenDataset(path, FlatDatasetConfig(block_size=16, mode=mode))
    want = ds.__getitems__([3, 4])["tokens"]
    parent = _handles(path)
    assert parent != (set(), set())
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(ds, queue))
    child.start()
    tokens, handles = queue.get(timeout=30)
    child.join(30)
    np.testing.assert_array_equal(tokens, want)
    fds, mapped = handles
    assert not fds & parent[0]
    assert bool(fds) == (mode == "pread")  # a mapping keeps no descriptor (format.descriptors)
    assert not mapped & parent[1] and bool(mapped) == (mode == "mmap")
