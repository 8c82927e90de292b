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

Building the period is a heap walk over P slots in Python: 0.03 s for the default P = 2^16
(weights resolved to 1.5e-5), 0.8 s for 2^20 (measured on one shared core). ``consumed(weights,
samples)`` needs no period: whole periods give ``counts``, and the last partial period's counts
come from the bound (each source has served ``floor(t*c_d/P)`` or one more after t slots): EDF
run over a short span from each state the bound allows, accepted when they all agree (0.1 ms for
three sources, falling back to the prefix's heap walk). A weights schedule uses it to find each
phase's start without building the phases before (``schedule``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError

__all__ = ["DEFAULT_PERIOD", "Interleave", "consumed", "period_counts", "token_weights"]

DEFAULT_PERIOD = 1 << 16


def _check_weights(weights: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ConfigError(
            f"{what} are {list(weights)}; expected one or more finite weights >= 0"
            " with a positive sum",
            hint="give a non-negative weight per source, at least one of them positive",
        )
    return w / w.sum()


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
    exact = w * period
    counts = np.floor(exact).astype(np.int64)
    short = period - int(counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    starved = np.flatnonzero((w > 0) & (counts == 0))
    if starved.size:
        raise ConfigError(
            f"source {int(starved[0])} has weight {float(w[starved[0]]):.3g},"
            f" less than one sample per period of {period}",
            hint=f"use a period of at least {int(np.ceil(1 / w[starved[0]]))} or a larger weight",
        )
    return counts


def _edf(counts: np.ndarray, period: int, slots: int | None = None) -> np.ndarray:
    """int32 source of each of the first ``slots`` (default: all ``period``) slots of one
    period: EDF over release/due slots, see the module. EDF is online, so a shorter run is a
    prefix of the full one."""
    n = period if slots is None else int(slots)
    out: list[int] = [0] * n
    if _walk(counts, period, 0, [0] * counts.size, n, out) is None:
        raise AssertionError("EDF missed a deadline: the counts do not sum to the period")
    return np.array(out, dtype=np.int32)


def _served_after(
    counts: np.ndarray, period: int, start: int, served: list[int], stop: int
) -> list[int] | None:
    """Samples of each source served after slot ``stop``, running EDF from slot ``start`` where
    ``served`` were served; None if that start misses a deadline (then the schedule never
    passes through it). From slot 0 and nothing served, the counts of ``_edf``'s prefix."""
    return _walk(counts, period, start, served, stop, None)


def _walk(
    counts: np.ndarray,
    period: int,
    start: int,
    served: list[int],
    stop: int,
    out: list[int] | None,
) -> list[int] | None:
    """EDF from slot ``start`` (where ``served`` samples of each source were served) to slot
    ``stop``: the served counts at ``stop``, the source of slot ``start + i`` in ``out[i]``
    when ``out`` is given; None when a deadline is missed. A job released by the next slot
    goes straight to ``ready`` (the heap holds at most one job per source, keys
    ``(due, source)`` are distinct, so the choice at every slot is the same as releasing it
    at that slot)."""
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
            return None
        d = pop(ready)[1]
        if out is not None:
            out[slot - start] = d
        s = served[d] = served[d] + 1
        if s < c[d]:
            release = (s * period) // c[d]
            if release <= slot + 1:
                push(ready, (((s + 1) * period - 1) // c[d], d))
            else:
                push(pending, (release, d))
    return served


def _fewest_states(
    counts: np.ndarray, period: int, lo: int, hi: int, slots: int, most: int
) -> tuple[int, np.ndarray, int] | None:
    """``hi`` if it allows at most ``most`` states, else the slot t in ``[lo, hi]`` (at most
    4,096 nearest ``hi``) where running EDF from every state the bound allows to ``slots`` costs
    least; with its floor and extras. None where every t allows more than ``most`` states."""
    exact = hi * counts
    floor, extra = exact // period, hi - int((exact // period).sum())
    if math.comb(int(np.count_nonzero(exact % period)), extra) <= most:
        return hi, floor, extra  # the common case: no search
    t = np.arange(max(lo, hi - 4095), hi + 1, dtype=np.int64)
    exact = t[:, None] * counts[None, :]
    floor = exact // period
    extra = t - floor.sum(axis=1)
    fractional = (exact % period != 0).sum(axis=1)
    pairs, where = np.unique(np.stack([fractional, extra], axis=1), axis=0, return_inverse=True)
    states = np.array([math.comb(int(n), int(k)) for n, k in pairs], dtype=object)[where.ravel()]
    cost = [s * (slots - int(x)) if s <= most else None for s, x in zip(states, t.tolist())]
    ok = [i for i, c in enumerate(cost) if c is not None]
    if not ok:
        return None
    i = min(ok, key=lambda i: (cost[i], -i))
    return int(t[i]), floor[i], int(extra[i])


def _prefix_counts(counts: np.ndarray, period: int, slots: int, *, most: int = 32) -> np.ndarray:
    """int64 samples of each source in the period's first ``slots`` slots, mostly without
    scheduling them. After t slots source d has served ``floor(t*c_d/P)`` or one more (the
    bound), ``t - sum(floor)`` of the sources with a fractional part one more: a handful of
    possible states. EDF is run from every one of them at a t shortly before ``slots``; where
    all that meet their deadlines end in the same counts, those are the counts, since the true
    state is among them. Otherwise t moves back; once the runs would cost more slots than
    ``slots``, the prefix is scheduled from slot 0."""
    span, spent = 64, 0
    while span < slots:
        found = _fewest_states(counts, period, max(0, slots - 4 * span), slots - span, slots, most)
        span *= 4
        if found is None:
            continue
        t0, floor, extra = found
        fractional = np.flatnonzero((t0 * counts) % period).tolist()
        spent += math.comb(len(fractional), extra) * (slots - t0)
        if spent > slots:
            break  # costlier than the prefix itself
        ends: set[tuple[int, ...]] = set()
        for chosen in itertools.combinations(fractional, extra):
            state = floor.copy()
            state[list(chosen)] += 1
            end = _served_after(counts, period, t0, state.tolist(), slots)
            if end is not None:
                ends.add(tuple(end))
                if len(ends) > 1:
                    break
        if len(ends) == 1:
            return np.array(ends.pop(), dtype=np.int64)
    return np.array(_served_after(counts, period, 0, [0] * counts.size, slots), dtype=np.int64)


def consumed(weights: Sequence[float], samples: int, *, period: int = DEFAULT_PERIOD) -> np.ndarray:
    """``Interleave(weights, period=period).consumed(samples)`` without building the period:
    whole periods give ``counts`` each, and the ``samples mod period`` slots of the last one
    (the period's first slots: EDF is online) are counted by ``_prefix_counts``."""
    if samples < 0:
        raise ValueError(f"samples is {samples}; expected >= 0")
    counts = period_counts(weights, period)
    periods, slot = divmod(int(samples), int(period))
    return periods * counts + _prefix_counts(counts, int(period), slot)


class Interleave:
    """A periodic blend of D sources: global sample k -> (source, the source's k-th sample)."""

    def __init__(self, weights: Sequence[float], *, period: int = DEFAULT_PERIOD) -> None:
        self.period = int(period)
        self.counts = period_counts(weights, self.period)
        self.sources = _edf(self.counts, self.period)
        order = np.argsort(self.sources, kind="stable")
        starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        ranks = np.empty(self.period, dtype=np.int32)
        ranks[order] = np.arange(self.period, dtype=np.int32) - np.repeat(starts, self.counts)
        self.ranks = ranks

    @property
    def num_sources(self) -> int:
        return int(self.counts.size)

    @property
    def weights(self) -> np.ndarray:
        """The weights the schedule realizes exactly over every period, ``counts / period``."""
        return self.counts / self.period

    def __call__(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source, cursor)`` int64 arrays of global samples k >= 0: sample k is the source's
        ``cursor``-th sample (counting from 0, all periods before included)."""
        k = np.asarray(samples, dtype=np.int64)
        if k.size and int(k.min()) < 0:
            raise IndexError("global samples must be >= 0")
        periods, slot = np.divmod(k, self.period)
        source = self.sources[slot].astype(np.int64)
        return source, periods * self.counts[source] + self.ranks[slot]

    def consumed(self, samples: int) -> np.ndarray:
        """int64 samples taken from each source by the first ``samples`` global samples."""
        periods, slot = divmod(int(samples), self.period)
        return periods * self.counts + np.bincount(self.sources[:slot], minlength=self.num_sources)
