"""The defaults a user takes, through the public API: every kind of data (one prefix, a blend,
per-split blends, mock data, a flat file), with the index cache in an explicit folder, in
Megatron's default folder (``path_to_cache`` unset) or off, read by 2 workers under fork and spawn
(and through pipes instead of shared memory), gives exactly the batches of ``num_workers=0``.

In-memory indices (a blend without ``path_to_cache``, ``cache="off"``, mock data) once failed in
every worker with a bare AssertionError; every earlier loader test passed ``path_to_cache``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch

from support import write_documents
from tokenload.datasets import (
    FlatDatasetConfig,
    FlatTokenDataset,
    MegatronDataConfig,
    build_datasets,
)
from tokenload.format import write_flat
from tokenload.loader import build_dataloader

SEQ = 16
MBS = 4
BATCHES = 5
KINDS = ["prefix", "blend", "blend_per_split", "mock"]
CACHES = ["path", "default", "off"]  # path_to_cache set, unset (next to the prefix), cache="off"


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix")
    rng = np.random.default_rng(11)
    files = []
    for name, count in (("a", 120), ("b", 80)):
        docs = [np.append(rng.integers(0, 999, size=int(n)), 999) for n in rng.integers(3, 40, size=count)]
        files.append(write_documents(folder / name, docs))
    return folder, files


def _config(kind: str, cache: str, folder, a: str, b: str) -> MegatronDataConfig:
    common: dict[str, Any] = dict(sequence_length=SEQ, eod_id=999, eod_mask_loss=True)
    if cache == "path":
        common["path_to_cache"] = str(folder / "cache")
    elif cache == "off":
        common["cache"] = "off"
    if kind == "prefix":
        return MegatronDataConfig(blend=[a], split="90,10,0", **common)
    if kind == "blend":
        return MegatronDataConfig(blend=["30", a, "70", b], split="98,2,0", **common)
    if kind == "blend_per_split":
        return MegatronDataConfig(blend_per_split=[["40", a, "60", b], [b], None], **common)
    return MegatronDataConfig(vocab_size=1000, **common)


@pytest.fixture(scope="module")
def train_sets(prefixes):
    """The train split of every (kind, cache), built once for the module."""
    folder, (a, b) = prefixes
    sizes = {"prefix": [None, None, 0], "mock": [200, 20, 0]}
    return {
        (kind, cache): build_datasets(_config(kind, cache, folder, a, b), sizes.get(kind, [300, 10, 0]))[0]
        for kind in KINDS
        for cache in CACHES
    }


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    path = tmp_path_factory.mktemp("matrixflat") / "train.bin"
    write_flat(path, np.random.default_rng(3).integers(0, 50_000, size=5_000))
    return FlatTokenDataset(path, FlatDatasetConfig(block_size=SEQ))


def _first_batches(dataset, **config) -> list[dict]:
    loader = build_dataloader(dataset, micro_batch_size=MBS, dp_rank=0, dp_size=1, **config)
    try:
        return list(itertools.islice(loader, BATCHES))
    finally:
        loader.close()


def _assert_same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want) == BATCHES
    for step, (g, w) in enumerate(zip(got, want)):
        assert set(g) == set(w), step
        for key in w:
            assert isinstance(g[key], torch.Tensor), key
            assert g[key].dtype == w[key].dtype and g[key].shape == w[key].shape, (step, key)
            assert torch.equal(g[key], w[key]), (step, key)


def _check(dataset, method: str, shared_memory: bool = True) -> None:
    want = _first_batches(dataset, num_workers=0)
    direct = dataset.__getitems__(list(range(MBS)))
    for key, value in direct.items():  # num_workers=0 is the dataset's own read
        np.testing.assert_array_equal(want[0][key].numpy(), value, err_msg=key)
    got = _first_batches(dataset, num_workers=2, multiprocessing_context=method, shared_memory=shared_memory)
    _assert_same(got, want)


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("kind", KINDS)
def test_workers_give_the_in_process_batches(train_sets, kind, cache, method):
    dataset = train_sets[kind, cache]
    if kind in ("blend", "blend_per_split"):
        assert "dataset_id" in dataset.__getitems__([0])  # really a blend
    _check(dataset, method)


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("cache", CACHES)
def test_blend_through_pipes_without_shared_memory(train_sets, cache, method):
    _check(train_sets["blend", cache], method, shared_memory=False)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_flat_file(flat, method):
    """A flat file has no index cache: the cache dimension does not apply."""
    _check(flat, method)
