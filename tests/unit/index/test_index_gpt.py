"""Epochs, document and shuffle indices, and the GPT builder on the spec's golden vectors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from index_reference import document_index_mgrid, num_epochs_loop, shuffle_index_concat

from tokenload.errors import ConfigError
from tokenload.index import (
    GPTIndexConfig,
    build_document_index,
    build_gpt_indices,
    build_shuffle_index,
    drop_last_for,
    gpt_length,
    num_epochs,
    plan_epochs,
    shuffle_index_dtype,
)

X = np.array([(i * 7) % 23 + 3 for i in range(20)], dtype=np.int32)  # spec §10 gold/x
CFG = GPTIndexConfig(sequence_length=8)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**6), st.one_of(st.none(), st.integers(0, 10**5)),
       st.integers(1, 4096), st.integers(0, 1))
def test_num_epochs_closed_form_equals_loop(tokens, num_samples, s, extra):
    if num_samples is not None and (num_samples * s + extra) // tokens > 10**4:
        num_samples = 10**4 * tokens // s  # keep the reference loop short
    ours = num_epochs(tokens_per_epoch=tokens, num_samples=num_samples, sequence_length=s,
                      extra=extra)
    assert ours == num_epochs_loop(tokens, num_samples, s, extra)


def test_empty_split_with_samples_raises_instead_of_looping():
    with pytest.raises(ConfigError, match="0 tokens"):
        num_epochs(tokens_per_epoch=0, num_samples=5, sequence_length=8, extra=1)
    assert num_epochs(tokens_per_epoch=0, num_samples=None, sequence_length=8, extra=1) == 1
    with pytest.raises(ConfigError):
        build_gpt_indices(X, np.arange(20, 20), num_samples=5, config=CFG)


def test_separate_final_epoch_rule():
    a = plan_epochs(tokens_per_epoch=221, num_samples=40, sequence_length=8, extra=1)
    assert (a.num_epochs, a.separate_final_epoch, a.samples_sans_final_epoch) == (2, True, 27)
    b = plan_epochs(tokens_per_epoch=221, num_samples=53, sequence_length=8, extra=1)
    assert (b.num_epochs, b.separate_final_epoch) == (2, False)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 50), st.integers(1, 4), st.booleans(), st.integers(0, 2**32 - 1))
def test_document_index_equals_mgrid_construction(n, epochs, separate, seed):
    docs = np.arange(7, 7 + n, dtype=np.int32)
    r1, r2 = np.random.RandomState(seed), np.random.RandomState(seed)
    ours = build_document_index(docs, epochs, r1, separate)
    ref = document_index_mgrid(docs, epochs, r2, separate)
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, ref)
    assert r1.randint(2**31) == r2.randint(2**31)  # generator left in the same state
    if separate and epochs > 1:  # the separate final epoch holds each document once
        np.testing.assert_array_equal(np.sort(ours[(epochs - 1) * n :]), docs)
    np.testing.assert_array_equal(np.sort(ours), np.repeat(docs, epochs))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 50), st.integers(1, 4), st.booleans(), st.integers(0, 2**32 - 1))
def test_document_index_drawn_in_the_end_of_a_larger_buffer_is_the_same(n, epochs, separate, seed):
    # the packed plan draws it in the end of its pieces' buffer (a view): the same draws
    docs = np.arange(3, 3 + n, dtype=np.int32)
    r1, r2 = np.random.RandomState(seed), np.random.RandomState(seed)
    buffer = np.full(epochs * n + 5, -7, dtype=np.int32)
    got = build_document_index(docs, epochs, r1, separate, out=buffer[5:])
    assert np.shares_memory(got, buffer)
    np.testing.assert_array_equal(buffer[5:], build_document_index(docs, epochs, r2, separate))
    assert (buffer[:5] == -7).all()  # nothing written before it
    assert r1.randint(2**31) == r2.randint(2**31)
    with pytest.raises(ValueError, match="int32 of shape"):
        build_document_index(docs, epochs, r1, separate, out=buffer)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 300), st.integers(0, 300), st.integers(0, 2**32 - 1))
def test_shuffle_index_equals_concatenation(a, b, seed):
    total = a + b
    r1, r2 = np.random.RandomState(seed), np.random.RandomState(seed)
    ours = build_shuffle_index(a, total, r1)
    ref = shuffle_index_concat(a, total, r2)
    assert ours.dtype == ref.dtype == np.uint32
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(np.sort(ours), np.arange(total))  # a permutation
    assert set(ours[:a].tolist()) == set(range(a))  # the tail is served last
    assert r1.randint(2**31) == r2.randint(2**31)


def test_shuffle_dtype_rule():
    assert shuffle_index_dtype(2**32 - 3) == np.uint32
    assert shuffle_index_dtype(2**32 - 2) == np.int64
    with pytest.raises(ConfigError):
        build_shuffle_index(5, 3, np.random.RandomState(0))


def test_golden_a():
    g = build_gpt_indices(X, np.arange(0, 16), num_samples=40, config=CFG)
    assert len(g) == 55 and g.epochs.num_epochs == 2 and g.epochs.separate_final_epoch
    assert g.document_index.tolist() == [13, 11, 0, 12, 14, 2, 10, 7, 1, 9, 8, 4, 5, 6, 3, 15,
                                         7, 4, 1, 13, 3, 9, 2, 12, 14, 11, 5, 0, 8, 15, 6, 10]
    assert g.sample_index.shape == (56, 2) and g.sample_index.dtype == np.int32
    assert g.sample_index[:8].tolist() == [[0, 0], [0, 8], [0, 16], [0, 24], [1, 7], [3, 1],
                                           [3, 9], [3, 17]]
    assert g.sample_index[-3:].tolist() == [[30, 8], [30, 16], [31, 2]]
    assert g.shuffle_index.dtype == np.uint32
    assert g.shuffle_index.tolist() == [
        26, 22, 5, 19, 8, 21, 17, 4, 24, 13, 15, 10, 14, 18, 20, 1, 12, 2, 25, 16, 23, 9, 0, 11,
        7, 3, 6, 34, 54, 48, 38, 31, 42, 46, 41, 50, 29, 28, 30, 37, 51, 49, 45, 33, 53, 35, 36,
        43, 40, 47, 52, 44, 32, 39, 27]


def test_golden_a_valid():
    cfg = GPTIndexConfig(sequence_length=8, drop_last=drop_last_for("valid"))
    g = build_gpt_indices(X, np.arange(16, 20), num_samples=5, config=cfg)
    assert len(g) == 8 and g.document_index.tolist() == [16, 17, 18, 19]
    assert g.sample_index.tolist() == [[0, 0], [0, 8], [0, 16], [1, 1], [2, 2], [2, 10], [3, 4],
                                       [3, 12], [3, 20]]
    assert g.shuffle_index.tolist() == [5, 2, 6, 3, 1, 0, 7, 4]


def test_golden_b():
    g = build_gpt_indices(X, np.arange(0, 16), num_samples=53, config=CFG)
    assert len(g) == 55 and not g.epochs.separate_final_epoch
    assert g.document_index.tolist() == [7, 10, 4, 1, 10, 8, 3, 7, 14, 13, 2, 12, 0, 2, 13, 9, 6,
                                         14, 5, 0, 11, 11, 9, 1, 15, 8, 4, 12, 5, 6, 3, 15]
    assert g.shuffle_index[:10].tolist() == [26, 51, 50, 0, 35, 30, 33, 41, 10, 39]


def test_golden_e_mock_train():
    lengths = np.random.default_rng(seed=0).integers(low=1, high=4096, size=100000,
                                                     dtype=np.int32)
    cfg = GPTIndexConfig(sequence_length=16)
    g = build_gpt_indices(lengths, np.arange(0, 33333), num_samples=10, config=cfg)
    assert len(g) == 4261893
    assert g.document_index[:8].tolist() == [30903, 11571, 3134, 32473, 27454, 4409, 3622, 19425]
    assert g.shuffle_index[:8].tolist() == [3676528, 3281704, 3802241, 3592248, 2555122, 1233235,
                                            1852167, 547312]
    for docs, n in (((33333, 66667), 4259983), ((66667, 100000), 4267941)):
        tokens = int(lengths[docs[0] : docs[1]].sum())
        assert gpt_length(tokens_per_epoch=tokens, num_samples=5, config=cfg) == n


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=20), st.integers(1, 16),
       st.one_of(st.none(), st.integers(0, 60)), st.booleans(), st.booleans())
def test_length_without_building_equals_built(lengths, s, num_samples, extra, drop_last):
    lengths = np.asarray(lengths, dtype=np.int32)
    cfg = GPTIndexConfig(sequence_length=s, add_extra_token=extra, drop_last=drop_last)
    tokens = int(lengths.sum())
    if tokens == 0 and num_samples is not None:
        return
    g = build_gpt_indices(lengths, np.arange(lengths.size), num_samples=num_samples, config=cfg)
    assert gpt_length(tokens_per_epoch=tokens, num_samples=num_samples, config=cfg) == len(g)
    if num_samples is not None:
        assert len(g) >= num_samples


def test_config_validation():
    for bad in ({"sequence_length": 0}, {"sequence_length": 8, "random_seed": -1},
                {"sequence_length": 8, "random_seed": 2**32}, {"sequence_length": 2.0}):
        with pytest.raises(ConfigError):
            GPTIndexConfig(**bad)
    with pytest.raises(ConfigError):
        build_gpt_indices(X, np.arange(0, 21), num_samples=1, config=CFG)  # id 20 is past the end
    with pytest.raises(ConfigError):
        build_gpt_indices(X, np.array([2**31], dtype=np.int64), num_samples=1, config=CFG)
