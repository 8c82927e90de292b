"""The EDF (which may stop after a prefix) and ``interleave.consumed`` (which schedules no
prefix at all) against the original heap walk, kept here as the reference: the same period,
sample for sample, for many random weight vectors (zeros, extreme ratios, small and large
periods), and the same counts after any prefix."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from tokenload.errors import ConfigError
from tokenload.index.interleave import Interleave, consumed, period_counts


def reference_edf(counts: np.ndarray, period: int) -> np.ndarray:
    """The EDF of interleave.py at commit 174cec9 (before issue 26's startup fix), same logic."""
    out = np.empty(period, dtype=np.int32)
    pending = [(0, d) for d in np.flatnonzero(counts).tolist()]
    heapq.heapify(pending)
    ready: list[tuple[int, int]] = []
    served = [0] * counts.size
    c = counts.tolist()
    for slot in range(period):
        while pending and pending[0][0] <= slot:
            d = heapq.heappop(pending)[1]
            heapq.heappush(ready, (((served[d] + 1) * period - 1) // c[d], d))
        due, d = heapq.heappop(ready)
        assert due >= slot
        out[slot] = d
        served[d] += 1
        if served[d] < c[d]:
            heapq.heappush(pending, ((served[d] * period) // c[d], d))
    return out


def random_weights(rng: np.random.Generator) -> np.ndarray:
    n = int(rng.integers(1, 9))
    kind = rng.integers(0, 4)
    if kind == 0:
        w = rng.random(n)
    elif kind == 1:  # extreme ratios
        w = 10.0 ** rng.uniform(-4, 0, size=n)
    elif kind == 2:  # small integers, many ties
        w = rng.integers(0, 5, size=n).astype(float)
    else:  # one dominant source
        w = rng.random(n) * 1e-3
        w[rng.integers(n)] = 1.0
    w[rng.random(n) < 0.25] = 0.0  # inactive sources
    if w.sum() <= 0:
        w[0] = 1.0
    return w


def reference_ranks(sources: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each slot's samples of its source in the slots before (the original construction)."""
    order = np.argsort(sources, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ranks = np.empty(sources.size, dtype=np.int32)
    ranks[order] = np.arange(sources.size, dtype=np.int32) - np.repeat(starts, counts)
    return ranks


@pytest.mark.parametrize("chunk", [None, 3, 7, 64])
def test_tables_built_by_chunks_are_the_reference_sample_for_sample(monkeypatch, chunk):
    """The period's tables, built chunk by chunk as random samples first read them (EDF from
    each chunk's first slot, whose state is counted in closed form), are the reference's."""
    import tokenload.index.interleave as mod

    if chunk is not None:
        monkeypatch.setattr(mod, "_CHUNK", chunk)
    rng = np.random.default_rng(26 + (chunk or 0))
    checked = 0
    while checked < 150:
        w = random_weights(rng) if rng.random() < 0.7 else many_weights(rng)
        period = int(rng.choice([1, 2, 3, 7, 64, 1000, 4099, 1 << 13]))
        try:
            counts = period_counts(w, period)
        except ConfigError:
            continue
        want = reference_edf(counts, period)
        inter = Interleave(w, period=period)
        for _ in range(3):  # a few batches first: only their chunks are built
            first = int(rng.integers(0, 3 * period))
            k = np.arange(first, first + int(rng.integers(1, 40)))
            source, cursor = inter(k)
            np.testing.assert_array_equal(source, want[k % period])
            counted = np.array(
                [np.count_nonzero(want[: j % period] == want[j % period]) for j in k.tolist()]
            )
            np.testing.assert_array_equal(cursor, (k // period) * counts[source] + counted)
        assert np.array_equal(inter.sources, want), (w.tolist(), period)
        assert np.array_equal(inter.ranks, reference_ranks(want, counts))
        checked += 1


def test_a_batch_builds_only_the_chunks_it_reads(monkeypatch):
    import tokenload.index.interleave as mod

    walked = []
    walk = mod._walk

    def counting(counts, period, start, served, stop, sources, ranks):
        walked.append((start, stop))
        return walk(counts, period, start, served, stop, sources, ranks)

    monkeypatch.setattr(mod, "_walk", counting)
    inter = Interleave([5, 3, 2])
    inter(np.arange(66_656, 66_672))  # slots 1120..1135 of the second period
    first = 1120 // mod._CHUNK * mod._CHUNK
    assert walked == [(first, first + mod._CHUNK)]
    inter(np.arange(2 * 65_536 - 4, 2 * 65_536 + 4))  # across a period's end
    assert walked[1:] == [(65_536 - mod._CHUNK, 65_536), (0, mod._CHUNK)][: len(walked) - 1]
    assert len(walked) == 2 + (first != 0)  # the first chunk is built unless it already was
    assert not inter._complete
    inter.sources  # everything
    assert len(walked) == 65_536 // mod._CHUNK and inter._complete


@pytest.mark.parametrize(
    "weights", [[5, 3, 2], [1, 0, 1e-4, 2], [0.999, 1e-3], [1, 1, 1, 1, 1, 1, 1], [2, 0]]
)
def test_tables_match_at_the_default_period(weights):
    counts = period_counts(weights, 1 << 16)
    want = reference_edf(counts, 1 << 16)
    inter = Interleave(weights)
    assert np.array_equal(inter.sources, want)
    assert np.array_equal(inter.ranks, reference_ranks(want, counts))


def test_consumed_without_the_period_equals_the_interleave():
    rng = np.random.default_rng(7)
    for _ in range(40):
        w = random_weights(rng)
        period = int(rng.choice([5, 333, 4096]))
        try:
            inter = Interleave(w, period=period)
        except ConfigError:
            continue
        for n in [0, 1, period - 1, period, period + 1, *rng.integers(0, 10 * period, 5)]:
            got = consumed(w, int(n), period=period)
            assert got.dtype == np.int64
            assert np.array_equal(got, inter.consumed(int(n))), (w.tolist(), period, n)


def test_consumed_refuses_what_the_interleave_refuses():
    with pytest.raises(ConfigError):
        consumed([1, 1e-9], 10, period=1 << 16)
    with pytest.raises(ValueError):
        consumed([1, 1], -1)


def many_weights(rng: np.random.Generator) -> np.ndarray:
    """8-24 sources of unequal weights, sometimes one or two tiny ones (a long span)."""
    w = rng.random(int(rng.integers(8, 25))) + 0.05
    if rng.random() < 0.3:
        w[rng.integers(w.size, size=2)] = 10.0 ** rng.uniform(-4, -2, size=2)
    return w


@pytest.mark.parametrize("span", ["python", "numpy"])
def test_prefix_counts_are_the_reference_prefix_without_any_walk(monkeypatch, span):
    """``_prefix_counts`` (the closed count of the module's docstring) against the counts of the
    reference EDF's prefix, for few and many sources, counted in Python or with NumPy (every
    span), and no EDF walk at all."""
    import tokenload.index.interleave as mod

    def no_walk(*args, **kwargs):
        raise AssertionError("the prefix count walked EDF")

    monkeypatch.setattr(mod, "_walk", no_walk)
    if span == "numpy":
        monkeypatch.setattr(mod, "_PYTHON_SPAN", -1)
    rng = np.random.default_rng(11)
    checked = 0
    while checked < 2500:
        w = random_weights(rng) if rng.random() < 0.6 else many_weights(rng)
        period = int(rng.choice([1, 7, 100, 1024, 4099, 1 << 14]))
        try:
            counts = period_counts(w, period)
        except ConfigError:
            continue
        full = reference_edf(counts, period)
        for slots in [0, 1, period - 1, period, *rng.integers(0, period + 1, size=6).tolist()]:
            got = mod._prefix_counts(counts, period, int(slots))
            want = np.bincount(full[:slots], minlength=counts.size)
            assert got.dtype == np.int64
            assert np.array_equal(got, want), (w.tolist(), period, slots)
            checked += 1


def test_prefix_counts_at_every_slot_of_small_periods():
    """Every prefix of many small periods (every tie and boundary the rounding makes)."""
    import tokenload.index.interleave as mod

    rng = np.random.default_rng(5)
    for period in [2, 5, 12, 31, 64, 97]:
        for _ in range(60):
            w = rng.random(int(rng.integers(2, 9)))
            w[rng.random(w.size) < 0.2] = 0.0
            if w.sum() <= 0:
                w[0] = 1.0
            try:
                counts = period_counts(w, period)
            except ConfigError:
                continue
            full = reference_edf(counts, period)
            for slots in range(period + 1):
                want = np.bincount(full[:slots], minlength=counts.size)
                assert np.array_equal(mod._prefix_counts(counts, period, slots), want)


@pytest.mark.parametrize(
    "weights",
    [
        [1] * 8,
        [1] * 7,
        list(range(1, 13)),
        [3, 3, 3, 3, 2, 2, 1, 1, 1],
        [1, 1e-3, 1e-2, 0.5, 0.2, 0.3, 0.7, 0.11, 0.13, 0.17],
    ],
)
def test_prefix_counts_with_many_sources_at_the_default_period(weights):
    """The sets that made the earlier count fall back to scheduling the prefix (10-12 sources
    of unequal weights) at the default period, where the runs are long."""
    import tokenload.index.interleave as mod

    period = 1 << 16
    counts = period_counts(weights, period)
    full = reference_edf(counts, period)
    for slots in np.random.default_rng(len(weights)).integers(0, period + 1, size=40).tolist():
        got = mod._prefix_counts(counts, period, int(slots))
        assert np.array_equal(got, np.bincount(full[:slots], minlength=counts.size)), slots


def reference_period_counts(weights, period: int) -> np.ndarray:
    """``period_counts`` before the schedule's startup work (NumPy rounding), the reference."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    exact = w * period
    counts = np.floor(exact).astype(np.int64)
    short = period - int(counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts


def test_period_counts_are_the_reference_rounding():
    """The rounding done in Python (faster for one weight vector per schedule entry) gives the
    reference's counts: every remainder tie broken by source the same way."""
    rng = np.random.default_rng(3)
    checked = 0
    while checked < 3000:
        w = random_weights(rng) if rng.random() < 0.5 else many_weights(rng)
        if rng.random() < 0.2:  # many equal remainders
            w = np.repeat(rng.integers(1, 4, size=3).astype(float), rng.integers(1, 6))
        period = int(rng.choice([1, 3, 7, 10, 100, 1000, 4099, 1 << 16, 1 << 20]))
        want = reference_period_counts(w, period)
        if np.any((w > 0) & (want == 0)):
            with pytest.raises(ConfigError, match="less than one sample per period"):
                period_counts(w, period)
            continue
        got = period_counts(w, period)
        assert got.dtype == np.int64 and int(got.sum()) == period
        assert np.array_equal(got, want), (w.tolist(), period)
        checked += 1


@pytest.mark.parametrize(
    "weights", [[1, float("inf")], [1, float("nan")], [1, -1], [0, 0], [], [1e308, 1e308]]
)
def test_weights_without_a_finite_positive_sum_are_config_errors(weights):
    with pytest.raises(ConfigError, match="positive sum"):
        period_counts(weights, 1 << 16)


@pytest.mark.parametrize("width", [1, 2, 3, 7, 8, 12, 23])
def test_consumed_many_is_consumed_row_by_row(width):
    """The rows counted together (a schedule's phases) are ``consumed`` of each row: the same
    rounding (each row's sum a 1-D sum) and the same partial-period counts."""
    from tokenload.index.interleave import consumed_many

    rng = np.random.default_rng(width)
    for period in ([1, 5] if width <= 3 else []) + [97, 1024, 1 << 16]:
        rows, samples = [], []
        while len(rows) < 40:
            w = many_weights(rng)[:width] if width >= 8 else random_weights(rng)[:width]
            if w.size < width:
                w = np.concatenate([w, rng.random(width - w.size)])
            if rng.random() < 0.2:
                w = rng.integers(0, 4, size=width).astype(float)
            if w.sum() <= 0:
                continue
            try:
                period_counts(w, period)
            except ConfigError:
                continue
            rows.append(w.tolist())
            samples.append(
                int(rng.choice([0, 1, period - 1, period, int(rng.integers(0, 5 * period))]))
            )
        got = consumed_many(rows, samples, period=period)
        assert got.dtype == np.int64 and got.shape == (40, width)
        for r, (w, n) in enumerate(zip(rows, samples)):
            assert np.array_equal(got[r], consumed(w, n, period=period)), (w, n, period)


def test_consumed_many_refuses_what_consumed_refuses():
    from tokenload.index.interleave import consumed_many

    with pytest.raises(ConfigError, match="less than one sample per period"):
        consumed_many([[1, 1], [1, 1e-9]], [5, 5], period=1 << 16)
    with pytest.raises(ConfigError, match="positive sum"):
        consumed_many([[1, 1], [0, 0]], [5, 5])
    with pytest.raises(ValueError):
        consumed_many([[1, 1]], [-1])
    assert consumed_many([], [], period=8).shape[0] == 0
