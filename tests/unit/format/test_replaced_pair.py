"""A token file replaced while a job reads it: the processes a dataset is pickled into (a
loader's workers, a replacement worker) opened whatever the prefix held when they started, so a
pair rewritten after the training process opened it was served, mixed with the old one, with no
error (a red-team finding, local files and ``s3://``). A TokenFile carries the identity of the
pair it first opened, and any later opening must find the same files."""

from __future__ import annotations

import itertools
import os
import pickle

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import StorageError
from tokenload.format import TokenFile
from tokenload.loader import build_dataloader


def _docs(shift: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.integers(1, 5000, size=int(n)) + shift for n in rng.integers(5, 80, size=200)]


def _replace(prefix: str, tmp_path, shift: int = 1) -> None:
    """The pair rewritten elsewhere and renamed into place (as a writer publishes)."""
    other = write_documents(tmp_path / "other", _docs(shift))
    for ext in (".bin", ".idx"):
        os.replace(other + ext, prefix + ext)


@pytest.mark.parametrize("mode", ["mmap", "pread", "memory"])
def test_a_pickled_token_file_refuses_a_pair_replaced_since_it_was_opened(tmp_path, mode):
    prefix = write_documents(tmp_path / "a", _docs(0))
    first = TokenFile(prefix, mode=mode)
    want = first[3]
    same = pickle.loads(pickle.dumps(first))  # a worker's copy, the pair unchanged
    np.testing.assert_array_equal(same[3], want)
    _replace(prefix, tmp_path)
    copy = pickle.loads(pickle.dumps(first))
    with pytest.raises(StorageError, match="the token file changed since it was first opened"):
        copy[3]
    fresh = TokenFile(prefix, mode=mode)  # a new file object reads the new pair
    assert not np.array_equal(fresh[3], want)


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_workers_started_after_a_replacement_raise_instead_of_serving_it(tmp_path, order, context):
    prefix = write_documents(tmp_path / "a", _docs(0))
    config = MegatronDataConfig(
        sequence_length=32, blend=[prefix], split="100,0,0", order=order, packing="best-fit",
        path_to_cache=str(tmp_path / "cache") if order == "megatron" else None,
    )
    train = build_datasets(config, [100, 0, 0])[0]
    assert train is not None
    train.__getitems__([0])  # the training process opened the pair
    _replace(prefix, tmp_path)
    loader = build_dataloader(train, micro_batch_size=4, num_workers=2,
                              multiprocessing_context=context)
    try:
        with pytest.raises(StorageError, match="the token file changed since it was first opened"):
            list(itertools.islice(loader, 4))
    finally:
        loader.close()


def test_the_same_pair_under_other_inodes_is_the_same_pair(tmp_path):
    """What identifies a pair holds on every host (a dataset pickled to another node sees a
    shared filesystem under other device and inode numbers): the same bytes, sizes and
    modification times under a new inode are the file first opened."""
    import shutil

    prefix = write_documents(tmp_path / "a", _docs(0))
    first = TokenFile(prefix)
    want = first[3]
    for ext in (".bin", ".idx"):  # new inodes, same sizes and modification times
        shutil.copy2(prefix + ext, prefix + ext + ".copy")
        os.replace(prefix + ext + ".copy", prefix + ext)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(first))[3], want)


@pytest.mark.parametrize("mode", ["mmap", "pread", "memory"])
def test_a_touched_pair_is_the_same_pair(tmp_path, mode):
    """Times are not identity: a `touch` (a scratch disk's purge guard, a copy of the same bytes)
    changed them and every later opening refused the file (a regression red-team finding)."""
    prefix = write_documents(tmp_path / "a", _docs(0))
    first = TokenFile(prefix, mode=mode)
    want = first[3]
    for ext in (".bin", ".idx"):
        os.utime(prefix + ext, ns=(1_000_000_000, 2_000_000_000))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(first))[3], want)
    first.close()
    np.testing.assert_array_equal(first[3], want)  # reopened in the same process
