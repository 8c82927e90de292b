"""The computed order's maths: windows, window orders, the periodic interleave and mixture phases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenload.errors import ConfigError, StateError
from tokenload.format import TokenFile
from tokenload.index import build_blending_indices
from tokenload.index.interleave import Interleave, period_counts, token_weights
from tokenload.index.mixture import Mixture, MixtureState, resume
from tokenload.index.splits import split_matrix, split_ranges
from tokenload.index.window_order import WindowOrder
from tokenload.index.windows import WindowGrid, search_right, window_pieces

PRIMES = [3, 5, 7, 13, 31, 97, 127, 257, 1021, 4099, 65537]
BLOCKS = [None, 1, 2, 3, 7, 16, 64, 1000]


# -- window orders ----------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", BLOCKS)
@pytest.mark.parametrize("n", [1, 2, 4, 64, 100, 4096, *PRIMES])
def test_every_epoch_visits_every_window_once(n, block_size):
    order = WindowOrder(n, seed=1234, block_size=block_size)
    for epoch in (0, 1, 7):
        windows = order.epoch_windows(np.arange(n), epoch)
        assert windows.dtype == np.int64
        np.testing.assert_array_equal(np.sort(windows), np.arange(n))


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 5000),
    block_size=st.one_of(st.none(), st.integers(1, 300)),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 10**6),
)
def test_permutation_property(n, block_size, seed, epoch):
    windows = WindowOrder(n, seed, block_size=block_size).epoch_windows(np.arange(n), epoch)
    np.testing.assert_array_equal(np.sort(windows), np.arange(n))


def test_global_samples_run_epoch_after_epoch_each_with_its_own_order():
    order = WindowOrder(50, seed=3, block_size=8)
    k = np.arange(150)
    windows = order.global_windows(k)
    epochs = windows.reshape(3, 50)
    for e in range(3):
        np.testing.assert_array_equal(epochs[e], order.epoch_windows(np.arange(50), e))
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    np.testing.assert_array_equal(order.global_windows(k[::-1]), windows[::-1])  # any order, any mix of epochs


@pytest.mark.parametrize("n", [1000, 1003])
def test_block_mode_reads_stay_local(n):
    size = 16
    windows = WindowOrder(n, seed=9, block_size=size).epoch_windows(np.arange(n), 0)
    blocks = windows // size
    for micro in (1, 8, 16, 32):
        for begin in range(0, n - micro + 1, micro):
            assert np.unique(blocks[begin : begin + micro]).size <= -(-micro // size) + 1


def test_ten_billion_windows_need_no_table():
    n = 10_000_000_000
    for block_size in (None, 64):
        order = WindowOrder(n, seed=1, block_size=block_size)
        k = np.concatenate([np.arange(4096), n - 1 - np.arange(4096), 3 * n + np.arange(4096)])
        w = order.global_windows(k)
        assert w.min() >= 0 and w.max() < n
        assert np.unique(w[:8192]).size == 8192  # one epoch's positions: distinct windows


def test_window_order_refuses_bad_sizes():
    with pytest.raises(ConfigError, match="0 windows"):
        WindowOrder(0, seed=1)
    with pytest.raises(ConfigError, match="block_size"):
        WindowOrder(10, seed=1, block_size=0)
    with pytest.raises(IndexError):
        WindowOrder(10, seed=1).epoch_windows([10], 0)


# -- windows of a split -----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.integers(-5, 5), min_size=0, max_size=60).map(sorted),
    targets=st.lists(st.integers(-7, 7), max_size=20),
    offset=st.integers(0, 7),
)
def test_search_right_is_searchsorted_without_a_copy(values, targets, offset):
    raw = np.zeros(len(values) * 8 + 8, dtype=np.uint8)
    sorted_values = np.frombuffer(raw.data, dtype=np.int64, count=len(values), offset=offset) if offset else None
    if sorted_values is None:
        sorted_values = np.array(values, dtype=np.int64)
    else:  # unaligned, as the .idx pointers always are
        raw[offset : offset + 8 * len(values)] = np.array(values, dtype="<i8").view(np.uint8)
    lo = len(values) // 3
    got = search_right(sorted_values, np.array(targets, dtype=np.int64), lo, len(values))
    np.testing.assert_array_equal(got, np.searchsorted(np.array(values[lo:]), targets, "right") + lo)


@pytest.mark.parametrize("split", ["1", "60,30,10", "5,90,5"])
@pytest.mark.parametrize(("seq", "extra"), [(1, 0), (1, 1), (7, 1), (64, 0), (100, 1)])
def test_windows_read_the_split_stream_and_pieces_match_spans(random_file, split, seq, extra):
    prefix, docs = random_file
    tf = TokenFile(prefix)
    stream = np.concatenate(docs)
    for begin, end in (r for r in split_ranges(split_matrix(split), len(tf)) if r is not None):
        pointers, lengths, size = tf.sequence_pointers, tf.sequence_lengths, tf.dtype.itemsize
        grid = WindowGrid.from_pointers(pointers, lengths, size, begin, end, seq, extra)
        tokens = sum(len(d) for d in docs[begin:end])
        assert grid.num_windows == max(tokens - extra, 0) // seq
        if not grid.num_windows:
            continue
        w = np.random.default_rng(0).integers(0, grid.num_windows, size=50)
        spans = tf.read_spans(grid.starts(w), np.full(w.size, grid.window)).reshape(w.size, grid.window)
        first_token = sum(len(d) for d in docs[:begin])
        expected = stream[first_token + w[:, None] * seq + np.arange(grid.window)]
        np.testing.assert_array_equal(spans, expected)
        seqs, first, piece_lengths, offsets = window_pieces(grid, w, pointers, lengths, size, begin, end)
        assert ((seqs >= begin) & (seqs < end)).all() and (piece_lengths >= 0).all()
        np.testing.assert_array_equal(np.add.reduceat(piece_lengths, first), np.full(w.size, grid.window))
        starts = np.zeros_like(piece_lengths)
        starts[first] = offsets
        np.testing.assert_array_equal(tf.read_pieces(seqs, starts, piece_lengths), expected.ravel())


def test_pieces_name_the_document_boundaries_inside_a_window(small_file):
    tf = TokenFile(small_file)  # sequences of 5, 2, 1, 1 tokens
    grid = WindowGrid.from_pointers(tf.sequence_pointers, tf.sequence_lengths, tf.dtype.itemsize, 0, 4, 3, 1)
    assert grid.num_windows == 2  # 9 tokens: windows [0, 4) and [3, 7)
    seqs, first, lengths, offsets = window_pieces(grid, [0, 1], tf.sequence_pointers, tf.sequence_lengths, 2, 0, 4)
    assert seqs.tolist() == [0, 0, 1] and first.tolist() == [0, 1]
    assert lengths.tolist() == [4, 2, 2] and offsets.tolist() == [0, 3]


def test_a_split_shorter_than_a_window_has_no_windows():
    grid = WindowGrid.from_pointers(np.array([0, 8]), np.array([4, 0]), 2, 0, 2, 4, 1)
    assert grid.num_tokens == 4 and grid.num_windows == 0
    assert WindowGrid.from_pointers(np.array([0]), np.array([4]), 2, 1, 1, 4, 1).num_windows == 0


# -- the interleave ---------------------------------------------------------------------------------

weights_st = st.lists(st.one_of(st.just(0.0), st.floats(0.001, 1.0)), min_size=1, max_size=9).filter(
    lambda w: sum(w) > 0
)


@settings(max_examples=300, deadline=None)
@given(weights=weights_st, period=st.integers(1, 400))
def test_interleave_stays_within_one_sample_of_its_weights_at_every_prefix(weights, period):
    try:
        inter = Interleave(weights, period=period)
    except ConfigError:  # a positive weight below one sample per period
        w = np.array(weights) / sum(weights)
        assert (w[w > 0] * period < 1).any()
        return
    m = np.arange(1, 3 * period + 1)
    source, cursor = inter(m - 1)
    onehot = source[:, None] == np.arange(len(weights))[None, :]
    counts = np.cumsum(onehot, axis=0)
    share = inter.counts / period
    assert (np.abs(counts - m[:, None] * share) < 1).all()  # the stated bound
    w = np.array(weights) / sum(weights)
    assert (np.abs(counts - m[:, None] * w) < 1 + m[:, None] * np.abs(share - w) + 1e-9).all()
    assert (np.abs(inter.counts - period * w) < 1).all() and inter.counts.sum() == period
    np.testing.assert_array_equal(counts[period - 1], inter.counts)
    # a source's k-th sample is its cursor k: the cursors of each source run 0, 1, 2, ...
    expected_cursor = counts[np.arange(m.size), source] - 1
    np.testing.assert_array_equal(cursor, expected_cursor)
    for prefix in (0, 1, period - 1, period, 2 * period + 1):
        np.testing.assert_array_equal(inter.consumed(prefix), counts[prefix - 1] if prefix else 0)


def test_interleave_holds_where_the_greedy_falls_more_than_one_behind():
    weights, n = [0.9, 0.05, 0.05], 1000
    prefix = np.arange(1, n + 1)[:, None]
    greedy, _ = build_blending_indices(weights, n)  # Megatron's greedy max-error rule
    greedy_counts = np.cumsum(greedy[:, None] == np.arange(3)[None, :], axis=0)
    assert (prefix * np.array(weights) - greedy_counts).max() > 1.19
    source, _ = Interleave(weights, period=100)(np.arange(n))
    counts = np.cumsum(source[:, None] == np.arange(3)[None, :], axis=0)
    assert (np.abs(counts - prefix * np.array(weights)) < 1).all()


def test_token_weights_and_refusals():
    np.testing.assert_allclose(token_weights([1, 1], [2048, 1024]), [1 / 3, 2 / 3])
    assert period_counts([1, 1, 1], 10).tolist() == [4, 3, 3]
    with pytest.raises(ConfigError, match="period of at least 1000"):
        Interleave([0.999, 0.001], period=100)
    for bad in ([], [0, 0], [1, -1], [1, float("nan")]):
        with pytest.raises(ConfigError):
            Interleave(bad)


# -- ranks, workers and mixture changes -------------------------------------------------------------


def test_global_samples_are_the_same_on_any_number_of_ranks():
    mix = Mixture(["a", "b", "c"], [0.5, 0.3, 0.2], [97, 64, 5], seed=7, period=100, block_size=8)
    total = 3000
    whole = mix.draw(np.arange(total))
    for ranks in (1, 3, 8):
        per_rank = [mix.draw(np.arange(r, total, ranks)) for r in range(ranks)]
        for r, draws in enumerate(per_rank):
            for field in ("source", "cursor", "window"):
                np.testing.assert_array_equal(getattr(draws, field), getattr(whole, field)[r::ranks])


@settings(max_examples=50, deadline=None)
@given(cuts=st.lists(st.integers(0, 2000), max_size=12), block=st.one_of(st.none(), st.integers(1, 40)))
def test_any_worker_split_gives_the_same_samples(cuts, block):
    mix = Mixture(["x", "y"], [2, 1], [300, 41], seed=11, period=30, block_size=block)
    k = np.arange(2000)
    whole = mix.draw(k)
    bounds = [0, *sorted(cuts), 2000]
    parts = [mix.draw(k[a:b]) for a, b in itertools.pairwise(bounds)]
    np.testing.assert_array_equal(np.concatenate([p.window for p in parts]), whole.window)
    np.testing.assert_array_equal(np.concatenate([p.source for p in parts]), whole.source)


phase_st = st.tuples(
    st.lists(st.sampled_from("abcde"), min_size=1, max_size=5, unique=True),
    st.lists(st.integers(1, 9), min_size=5, max_size=5),
    st.integers(0, 300),
)


@settings(max_examples=100, deadline=None)
@given(phases=st.lists(phase_st, min_size=1, max_size=5), block=st.one_of(st.none(), st.integers(1, 9)))
def test_mixture_changes_never_repeat_or_skip_a_sample(phases, block):
    windows = {"a": 13, "b": 7, "c": 40, "d": 1, "e": 29}
    state = MixtureState(consumed=0)
    served: dict[str, list[tuple[int, int]]] = {s: [] for s in windows}
    for names, weights, length in phases:
        counts = [windows[s] for s in names]
        mix = resume(state, names, weights[: len(names)], counts, seed=5, period=40, block_size=block)
        draws = mix.draw(np.arange(state.consumed, state.consumed + length))
        for d, c, w in zip(draws.source.tolist(), draws.cursor.tolist(), draws.window.tolist()):
            served[names[d]].append((c, w))
        state = MixtureState.from_dict(mix.state(state.consumed + length).to_dict())  # through JSON
    for s, items in served.items():
        cursors = sorted(c for c, _ in items)
        assert cursors == list(range(len(items)))  # none repeated, none skipped
        assert state.cursors.get(s, 0) == len(items)
        by_epoch: dict[int, list[int]] = {}
        for c, w in items:
            by_epoch.setdefault(c // windows[s], []).append(w)
        for _epoch, ws in by_epoch.items():
            assert len(set(ws)) == len(ws)  # no window twice within an epoch
            if len(ws) == windows[s]:
                assert sorted(ws) == list(range(windows[s]))  # a whole epoch: every window


def test_new_weights_hold_from_the_first_sample_of_the_new_phase():
    first = Mixture(["a", "b"], [1, 1], [1000, 1000], seed=1, period=10)
    state = first.state(37)
    second = resume(state, ["a", "b", "c"], [1, 2, 7], [1000, 1000, 1000], seed=1, period=10)
    draws = second.draw(np.arange(37, 37 + 100))
    counts = np.cumsum(draws.source[:, None] == np.arange(3)[None, :], axis=0)
    assert (np.abs(counts - np.arange(1, 101)[:, None] * np.array([0.1, 0.2, 0.7])) < 1).all()
    assert draws.cursor[draws.source == 0][0] == state.cursors["a"]
    assert draws.cursor[draws.source == 2][0] == 0


def test_a_removed_source_keeps_its_cursor_for_when_it_returns():
    state = Mixture(["a", "b"], [1, 1], [50, 50], seed=2, period=2).state(20)
    without_b = resume(state, ["a"], [1], [50], seed=2).state(30)
    assert without_b.cursors == {"a": 20, "b": 10}
    back = resume(without_b, ["a", "b"], [1, 1], [50, 50], seed=2, period=2)
    assert back.draw(np.arange(30, 32)).cursor.tolist() == [20, 10]


def test_mixture_state_errors():
    state = Mixture(["a"], [1], [50], seed=2).state(5)
    with pytest.raises(StateError, match="50 windows"):
        resume(state, ["a"], [1], [49], seed=2)
    with pytest.raises(StateError, match="malformed"):
        MixtureState.from_dict({"consumed": 3})
    with pytest.raises(StateError, match="negative"):
        MixtureState.from_dict({"consumed": -1, "sources": {}})
    with pytest.raises(ConfigError, match="distinct"):
        Mixture(["a", "a"], [1, 1], [5, 5], seed=1)
    with pytest.raises(IndexError):
        resume(state, ["a"], [1], [50], seed=2).draw([4])
