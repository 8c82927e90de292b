"""MegatronDataConfig(order=...) through the public builder: each order is reached from the one
entry point users call, with its own checks, and the config importers are classmethods."""

from __future__ import annotations

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import ConfigError


@pytest.fixture
def prefix(tmp_path):
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 1000, size=int(n)) for n in rng.integers(5, 200, size=300)]
    return write_documents(tmp_path / "corpus", docs)


@pytest.mark.parametrize("order", ["megatron", "computed", "neox"])
def test_every_order_is_reached_through_build_datasets(prefix, order):
    config = MegatronDataConfig(sequence_length=32, blend=[prefix], split="90,10,0", order=order)
    train, valid, test = build_datasets(config, [100, 10, 0])
    assert test is None and len(train) >= 99 and len(valid) >= 1
    items = train.__getitems__(np.arange(8))
    assert items["tokens"].shape == (8, 32) and items["labels"].shape == (8, 32)
    kind = type(train).__name__
    assert {"megatron": "GPTDataset", "computed": "ComputedGPTDataset", "neox": "NeoXGPTDataset"}[order] == kind


def test_the_orders_differ_and_each_is_deterministic(prefix):
    def first_tokens(order):
        config = MegatronDataConfig(sequence_length=32, blend=[prefix], split="90,10,0", order=order)
        return build_datasets(config, [100, 10, 0])[0].__getitems__(np.arange(16))["tokens"]

    megatron, computed = first_tokens("megatron"), first_tokens("computed")
    assert not np.array_equal(megatron, computed)
    np.testing.assert_array_equal(computed, first_tokens("computed"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"order": "random"}, "order is 'random'"), ({"block_size": 8}, "block_size applies to order='computed'")],
)
def test_bad_order_options_are_config_errors(prefix, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        MegatronDataConfig(sequence_length=32, blend=[prefix], split="90,10,0", **kwargs)


def test_from_megatron_args_is_a_classmethod_giving_a_config_and_sizes(prefix):
    got = MegatronDataConfig.from_megatron_args(
        ["--data-path", prefix, "--split", "90,10,0", "--seq-length", "32", "--global-batch-size", "4",
         "--micro-batch-size", "4", "--train-iters", "10", "--eval-iters", "2", "--eval-interval", "5"],
        world_size=1,
    )
    assert got.sizes == [40, 24, 8]
    train, _valid, _ = build_datasets(got.config(), got.sizes)
    assert len(train) >= 40


@pytest.mark.parametrize(("order", "packing", "blended"), [
    (order, packing, blended) for order in ("megatron", "computed") for packing in ("concat", "best-fit")
    for blended in (False, True)] + [("neox", "concat", False), ("neox", "concat", True), ("flat", None, False)])
def test_sample_indices_are_integers(prefix, order, packing, blended):
    """A float index was cast (``[1.5]`` served sample 1, red-team finding) and booleans would be a
    mask in NumPy's indexing: an IndexError on every order, packing and blend (NeoX's blends are
    per split), and on a flat file; an empty list is no sample."""
    from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset

    if order == "flat":
        train = FlatTokenDataset(prefix + ".bin", FlatDatasetConfig(block_size=32, seed=1))
    else:
        data = {"blend_per_split": [["1", prefix, "1", prefix], None, None]} if blended and order == "neox" else {
            "blend": ["1", prefix, "1", prefix] if blended else [prefix], "split": "100,0,0"}
        config = MegatronDataConfig(sequence_length=32, order=order, packing=packing, **data)
        train = build_datasets(config, [64, 0, 0])[0]
    assert train is not None
    for bad in ([1.5], [True, False], np.array([0.0, 2.0])):
        with pytest.raises(IndexError, match="sample indices must be integers"):
            train.__getitems__(bad)
    assert train.__getitems__([])["tokens"].shape[0] == 0
    np.testing.assert_array_equal(train.__getitems__(np.array([2], dtype=np.uint32))["tokens"],
                                  train.__getitems__([2])["tokens"])
    # a uint64 index past int64 was cast to a negative one and served from the end (2**64 - 1 as
    # the last sample; red-team finding): refused as any index past the samples
    for huge in (np.array([2**64 - 1], dtype=np.uint64), np.array([3, 2**63], dtype=np.uint64)):
        with pytest.raises(IndexError, match="sample indices must"):
            train.__getitems__(huge)
    with pytest.raises(IndexError, match="sample indices must"):
        train[np.uint64(2**64 - 2)]


@pytest.mark.parametrize(("packing", "blended"), [
    (packing, blended) for packing in ("concat", "best-fit") for blended in (False, True)])
def test_the_computed_order_counts_negative_indices_from_the_end(prefix, tmp_path, packing, blended):
    """As on the Megatron order (NumPy's rule): -1 is the last sample, -n the first, on one source
    and a blend, concatenated and packed (it was an IndexError on the computed order alone)."""
    other = write_documents(tmp_path / "other", [np.arange(1, 90)] * 40)
    blend = ["1", prefix, "2", other] if blended else [prefix]
    config = MegatronDataConfig(sequence_length=32, order="computed", packing=packing, blend=blend,
                                split="100,0,0")
    train = build_datasets(config, [50, 0, 0])[0]
    assert train is not None
    n = len(train)
    want = train.__getitems__([n - 1, 0, n - 2])
    for key, value in train.__getitems__([-1, -n, n - 2]).items():
        np.testing.assert_array_equal(value, want[key], err_msg=key)
    for bad in ([n], [-n - 1], [0, n]):
        with pytest.raises(IndexError, match=f"sample indices must lie in \\[-{n}, {n}\\)"):
            train.__getitems__(bad)


@pytest.mark.parametrize("mixture", ["refuse", "continue"])
def test_a_megatron_order_blend_counts_negative_indices_from_the_end(prefix, tmp_path, mixture):
    """megatron-core's BlendedDataset indexes its arrays with NumPy: -1 is the last sample, as
    for one GPTDataset (tokenload's single-source Megatron order already wrapped; its blends
    raised an IndexError)."""
    other = write_documents(tmp_path / "other", [np.arange(1, 90)] * 40)
    config = MegatronDataConfig(sequence_length=32, blend=["1", prefix, "2", other], split="100,0,0",
                                path_to_cache=str(tmp_path / "c"), mixture_change=mixture)
    train = build_datasets(config, [50, 0, 0])[0]
    assert train is not None
    n = len(train)
    last = train.__getitems__([n - 1, 0])
    for key, value in train.__getitems__([-1, -n]).items():
        np.testing.assert_array_equal(value, last[key])
    for bad in ([n], [-n - 1]):
        with pytest.raises(IndexError, match=f"sample indices must lie in \\[-{n}, {n}\\)"):
            train.__getitems__(bad)

