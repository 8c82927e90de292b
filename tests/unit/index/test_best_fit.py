"""Best-fit decreasing packing (index/packing.py) against a direct item-by-item implementation."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenload.index.packing import best_fit_decreasing, pack_block, split_documents


def reference_bfd(sizes: list[int], capacity: int, max_items: int | None) -> list[int]:
    """Item by item: largest first (ties in order), into the open row with the least room that
    fits it (ties: the oldest row), else a new row; a row with max_items items is closed."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    room: list[int] = []
    count: list[int] = []
    row_of = [0] * len(sizes)
    for i in order:
        s = sizes[i]
        best = -1
        for r in range(len(room)):
            fits = room[r] >= s and (max_items is None or count[r] < max_items)
            if fits and (best < 0 or room[r] < room[best]):
                best = r
        if best < 0:
            room.append(capacity)
            count.append(0)
            best = len(room) - 1
        room[best] -= s
        count[best] += 1
        row_of[i] = best
    return row_of


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 64).flatmap(
        lambda cap: st.tuples(
            st.just(cap),
            st.lists(st.integers(1, cap), max_size=200),
            st.none() | st.integers(1, 6),
        )
    )
)
def test_best_fit_decreasing_places_items_as_the_item_by_item_rule(case) -> None:
    capacity, sizes, max_items = case
    row_of, placement = best_fit_decreasing(np.array(sizes, dtype=np.int64), capacity, max_items)
    assert row_of.tolist() == reference_bfd(sizes, capacity, max_items)
    assert sorted(placement.tolist()) == list(range(len(sizes)))


def test_large_block_matches_reference() -> None:
    rng = np.random.default_rng(3)
    sizes = np.minimum(rng.lognormal(4, 1.2, 6000).astype(np.int64) + 1, 257)
    row_of, _ = best_fit_decreasing(sizes, 257, None)
    assert row_of.tolist() == reference_bfd(sizes.tolist(), 257, None)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 80), max_size=60),
    st.integers(2, 24),
    st.sampled_from([0, 1]),
    st.none() | st.integers(1, 4),
)
def test_pack_block_covers_every_token_once_and_never_cuts_short_documents(
    lengths, seq, extra, max_docs
) -> None:
    window = seq + extra
    plan = pack_block(np.array(lengths, dtype=np.int64), window, extra, max_docs)
    # rows never overflow and hold at most max_docs pieces
    assert (plan.row_tokens() <= window).all()
    if max_docs:
        assert (np.diff(plan.row_offsets) <= max_docs).all()
    for d, n in enumerate(lengths):
        mine = np.flatnonzero(plan.piece_doc == d)
        starts = plan.piece_start[mine]
        stops = starts + plan.piece_length[mine]
        if n == 0:
            assert mine.size == 0
            continue
        if n <= window:  # never cut
            assert mine.size == 1 and starts[0] == 0 and stops[0] == n
            continue
        # each token after the first is a label exactly once: as input position i with
        # label i + 1 inside a piece, the labels covered are [start + 1, stop)
        covered = np.zeros(n, dtype=np.int64)
        for a, b in zip(starts, stops, strict=True):
            assert b <= n and b - a <= window
            if extra:
                covered[a + 1 : b] += 1
            else:
                covered[a:b] += 1
        expect = np.ones(n, dtype=np.int64)
        if extra:
            expect[0] = 0
        assert covered.tolist() == expect.tolist()
    assert plan.cut_documents == sum(n > window for n in lengths)
    assert plan.padding == plan.num_rows * window - plan.piece_length.sum()


def test_split_documents_rejects_bad_windows() -> None:
    with pytest.raises(ValueError):
        split_documents(np.array([3]), 1, 1)
    with pytest.raises(ValueError):
        split_documents(np.array([-1]), 8, 1)


def test_padding_is_small_on_a_heavy_tailed_mix() -> None:
    rng = np.random.default_rng(0)
    lengths = np.maximum(rng.lognormal(np.log(400), 1.3, 20_000).astype(np.int64), 1)
    plan = pack_block(lengths, 2049, 1)
    assert plan.padding / (plan.num_rows * 2049) < 0.01


@given(
    lengths=st.lists(st.integers(0, 70), max_size=40),
    window=st.integers(2, 17),
    extra=st.integers(0, 1),
)
@settings(max_examples=300, deadline=None)
def test_split_documents_follows_the_rule_document_by_document(lengths, window, extra) -> None:
    """Each document, one by one: empty gives no piece; up to the window, one whole piece; longer,
    full windows every ``window - extra`` tokens, then the rest when it holds an input token."""
    stride = window - extra
    want = []
    for d, n in enumerate(lengths):
        if n == 0:
            continue
        if n <= window:
            want.append((d, 0, n))
            continue
        full = (n - extra) // stride
        want += [(d, k * stride, window) for k in range(full)]
        if n - full * stride > extra:
            want.append((d, full * stride, n - full * stride))
    got = split_documents(np.array(lengths, dtype=np.int64), window, extra)
    assert list(zip(got.doc.tolist(), got.start.tolist(), got.length.tolist())) == want


@pytest.mark.parametrize("window, cap", [(2049, None), (2049, 4), (8193, None)])
def test_pack_block_holds_few_arrays_of_its_pieces_at_its_peak(window, cap) -> None:
    """One block's packing is the Megatron-order build's working set beside the plan: its int64
    arrays of pieces (doc, start, length, placement, rows, the sort key, the result) are dropped
    as soon as done with: at most 10 of them live at once (8.6-9.7 here; 11.8-13.4 when each
    lived to the end of its function)."""
    rng = np.random.default_rng(0)
    lengths = np.maximum(rng.lognormal(np.log(400), 1.3, 1 << 16).astype(np.int64), 1)
    tracemalloc.start()
    try:
        plan = pack_block(lengths, window, 1, cap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 10 * 8 * plan.piece_doc.size, peak / plan.piece_doc.size


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 80), max_size=60), st.integers(2, 24), st.integers(0, 2**32))
def test_pack_block_lays_its_rows_in_the_order_asked(lengths, window, seed) -> None:
    """``row_order`` lays out the same rows (each with its pieces in the same order) at the places
    the permutation gives, as reordering the plan's rows afterwards would."""
    plain = pack_block(np.array(lengths, dtype=np.int64), window, 1)
    asked: list[np.ndarray] = []

    def order(rows: int) -> np.ndarray:
        asked.append(np.random.default_rng(seed).permutation(rows))
        return asked[-1]

    laid = pack_block(np.array(lengths, dtype=np.int64), window, 1, row_order=order)
    assert laid.num_rows == plain.num_rows
    if not plain.num_rows:
        return
    (perm,) = asked

    def row(plan, r: int) -> list[tuple[int, int, int]]:
        lo, hi = int(plan.row_offsets[r]), int(plan.row_offsets[r + 1])
        cols = (plan.piece_doc, plan.piece_start, plan.piece_length)
        return list(zip(*(c[lo:hi].tolist() for c in cols), strict=True))

    for place, r in enumerate(perm.tolist()):
        assert row(laid, place) == row(plain, r)
