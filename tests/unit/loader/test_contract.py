"""Every built-in dataset kind implements the loader's contract (``tokenload.contract``): checked
statically (mypy over a snippet that passes each class as a ``LoaderDataset``: signatures, not
only names) and by behaviour (what each method returns, and that the loader takes the dataset
as it is, without the map-style adapter). A plain map-style dataset is wrapped at the one edge."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from support import mypy_snippet, write_documents
from tokenload.contract import BatchSource, Sources
from tokenload.datasets import (
    FlatDatasetConfig,
    FlatTokenDataset,
    MegatronDataConfig,
    build_datasets,
)
from tokenload.format import write_flat
from tokenload.loader import build_dataloader
from tokenload.loader.mapstyle import MapStyleDataset, loader_dataset

SEQ = 16
MBS = 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("contract")
    rng = np.random.default_rng(7)
    files = []
    for name, count in (("a", 120), ("b", 90)):
        docs = [
            np.append(rng.integers(0, 999, size=int(n)), 999)
            for n in rng.integers(3, 40, size=count)
        ]
        files.append(write_documents(folder / name, docs))
    write_flat(folder / "flat.bin", rng.integers(0, 50_000, size=5_000))
    return folder, files


def _kinds(folder, a: str, b: str) -> dict[str, object]:
    common: dict[str, Any] = dict(sequence_length=SEQ, eod_id=999)
    cached = dict(common, path_to_cache=str(folder / "cache"))  # the Megatron order's caches
    blend = ["30", a, "70", b]
    configs = {
        "gpt": MegatronDataConfig(blend=[a], split="90,10,0", **cached),
        "blended": MegatronDataConfig(blend=blend, split="98,2,0", **cached),
        "continuable": MegatronDataConfig(
            blend=blend, split="98,2,0", mixture_change="continue", **cached
        ),
        "mock": MegatronDataConfig(vocab_size=1000, **cached),
        "computed": MegatronDataConfig(blend=[a], split="90,10,0", order="computed", **common),
        "computed_blend": MegatronDataConfig(
            blend=blend, split="98,2,0", order="computed", **common
        ),
        "neox": MegatronDataConfig(blend=[a], split="90,10,0", order="neox", **common),
        "neox_blend": MegatronDataConfig(
            blend_per_split=[blend, [b], None], order="neox", **common
        ),
    }
    sizes: dict[str, list[int | None]] = {
        "gpt": [None, None, 0], "computed": [None, None, 0], "neox": [200, 10, 0]
    }
    out: dict[str, object] = {kind: build_datasets(c, sizes.get(kind, [200, 10, 0]))[0] for kind, c in configs.items()}
    out["flat"] = FlatTokenDataset(folder / "flat.bin", FlatDatasetConfig(block_size=SEQ))
    return out


@pytest.fixture(scope="module")
def kinds(data):
    folder, (a, b) = data
    return _kinds(folder, a, b)


BLENDS = {"blended", "continuable", "computed_blend", "neox_blend"}
MIXTURES = {"continuable", "computed_blend"}


def test_every_kind_is_built(kinds):
    names = {kind: type(ds).__name__ for kind, ds in kinds.items()}
    assert names == {
        "gpt": "GPTDataset",
        "blended": "BlendedDataset",
        "continuable": "ContinuableBlendedDataset",
        "mock": "GPTDataset",
        "computed": "ComputedGPTDataset",
        "computed_blend": "ComputedBlendedDataset",
        "neox": "NeoXGPTDataset",
        "neox_blend": "BlendedDataset",
        "flat": "FlatTokenDataset",
    }


@pytest.mark.parametrize(
    "kind",
    [
        "gpt",
        "blended",
        "continuable",
        "mock",
        "computed",
        "computed_blend",
        "neox",
        "neox_blend",
        "flat",
    ],
)
def test_each_kind_behaves_as_the_contract_says(kinds, kind):
    ds = kinds[kind]
    assert isinstance(ds, BatchSource) and loader_dataset(ds) is ds  # no adapter
    sources = ds.describe_sources()
    assert isinstance(sources, Sources) and sources.blended == (kind in BLENDS)
    n = len(sources.members)
    assert n == (2 if kind in BLENDS else 1)
    assert len({s.key for s in sources.members}) == n and all(s.name for s in sources.members)
    lengths = {s.sequence_length for s in sources.members}
    assert lengths == ({None} if kind == "flat" else {SEQ})
    sizes, per_sample = ds.epoch_sizes(), ds.sample_bytes()
    assert len(sizes) == len(per_sample) == n
    assert all(type(s) is int and s > 0 for s in sizes)
    window = (SEQ + 1) * (2 if kind == "flat" else np.dtype(np.uint16).itemsize)
    assert per_sample == [None] if kind == "mock" else per_sample == [window] * n
    assert isinstance(ds.fingerprint, str) and len(ds.fingerprint) == 16
    assert isinstance(ds.startup_phases, Mapping)
    assert ds.reads_in_groups is True
    indices = list(range(MBS))
    whole = ds.__getitems__(indices)
    staged = ds.finish_batch(ds.read_batch(indices), None)
    assert whole.keys() == staged.keys() and all(np.array_equal(whole[k], staged[k]) for k in whole)
    assert ("dataset_id" in whole) == (kind in BLENDS)
    index = ds.blend_index()
    mixture = ds.mixture_cursors()
    assert (mixture is not None) == (kind in MIXTURES)
    assert (index is not None) == (kind in BLENDS - MIXTURES or kind == "continuable")
    if index is not None:
        assert len(index) >= len(ds) or kind == "continuable"
    if mixture is not None:
        assert mixture.source_cursors(8).sum() == 8
        assert mixture.schedule_position(8)["entry"] == 0
        assert mixture.mixture_state(8)["consumed"] == 8
        assert isinstance(mixture.cyclic_key(), str)


def test_a_plain_map_style_dataset_is_wrapped_at_the_edge():
    class Items:
        def __len__(self) -> int:
            return 12

        def __getitem__(self, i: int) -> dict:
            return {"tokens": np.full(4, i)}

    plain = Items()
    wrapped = loader_dataset(plain)
    assert isinstance(wrapped, MapStyleDataset) and not wrapped.reads_in_groups
    assert wrapped.fingerprint == f"{Items.__qualname__}:12"
    assert wrapped.describe_sources().members[0].name == "Items"
    loader = build_dataloader(plain, micro_batch_size=MBS, num_workers=0, dp_rank=0, dp_size=1)
    assert loader.dataset is plain  # the loader keeps what it was given
    assert [b["tokens"][:, 0].tolist() for b in loader] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
    ]


_SNIPPET = """
from tokenload.contract import LoaderDataset
from tokenload.datasets import BlendedDataset, FlatTokenDataset, GPTDataset
from tokenload.datasets.computed.computed_blend import ComputedBlendedDataset
from tokenload.datasets.computed.computed_dataset import ComputedGPTDataset
from tokenload.datasets.megatron.continuable import ContinuableBlendedDataset
from tokenload.datasets.neox.neox_dataset import NeoXGPTDataset
from tokenload.loader.mapstyle import MapStyleDataset


def accepts(dataset: LoaderDataset) -> None:
    pass


def check(
    a: GPTDataset, b: BlendedDataset, c: ContinuableBlendedDataset, d: ComputedGPTDataset,
    e: ComputedBlendedDataset, f: NeoXGPTDataset, g: FlatTokenDataset, h: MapStyleDataset,
) -> None:
    accepts(a)
    accepts(b)
    accepts(c)
    accepts(d)
    accepts(e)
    accepts(f)
    accepts(g)
    accepts(h)
"""


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_each_kind_satisfies_the_protocol_for_mypy(tmp_path):
    """Structural typing: a method with another signature (say ``epoch_sizes(self, k)``) or a
    missing one fails here; ``isinstance`` checks only the names."""
    out, status = mypy_snippet(tmp_path, _SNIPPET)
    assert status == 0, out
