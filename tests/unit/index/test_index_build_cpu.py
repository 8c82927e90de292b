"""The build's CPU shortcuts keep Megatron's exact arrays: the wide greedy loop on ties (its
many-block repairs are in test_index_blending), the sample index across chunks with clamped ends,
the per-thread reseeded RandomState, the chunked bincount."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from index_reference import (
    assert_same_blend,
    blending_loop,
    document_index_mgrid,
    sample_index_loop,
    shuffle_index_concat,
)

from tokenload.errors import ConfigError
from tokenload.index import (
    GPTIndexConfig,
    blending,
    build_blending_indices,
    build_gpt_indices,
    check_oversampling,
)
from tokenload.index import sample as sample_module
from tokenload.index.gpt import seeded_random_state
from tokenload.index.sample import build_sample_index


def test_wide_greedy_with_equal_weights_breaks_ties_to_the_lowest_index():
    w = [1 / 12] * 12
    di, dsi = build_blending_indices(w, 1200)
    assert di.tolist() == list(range(12)) * 100
    assert_same_blend((di, dsi), blending_loop(w, 1200))


@pytest.mark.parametrize("extra,drop_last", [(1, True), (0, True), (1, False), (0, False)])
def test_sample_index_across_chunks_matches_the_walk(extra, drop_last, monkeypatch):
    """Chunks of 7 documents: the running offset crosses every chunk boundary, and the first
    chunk's ends start at -1 // S (clamped to 0) with empty documents in front."""
    monkeypatch.setattr(sample_module, "_CHUNK", 7)
    rng = np.random.default_rng(extra * 2 + drop_last)
    lengths = rng.integers(0, 40, 300).astype(np.int32)
    lengths[:5] = 0
    docs = np.concatenate([np.arange(5), rng.permutation(np.arange(5, 300))]).astype(np.int32)
    for s in (1, 3, 16, 50):
        kw = dict(sequence_length=s, num_epochs=1, tokens_per_epoch=int(lengths.sum()))
        ours = build_sample_index(lengths, docs, drop_last=drop_last, extra=extra, **kw)
        ref = sample_index_loop(lengths, docs, s, 1, kw["tokens_per_epoch"], drop_last, extra)
        np.testing.assert_array_equal(ours, ref)


def test_sample_index_takes_int64_lengths_unchanged():
    lengths = np.array([5, 0, 9, 3, 12], dtype=np.int64)
    docs = np.array([4, 2, 0, 1, 3], dtype=np.int32)
    ours = build_sample_index(lengths, docs, sequence_length=4, num_epochs=1, tokens_per_epoch=29)
    np.testing.assert_array_equal(ours, sample_index_loop(lengths, docs, 4, 1, 29, True, 1))


def test_reseeded_random_state_is_a_fresh_one():
    used = seeded_random_state(7)
    used.randint(1 << 30, size=100)
    used.standard_normal(3)  # a cached Gaussian must not survive the reseed
    again = seeded_random_state(7)
    fresh = np.random.RandomState(7)
    np.testing.assert_array_equal(again.randint(1 << 30, size=50), fresh.randint(1 << 30, size=50))
    assert again.standard_normal() == fresh.standard_normal()


def test_gpt_builds_in_threads_equal_megatron_order():
    """Builds run in the builder's thread pool: each thread's generator is its own."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 3000, 4000).astype(np.int32)
    cfg = GPTIndexConfig(sequence_length=512, random_seed=1234)
    ranges = [(0, 1000), (1000, 2500), (2500, 4000), (0, 4000)] * 3

    def build(r):
        return build_gpt_indices(lengths, np.arange(*r, dtype=np.int32), num_samples=3000, config=cfg)

    with ThreadPoolExecutor(4) as pool:
        built = list(pool.map(build, ranges))
    for r, got in zip(ranges, built):
        docs = np.arange(*r, dtype=np.int32)
        ref_rng = np.random.RandomState(1234)
        epochs = got.epochs
        doc_ref = document_index_mgrid(docs, epochs.num_epochs, ref_rng, epochs.separate_final_epoch)
        np.testing.assert_array_equal(got.document_index, doc_ref)
        total = got.sample_index.shape[0] - 1
        split = epochs.samples_sans_final_epoch if epochs.separate_final_epoch else total
        np.testing.assert_array_equal(got.shuffle_index, shuffle_index_concat(split, total, ref_rng))


def test_oversampling_counts_across_bincount_chunks(monkeypatch):
    monkeypatch.setattr(blending, "_BINCOUNT_CHUNK", 4)
    di = np.array([0, 1, 1, 2, 1, 0, 2, 2, 1, 1, 0], dtype=np.int16)  # counts 3, 5, 3
    check_oversampling(di, [3, 5, 3])
    with pytest.raises(ConfigError, match="draws 5 samples from dataset 1, which holds 4"):
        check_oversampling(di, [3, 4, 3])
    with pytest.raises(ConfigError, match="refers to dataset 2; expected ids below 2"):
        check_oversampling(di, [3, 5])
