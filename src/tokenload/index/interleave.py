"""A blend without an index over all samples: one period of a deterministic schedule, repeated.

Weights become integer counts per period P by largest-remainder rounding (``c_d`` with
``sum c_d = P`` and ``|c_d - P*w_d| < 1``). One period is scheduled by earliest deadline first
(EDF): the j-th sample (j >= 1) of source d is *released* at slot ``floor((j-1)*P / c_d)`` and
*due* by slot ``ceil(j*P / c_d) - 1``; each slot takes, among released samples, the one due
first (ties: lowest source). The schedule is then repeated, so global sample k is slot
``k mod P`` of period ``k // P``: ``(source, cursor) = (src[k mod P], (k // P)*c[src] +
rank[k mod P])``, two table lookups. Memory: two int32 arrays of P plus O(D).

**Bound.** For every source d and every prefix of m samples of the infinite order,
``|count_d(m) - m*c_d/P| < 1``; against the requested weights that is
``|count_d(m) - m*w_d| < 1 + m*|c_d/P - w_d|``, where ``|c_d/P - w_d| < 1/P``.
*Proof.* EDF meets every deadline when, for every window of slots ``[a, b]``, at most
``b - a + 1`` samples are released and due inside it (Hall's condition for unit jobs on one
machine, for which EDF is optimal). Source d's samples released at >= a and due <= b have
``(j-1)*P/c_d >= a`` and ``j*P/c_d <= b + 1``, so at most ``(b + 1 - a)*c_d/P`` of them, and
summing over d gives at most ``b + 1 - a``. A sample scheduled within its window gives:
sample j is served by prefix m whenever ``m >= j*P/c_d`` (so ``count >= floor(m*c_d/P)``)
and never before ``m > (j-1)*P/c_d`` (so ``count <= ceil(m*c_d/P)``), with equality only at
integers where the error is 0. At ``m = P`` every count equals ``c_d``: the state repeats, and
so does the bound. The greedy max-error rule of Megatron has no such bound for three or more
sources (one falls more than one sample behind, docs/ORDER.md), which is why EDF is used.

Building the period is a heap walk over P slots in Python, about 0.45 us a slot: 0.03 s for
the default P = 2^16 (weights resolved to 1.5e-5). It is done by chunks of 512 slots as samples
first read them (``Interleave``), each chunk's EDF started from the exact state at its first
slot (the count below), so a blend pays for the slots it serves, once per period: a schedule's
phase shorter than the period builds only its own slots. ``consumed(weights, samples)`` needs no
table: whole periods give ``counts``, and the last partial period's counts come from the closed
count below (5-20 us for up to a dozen sources). A weights schedule uses it to find each
phase's start without building the phases before (``schedule``).

**Count of a prefix** (``_prefix_counts``: the first t slots without scheduling them).
(1) EDF places every job in the earliest slot at or after its release that no job of smaller
key ``(due, source)`` took: by induction over the keys, the slots from a job's release to its
own slot hold only smaller keys (EDF took them while it was ready, or while its source's
previous job, of smaller key, was), and its own slot none. (2) The ``m_d = floor(t*c_d/P)``
first jobs of each source are due before t, so they lie in ``[0, t)``; of the later jobs only
source d's next one, when ``t*c_d/P`` is fractional, is released before t (its window
straddles t), and every job due before t has a smaller key than those. So each straddling job,
in key order, takes the first slot of ``[0, t)`` at or after its release that the jobs due
before t and the straddling ones before it left free, if there is one. (3) Placing jobs in the
first free slot at or after their release leaves the same slots free whatever the order
(linear probing), and of ``[0, a)`` it leaves ``max(a' - R(a') for a' <= a)`` free, R(a')
being the jobs released before a'. For the jobs due before t, ``R(a') = sum(min(m_d,
ceil(a'*c_d/P)))``, at least a' until the first straddling release: nothing is free before it,
and only the span from there to t is counted (one walk over the jobs released in it). The
straddling job released at r then takes the first of the ``t - sum(m_d)`` free slots from the
one numbered by what is free before r on that is not taken yet.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError

__all__ = [
    "DEFAULT_PERIOD",
    "Interleave",
    "consumed",
    "consumed_many",
    "period_counts",
    "token_weights",
]

DEFAULT_PERIOD = 1 << 16
_MIN, _MAX = np.minimum.reduce, np.maximum.reduce


def _check_weights(weights: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    with np.errstate(over="ignore"):  # a sum past the float range is refused below
        total = float(w.sum()) if w.ndim == 1 and w.size else math.nan  # inf/nan if a weight is
    if not (math.isfinite(total) and total > 0 and w.min() >= 0):
        raise ConfigError(
            f"{what} are {list(weights)}; expected one or more finite weights >= 0"
            " with a positive sum",
            hint="give a non-negative weight per source, at least one of them positive",
        )
    return w / total


def token_weights(weights: Sequence[float], tokens_per_sample: Sequence[int]) -> np.ndarray:
    """Per-sample weights that give each source the share ``weights`` of the *tokens*.

    A source whose samples hold more tokens needs proportionally fewer samples. For sources of
    the same sequence length, per-token and per-sample weights are the same; the blend of every
    source by its size ("natural" mixture) is ``weights = num_windows``.
    """
    w = _check_weights(weights, "token weights")
    t = np.asarray(tokens_per_sample, dtype=np.float64)
    if t.shape != w.shape or np.any(t <= 0):
        raise ConfigError(
            f"tokens per sample {list(tokens_per_sample)}; expected one positive count per weight"
        )
    return _check_weights(w / t, "token weights")


def period_counts(weights: Sequence[float], period: int) -> np.ndarray:
    """int64 samples of each source per period: largest-remainder rounding of ``period * w``."""
    if period < 1:
        raise ConfigError(f"period is {period}; expected >= 1")
    w = _check_weights(weights, "weights")
    exact = (w * period).tolist()
    counts = [math.floor(x) for x in exact]
    short = period - sum(counts)
    # the largest remainders first, ties by source (a stable sort of count - exact)
    for d in sorted(range(len(exact)), key=lambda d: counts[d] - exact[d])[:short]:
        counts[d] += 1
    for d, (wd, cd) in enumerate(zip(w.tolist(), counts)):
        if wd > 0 and cd == 0:
            raise ConfigError(
                f"source {d} has weight {wd:.3g}, less than one sample per period of {period}",
                hint=f"use a period of at least {math.ceil(1 / wd)} or a larger weight",
            )
    return np.array(counts, dtype=np.int64)


def _walk(
    counts: np.ndarray,
    period: int,
    start: int,
    served: list[int],
    stop: int,
    sources: list[int],
    ranks: list[int],
) -> bool:
    """EDF from slot ``start``, where ``served`` samples of each source were served (the exact
    state there: ``_prefix_counts``), to slot ``stop``: the source of slot ``start + i`` in
    ``sources[i]`` and its rank (the samples of that source in the period's slots before) in
    ``ranks[i]``; False when a deadline is missed. A job released by the next slot goes
    straight to ``ready`` (the heap holds at most one job per source, keys ``(due, source)``
    are distinct, so the choice at every slot is the same as releasing it at that slot)."""
    c = counts.tolist()
    served = list(served)
    pending: list[tuple[int, int]] = []  # (release slot, source)
    ready: list[tuple[int, int]] = []  # (due slot, source)
    for d, (s, cd) in enumerate(zip(served, c)):
        if s < cd:
            release, due = (s * period) // cd, ((s + 1) * period - 1) // cd
            if release <= start:
                ready.append((due, d))
            else:
                pending.append((release, d))
    heapq.heapify(pending)
    heapq.heapify(ready)
    push, pop = heapq.heappush, heapq.heappop
    for slot in range(start, stop):
        while pending and pending[0][0] <= slot:
            d = pop(pending)[1]
            push(ready, (((served[d] + 1) * period - 1) // c[d], d))
        if not ready or ready[0][0] < slot:
            return False
        d = pop(ready)[1]
        sources[slot - start] = d
        ranks[slot - start] = s = served[d]
        s = served[d] = s + 1
        if s < c[d]:
            release = (s * period) // c[d]
            if release <= slot + 1:
                push(ready, (((s + 1) * period - 1) // c[d], d))
            else:
                push(pending, (release, d))
    return True


_PYTHON_SPAN = 1024
"""Spans (slots from the earliest straddling release to ``slots``) up to this long are counted
in Python, longer ones with NumPy (a few dozen microseconds of calls against 0.06 us a slot)."""


def _prefix_counts(counts: np.ndarray, period: int, slots: int) -> np.ndarray:
    """int64 samples of each source in the period's first ``slots`` slots, without scheduling
    them (the module's *count* section): ``floor(t*c_d/P)`` per source, plus one for each
    straddling job that finds a slot before t left free by the jobs due before t."""
    P, t = int(period), int(slots)
    c = counts.tolist()
    m = [t * x // P for x in c]  # jobs due before t: all served by then (the bound)
    extra = t - sum(m)  # slots of [0, t) they leave free: straddling jobs fill them
    if not extra:
        return np.array(m, dtype=np.int64)
    late = [  # (due, source, release) of the job of each source straddling t
        (((md + 1) * P - 1) // cd, d, md * P // cd)
        for d, (cd, md) in enumerate(zip(c, m))
        if t * cd % P
    ]
    lo = min(r for _, _, r in late)
    firsts = [-(-lo * cd // P) for cd in c]  # each source's first job released at >= lo
    free = (_free_python if t - lo <= _PYTHON_SPAN else _free_numpy)(c, m, firsts, P, lo, t)
    if free[t - lo] != extra:
        raise AssertionError("EDF missed a deadline: the counts do not sum to the period")
    taken = [False] * extra
    for _, d, r in sorted(late):  # in EDF's order of keys (due, source)
        j = free[r - lo]  # the free slots before its release are not its to take
        while j < extra and taken[j]:
            j += 1
        if j < extra:
            taken[j] = True
            m[d] += 1
    return np.array(m, dtype=np.int64)


def _free_python(
    c: list[int], m: list[int], firsts: list[int], P: int, lo: int, t: int
) -> list[int]:
    """``free[a - lo]`` for a in ``lo..t``: the slots of ``[0, a)`` that the jobs due before t
    (``m`` per source) leave free, ``max(a' - released(a') for a' <= a)``, which is 0 up to
    ``lo``. The jobs released in ``[lo, t)`` are walked once."""
    arrivals = [0] * (t - lo)
    before = 0  # jobs released before lo
    for cd, md, first in zip(c, m, firsts):
        if cd:
            before += min(md, first)
            for i in range(first, md):
                arrivals[i * P // cd - lo] += 1
    h = lo - before
    best = max(h, 0)
    free = [best]
    for n in arrivals:
        h += 1 - n
        if h > best:
            best = h
        free.append(best)
    return free


def _free_numpy(
    c: list[int], m: list[int], firsts: list[int], P: int, lo: int, t: int
) -> list[int]:
    """``_free_python`` with NumPy, for a long span (a source of small weight straddles t)."""
    cv, mv, fv = (np.array(x, dtype=np.int64) for x in (c, m, firsts))
    mv = mv[cv > 0]
    fv, cv = fv[cv > 0], cv[cv > 0]
    n = np.maximum(mv - fv, 0)
    i = np.arange(int(n.sum()), dtype=np.int64) + np.repeat(fv - (np.cumsum(n) - n), n)
    arrivals = np.bincount(i * P // np.repeat(cv, n) - lo, minlength=t - lo)
    h = (lo - int(np.minimum(mv, fv).sum())) + np.concatenate(([0], np.cumsum(1 - arrivals)))
    lows: list[int] = np.maximum.accumulate(np.maximum(h, 0)).tolist()
    return lows


def consumed(weights: Sequence[float], samples: int, *, period: int = DEFAULT_PERIOD) -> np.ndarray:
    """``Interleave(weights, period=period).consumed(samples)`` without building the period:
    whole periods give ``counts`` each, and the ``samples mod period`` slots of the last one
    (the period's first slots: EDF is online) are counted by ``_prefix_counts``."""
    if samples < 0:
        raise ValueError(f"samples is {samples}; expected >= 0")
    counts = period_counts(weights, period)
    periods, slot = divmod(int(samples), int(period))
    taken: np.ndarray = periods * counts + _prefix_counts(counts, int(period), slot)
    return taken


def consumed_many(
    weights: Sequence[Sequence[float]], samples: Sequence[int], *, period: int = DEFAULT_PERIOD
) -> np.ndarray:
    """``consumed(weights[e], samples[e], period=period)`` for every e, as the rows of one int64
    array: what a weights schedule's phases serve, counted together (the rounding and the count
    of the partial periods over all rows at once; only the straddling jobs' matching is done
    row by row, a few steps each). Every row has one weight per source."""
    P = int(period)
    W = np.array(weights, dtype=np.float64)
    n = np.array(samples, dtype=np.int64)
    if W.size == 0 and n.size == 0:
        return np.zeros((0, 0), dtype=np.int64)
    if W.ndim != 2 or n.shape != W.shape[:1]:
        raise ValueError(f"{W.shape[0]} weight rows and {n.size} sample counts; expected one each")
    if n.size and int(n.min()) < 0:
        raise ValueError(f"samples are {n.tolist()}; expected >= 0")
    C = _counts_rows(W, P)
    periods, t = np.divmod(n, P)
    exact = t[:, None] * C
    m = exact // P  # the jobs due before t: all served (the bound)
    extra = t - m.sum(axis=1)
    rows = np.flatnonzero(extra)
    if rows.size:
        m[rows] += _straddlers_served(C[rows], m[rows], t[rows], extra[rows], P)
    served: np.ndarray = periods[:, None] * C + m
    return served


def _counts_rows(W: np.ndarray, P: int) -> np.ndarray:
    """``period_counts`` of every row of W (the same rounding; a row it refuses raises its
    error). Each row's sum is taken as ``period_counts`` takes it, a 1-D sum."""
    E, D = W.shape
    with np.errstate(over="ignore"):
        totals = np.array([float(row.sum()) for row in W]) if E else np.zeros(0)
    bad = ~(np.isfinite(totals) & (totals > 0))
    bad |= np.minimum.reduce(W, axis=1, initial=np.inf) < 0
    if D == 0 or bad.any():
        period_counts(W[int(np.argmax(bad))] if D else [], P)  # raises its ConfigError
    w = W / totals[:, None]
    exact = w * P
    counts: np.ndarray = np.floor(exact).astype(np.int64)
    short = P - counts.sum(axis=1)
    order = np.argsort(counts - exact, axis=1, kind="stable")  # largest remainders first
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(D), (E, D)), axis=1)
    counts += rank < short[:, None]
    starved = (w > 0) & (counts == 0)
    if starved.any():
        period_counts(W[int(np.flatnonzero(starved.any(axis=1))[0])], P)  # raises its error
    return counts


def _straddlers_served(
    C: np.ndarray, m: np.ndarray, t: np.ndarray, extra: np.ndarray, P: int
) -> np.ndarray:
    """0/1 per row and source: whether the job straddling t is served before t (the module's
    *count*), for rows with ``extra > 0``: ``_prefix_counts`` over all rows at once."""
    R, D = C.shape
    late = (t[:, None] * C) % P != 0
    safe = np.maximum(C, 1)
    release = np.where(late, m * P // safe, np.iinfo(np.int64).max)
    due = ((m + 1) * P - 1) // safe
    lo = release.min(axis=1)
    first = -((-lo[:, None] * C) // P)  # each source's first job released at >= lo
    before = np.minimum(m, first).sum(axis=1)  # jobs released before lo
    jobs = np.maximum(m - first, 0).ravel()  # released in [lo, t)
    span = t - lo + 1  # points lo..t of each row
    offset = np.cumsum(span) - span
    which = np.repeat(np.arange(R * D), jobs)
    i = np.arange(which.size) - np.repeat(np.cumsum(jobs) - jobs, jobs) + first.ravel()[which]
    row = which // D
    slot = offset[row] + i * P // C.ravel()[which] - lo[row]
    step = 1 - np.bincount(slot, minlength=int(span.sum()))
    point_row = np.repeat(np.arange(R), span)
    before_point = np.cumsum(step) - step  # sum of the steps before each point
    h = (lo - before)[point_row] + before_point - before_point[offset][point_row]
    lift = point_row * (2 * int(span.max()) + 2 * D + 2)  # rows never mix in the running max
    free = np.maximum(np.maximum.accumulate(h + lift) - lift, 0)
    if not np.array_equal(free[offset + span - 1], extra):
        raise AssertionError("EDF missed a deadline: the counts do not sum to the period")
    at = free[offset[:, None] + np.where(late, release, lo[:, None]) - lo[:, None]]
    order = np.argsort(np.where(late, due, np.iinfo(np.int64).max), axis=1, kind="stable")
    out = np.zeros((R, D), dtype=np.int64)
    for r, (keys, frees, count, slots) in enumerate(
        zip(order.tolist(), at.tolist(), late.sum(axis=1).tolist(), extra.tolist())
    ):
        taken = [False] * slots
        for d in keys[:count]:  # in EDF's order of keys (due, source)
            j = frees[d]
            while j < slots and taken[j]:
                j += 1
            if j < slots:
                taken[j] = True
                out[r, d] = 1
    return out


_CHUNK = 1 << 9
"""Slots of the period built at a time (about 0.2 ms of EDF in Python), when first read."""


class Interleave:
    """A periodic blend of D sources: global sample k -> (source, the source's k-th sample).

    The period's two tables are built by chunks of ``_CHUNK`` slots when a sample first reads
    them: EDF from the chunk's first slot, whose state ``_prefix_counts`` gives exactly. A
    phase of a schedule shorter than the period builds only the slots it serves; a blend read
    from sample 0 builds the table over its first period, as it reads it."""

    def __init__(self, weights: Sequence[float], *, period: int = DEFAULT_PERIOD) -> None:
        self.period = int(period)
        self.counts = period_counts(weights, self.period)
        self._sources = np.zeros(self.period, dtype=np.int32)
        self._ranks = np.zeros(self.period, dtype=np.int32)
        self._built = [False] * -(-self.period // _CHUNK)
        self._complete = False
        """Every chunk built. Flags are set after the chunk's slots are written, so a reader
        in another thread never reads an unwritten slot (it builds the chunk again)."""

    @property
    def num_sources(self) -> int:
        return int(self.counts.size)

    @property
    def weights(self) -> np.ndarray:
        """The weights the schedule realizes exactly over every period, ``counts / period``."""
        return self.counts / self.period

    @property
    def sources(self) -> np.ndarray:
        """int32 source of every slot of the period (builds what is not built)."""
        self._build(0, self.period - 1)
        return self._sources

    @property
    def ranks(self) -> np.ndarray:
        """int32 samples of the slot's source in the period's slots before it."""
        self._build(0, self.period - 1)
        return self._ranks

    def _build(self, first: int, last: int) -> None:
        """Build the chunks of slots ``first..last`` that are not built."""
        for chunk in range(first // _CHUNK, last // _CHUNK + 1):
            if not self._built[chunk]:
                a, b = chunk * _CHUNK, min(self.period, (chunk + 1) * _CHUNK)
                state = _prefix_counts(self.counts, self.period, a).tolist()
                sources, ranks = [0] * (b - a), [0] * (b - a)
                if not _walk(self.counts, self.period, a, state, b, sources, ranks):
                    raise AssertionError(
                        "EDF missed a deadline: the counts do not sum to the period"
                    )
                self._sources[a:b] = sources
                self._ranks[a:b] = ranks
                self._built[chunk] = True
        self._complete = all(self._built)

    def __call__(self, samples: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """``(source, cursor)`` int64 arrays of global samples k >= 0: sample k is the source's
        ``cursor``-th sample (counting from 0, all periods before included)."""
        k = np.asarray(samples, dtype=np.int64)
        if not k.size:
            return k.copy(), k.copy()
        lo, hi = int(_MIN(k, axis=None)), int(_MAX(k, axis=None))
        if lo < 0:
            raise IndexError("global samples must be >= 0")
        return self.lookup(k, lo, hi)

    def lookup(self, k: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """``__call__`` of int64 samples whose least and greatest, ``lo >= 0`` and ``hi``, the
        caller knows."""
        if not self._complete:
            P = self.period
            if lo // P == hi // P:
                self._build(lo % P, hi % P)
            elif lo // P + 1 == hi // P:  # across the end of one period
                self._build(lo % P, P - 1)
                self._build(0, hi % P)
            else:
                self._build(0, P - 1)
        periods, slot = np.divmod(k, self.period)
        source = self._sources[slot].astype(np.int64)
        return source, periods * self.counts[source] + self._ranks[slot]

    def positions(self, source: int, ranks: npt.ArrayLike) -> np.ndarray:
        """int64 global samples (of this interleave, from 0) that serve ``source``'s samples
        ``ranks`` (its cursor, from 0): the inverse of ``__call__`` (builds the whole period)."""
        i: np.ndarray = np.asarray(ranks, dtype=np.int64)
        count = int(self.counts[source])
        if not i.size:
            none: np.ndarray = i.copy()
            return none
        if count == 0 or int(_MIN(i)) < 0:
            raise IndexError(f"source {source} serves no sample number {int(_MIN(i))} here")
        slots = np.flatnonzero(self.sources == source)
        periods, rank = np.divmod(i, count)
        return periods * self.period + slots[rank]

    def consumed(self, samples: int) -> np.ndarray:
        """int64 samples taken from each source by the first ``samples`` global samples."""
        periods, slot = divmod(int(samples), self.period)
        taken: np.ndarray = periods * self.counts + _prefix_counts(self.counts, self.period, slot)
        return taken
