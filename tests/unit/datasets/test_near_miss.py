"""A job that misses its prepared caches under ``build_policy="none"`` because one value is
written otherwise is told which value, from the cache folder's descriptions of the same split
(``datasets.megatron.near_miss``): packing left out, the prefix relative instead of absolute,
another S or sample count. Nothing nearly matching: the error is as before."""

from __future__ import annotations

import os

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import CacheError


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    """A folder prepared (``auto``) for packed rows of the prefix ``data/a``, as written (a
    relative path, from ``tmp_path``)."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(3)
    (tmp_path / "data").mkdir()
    write_documents(tmp_path / "data" / "a", [rng.integers(1, 999, int(n)) for n in rng.integers(1, 80, 200)])
    base = dict(sequence_length=16, split="1,0,0", path_to_cache="cache")
    build_datasets(MegatronDataConfig(blend=["data/a"], packing="best-fit", **base), [150, 0, 0])
    return base


def _error(base, sizes=(150, 0, 0), **changed) -> str:
    config = MegatronDataConfig(**{**base, "build_policy": "none", **changed})
    with pytest.raises(CacheError) as info:
        build_datasets(config, list(sizes))
    return str(info.value)


def test_packing_left_out_names_the_packed_cache_beside_it(prepared):
    text = _error(prepared, blend=["data/a"])
    assert "Nearly matching" in text and "PackedGPTDataset-train" in text
    assert 'class "PackedGPTDataset" (this job: "GPTDataset")' in text
    assert "--packing best-fit" in text.split("HINT")[0]  # the value to give, before the hint


def test_a_prefix_written_otherwise_names_the_spelling_it_was_prepared_with(prepared):
    text = _error(prepared, blend=[os.path.abspath("data/a")], packing="best-fit")
    assert 'dataset_path "data/a" (this job: "' in text
    assert "write it as it was prepared" in text


@pytest.mark.parametrize(
    ("changed", "sizes", "words"),
    [
        ({"sequence_length": 8}, (150, 0, 0), "sequence_length 16 (this job: 8)"),
        ({}, (300, 0, 0), "num_samples 150 (this job: 300)"),
        ({"random_seed": 7}, (150, 0, 0), "random_seed 1234 (this job: 7)"),
    ],
)
def test_one_value_otherwise_is_named_with_both_values(prepared, changed, sizes, words):
    text = _error(prepared, sizes, blend=["data/a"], packing="best-fit", **changed)
    assert words in text
    assert "if the job meant the values of a cache found here" in text


def test_nothing_nearly_matching_leaves_the_error_as_it_was(prepared, tmp_path):
    empty = tmp_path / "other"
    empty.mkdir()
    text = _error(prepared, blend=["data/a"], packing="best-fit", path_to_cache=str(empty))
    assert "Nearly matching" not in text and "missing" in text
    # another prefix altogether (several values differ): no near miss either
    rng = np.random.default_rng(4)
    write_documents(tmp_path / "data" / "b", [rng.integers(1, 999, 9) for _ in range(300)])
    text = _error(prepared, (40, 0, 0), blend=["data/b"], sequence_length=8, random_seed=3)
    assert "Nearly matching" not in text
