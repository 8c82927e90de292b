"""Blending indices against pure-Python ports of Megatron's greedy loops."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from index_reference import assert_same_blend, blending_loop, exhaustive_loop

from tokenload.errors import ConfigError
from tokenload.index import (
    blending,
    build_blending_indices,
    build_exhaustive_blending_indices,
    check_oversampling,
)


def test_spec_golden_c():
    di, dsi = build_blending_indices([0.3, 0.7], 40)
    assert di.tolist() == [1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1,
                           0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1]
    assert dsi.tolist() == [0, 0, 1, 2, 1, 3, 4, 2, 5, 6, 3, 7, 8, 9, 4, 10, 11, 5, 12, 13, 6, 14,
                            15, 16, 7, 17, 18, 8, 19, 20, 9, 21, 22, 23, 10, 24, 25, 11, 26, 27]
    assert build_blending_indices([0.3, 0.7], 6)[0].tolist() == [1, 0, 1, 1, 0, 1]


def test_spec_golden_d_exhaustive():
    di, dsi = build_exhaustive_blending_indices([35, 63])
    assert di.shape == (98,)
    assert di[:18].tolist() == [1, 0, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 0, 1, 1, 0]
    assert np.bincount(di).tolist() == [35, 63]
    for d in (0, 1):  # every sample of every dataset exactly once, in order
        assert dsi[di == d].tolist() == list(range([35, 63][d]))


def test_ties_go_to_the_lowest_index():
    assert build_blending_indices([0.5, 0.5], 4)[0].tolist() == [0, 1, 0, 1]
    assert build_blending_indices([0.25, 0.25, 0.25, 0.25], 8)[0].tolist() == [0, 1, 2, 3] * 2


def test_step_zero_and_one_both_use_one():
    """kd = max(k, 1): steps 0 and 1 compare the same quotas."""
    assert_same_blend(build_blending_indices([0.6, 0.4], 3), blending_loop([0.6, 0.4], 3))


weights_st = st.lists(st.floats(0.01, 10.0), min_size=1, max_size=6).map(
    lambda w: (np.array(w) / np.sum(w)).tolist()
)


@settings(max_examples=60, deadline=None)
@given(weights_st, st.integers(0, 3000))
def test_greedy_matches_loop(weights, size):
    assert_same_blend(build_blending_indices(weights, size), blending_loop(weights, size))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=1, max_size=6))
def test_exhaustive_matches_loop(sizes):
    assert_same_blend(build_exhaustive_blending_indices(sizes), exhaustive_loop(sizes))


@pytest.mark.parametrize("d", [17, 40])
def test_many_datasets_layout_matches_loop(d):
    rng = np.random.default_rng(d)
    w = rng.lognormal(0, 1, d)
    w = (w / w.sum()).tolist()
    assert_same_blend(build_blending_indices(w, 6000), blending_loop(w, 6000))
    sizes = rng.integers(1, 200, d).tolist()
    assert_same_blend(build_exhaustive_blending_indices(sizes), exhaustive_loop(sizes))


def test_repair_rounds_fix_every_bad_guess(monkeypatch):
    """With no burn-in almost every block starts from a wrong guess; the check must catch each
    one and the repair must still give the loop's exact result."""
    monkeypatch.setattr(blending, "_burn_in", lambda w: 1)
    monkeypatch.setattr(blending, "_LANES", 64)
    rng = np.random.default_rng(0)
    for d in (2, 3, 7, 20, 64, 130):  # more than 8: the wide loop, its frozen lane included
        w = rng.lognormal(0, 2, d)
        w = (w / w.sum()).tolist()
        assert_same_blend(build_blending_indices(w, 5000), blending_loop(w, 5000))
        sizes = rng.integers(1, 900, d).tolist()
        assert_same_blend(build_exhaustive_blending_indices(sizes), exhaustive_loop(sizes))


def test_unnormalized_weights_still_match_the_loop():
    assert_same_blend(build_blending_indices([30.0, 70.0], 3000), blending_loop([30.0, 70.0], 3000))
    assert_same_blend(build_blending_indices([3.0, 1.0, 2.0], 3000), blending_loop([3.0, 1.0, 2.0], 3000))


def test_guess_counts_sum_to_the_step():
    w = np.array([0.2, 0.5, 0.3])
    starts = np.array([0, 1, 7, 1000, 12345], dtype=np.int64)
    counts = blending._guess_counts(w, None, starts)
    assert counts.sum(axis=0).tolist() == starts.tolist()


@settings(max_examples=40, deadline=None)
@given(weights_st, st.integers(1, 4000))
def test_counts_track_the_weights(weights, size):
    """At every prefix k no dataset is ever more than one sample ahead of w*k. (Behind it can
    fall further than one: with 3 datasets the greedy lags up to ~1.3 samples, measured.)"""
    di, _ = build_blending_indices(weights, size)
    counts = np.cumsum(np.eye(len(weights), dtype=np.int64)[di], axis=0)
    k = np.arange(1, size + 1)[:, None]
    assert np.all(counts - k * np.asarray(weights)[None, :] < 1 + 1e-9)
    if len(weights) == 2:  # two datasets: within one either way
        assert np.all(np.abs(counts - k * np.asarray(weights)[None, :]) < 1 + 1e-9)


def test_errors():
    for bad in ([], [0.5, 0.0], [1.0, -1.0], [float("nan")], [[0.5, 0.5]]):
        with pytest.raises(ConfigError):
            build_blending_indices(bad, 10)
    with pytest.raises(ConfigError):
        build_blending_indices([1.0], -1)
    with pytest.raises(ConfigError):
        build_blending_indices([1.0] * 32767, 1)  # dataset_index is int16
    with pytest.raises(ConfigError):
        build_exhaustive_blending_indices([3, 0])
    with pytest.raises(ConfigError):
        build_exhaustive_blending_indices([1.5, 2.5])


def test_oversampling_is_a_config_error():
    di, _ = build_blending_indices([0.5, 0.5], 10)
    check_oversampling(di, [5, 5])
    with pytest.raises(ConfigError, match="mid_level_dataset_surplus"):
        check_oversampling(di, [5, 4], "valid")
