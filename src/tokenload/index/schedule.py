"""A weights schedule declared up front: the mixture changes at given global samples, no restart.

A schedule is a list of ``(start, weights)``: from global sample ``start`` on (the first entry
starts at 0, starts increase strictly), the blend's sources have ``weights`` (one per source, 0
for an inactive source). Each entry is one phase of ``mixture.Mixture``: the phase starting at
``start`` takes every source's cursor where the phase before left it (``Mixture.state(start)``)
and serves it on under its own ``interleave.Interleave``. So a run with a schedule is the same
global stream as the same run stopped at each ``start`` and resumed with the next weights (a
zero weight serves nothing, exactly as a source left out), and since global sample k is still a
pure function of k, resuming anywhere on any topology continues it bit-exactly.

**Bound.** Within a phase the interleave's bound holds from the phase's first sample: after m
samples of the phase, source d has been served ``m * c_d / P`` of them within one sample (the
phase's rounded weights, ``interleave``). Against the whole schedule's integral of weights a
prefix is therefore within one sample per phase begun (errors left at a boundary carry over).

A chain may start at an *origin* that is not sample 0: a resume with another schedule or other
sources starts a new chain at the saved ``consumed``, from the saved cursors; the entry in force
at the origin applies from it. A phase is built on first use (equal weights share one
interleave per process, whose period is built by chunks as samples read it: a phase pays for
the slots it serves, about 0.45 us each, up to 0.03 s for a whole period); the cursors at its
start are the sums of what the phases before serve, ``interleave.consumed_many`` (their counts per
period, and the last partial period's in closed form, no EDF), so a resume late in a long
schedule builds only the chunk of the phase it reads.

**Per micro-batch** the chain keeps the phase of the last batch: a batch inside it costs two
comparisons more than a blend without a schedule (which is the one-entry chain), and the phases
are searched only when a batch leaves it.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from ..arrays import distinct
from ..errors import ConfigError
from .interleave import DEFAULT_PERIOD, Interleave, consumed_many
from .mixture import Draws, Mixture, MixtureState

__all__ = ["ScheduledMixture", "appended", "check_schedule", "check_schedule_fits"]

Schedule = tuple[tuple[int, tuple[float, ...]], ...]


class _Checked(tuple[tuple[int, tuple[float, ...]], ...]):
    """A schedule as ``check_schedule`` returned it: passed again, it is not checked again (a
    blend's schedule goes through the config, the blend and its chain)."""


_MIN, _MAX = np.minimum.reduce, np.maximum.reduce
_NO_END = sys.maxsize  # the last phase's end


def check_schedule(
    schedule: Any,  # anything: checked here
    num_sources: int | None = None,
    *,
    what: str = "weights_schedule",
) -> Schedule:
    """``schedule`` as a tuple of ``(start, weights)``; a ``ConfigError`` naming ``what`` unless
    the starts are ints from 0, strictly increasing, and each entry has one finite weight >= 0
    per source (``num_sources`` when given) with a positive sum."""
    if isinstance(schedule, _Checked) and (
        num_sources is None or all(len(w) == num_sources for _, w in schedule)
    ):
        return schedule
    hint = "pass [(0, [w1, w2, ...]), (start, [...]), ...]: one weight per source of the blend"
    try:
        entries = [(start, tuple(map(float, weights))) for start, weights in schedule]
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{what} is {schedule!r} ({exc}); expected (start, weights) pairs", hint=hint
        ) from None
    if not entries:
        raise ConfigError(f"{what} is empty; expected at least the entry for sample 0", hint=hint)
    previous = -1
    for start, weights in entries:
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start <= previous:
            raise ConfigError(
                f"{what} starts at {[s for s, _ in entries]}; expected ints, strictly increasing",
                hint=hint,
            )
        previous = int(start)
        if num_sources is not None and len(weights) != num_sources:
            raise ConfigError(
                f"{what} entry at sample {start} has {len(weights)} weights; the blend has"
                f" {num_sources} sources",
                hint=hint,
            )
        total = sum(weights)  # inf or nan when a weight is: one test for all
        if not (math.isfinite(total) and total > 0 and min(weights) >= 0):
            raise ConfigError(
                f"{what} entry at sample {start} has weights {list(weights)}; expected finite"
                " weights >= 0 with a positive sum",
                hint="give every entry at least one positive weight (0 makes a source inactive)",
            )
    if entries[0][0] != 0:
        raise ConfigError(
            f"{what} starts at sample {entries[0][0]}; expected its first entry at 0", hint=hint
        )
    return _Checked((int(s), w) for s, w in entries)


def check_schedule_fits(
    schedule: Sequence[tuple[int, Sequence[float]]],
    length: int,
    *,
    split: str = "train",
    what: str = "weights_schedule",
) -> None:
    """``ConfigError`` naming ``what``, the entry and the split's length when an entry of the
    (checked) ``schedule`` starts at or after the end of a split of ``length`` samples: it would
    serve nothing, and is most likely a start given in another unit (tokens, steps)."""
    for start, weights in schedule:
        if start >= length:
            raise ConfigError(
                f"{what} entry at sample {start} (weights {list(weights)}) starts at or after"
                f" the end of the {split} split, which holds {length} samples; expected every"
                f" entry to start before sample {length}",
                hint=f"give starts in global samples, drop the entries from sample {length} on,"
                f" or ask for more {split} samples",
                field=what,
            )


def appended(
    schedule: Schedule, start: int, weights: Sequence[float], *, what: str = "weights"
) -> Schedule:
    """A checked ``schedule`` with its entries from ``start`` on replaced by ``(start,
    weights)`` (``loader.set_weights``): the new entry is checked (``ConfigError`` naming
    ``what``), the others are not again, so the cost does not grow with the entries before."""
    [(_, checked)] = check_schedule([(0, weights)], len(schedule[0][1]), what=what)
    kept = bisect_left(schedule, int(start), key=lambda entry: entry[0])
    if kept == 0 and start != 0:
        raise ConfigError(f"{what} entry at {start}; expected the schedule to start at 0")
    return _Checked((*schedule[:kept], (int(start), checked)))


@lru_cache(maxsize=64)
def _interleave(weights: tuple[float, ...], period: int) -> Interleave:
    return Interleave(weights, period=period)


class ScheduledMixture:
    """The phases of a schedule from an origin on: global sample k -> (source, cursor, window)."""

    def __init__(
        self,
        sources: Sequence[str],
        schedule: Iterable[tuple[int, Iterable[float]]],
        num_windows: Sequence[int],
        *,
        seed: int,
        origin: MixtureState | None = None,
        period: int = DEFAULT_PERIOD,
        block_size: int | None = None,
    ) -> None:
        self.sources = tuple(str(s) for s in sources)
        self.schedule = check_schedule(schedule, len(self.sources))
        self.period = int(period)
        self.origin = origin or MixtureState(consumed=0)
        at = self.origin.consumed
        starts = [s for s, _ in self.schedule]
        first = bisect_right(starts, at) - 1
        bounds = [at, *starts[first + 1 :]]
        self._entries = [(start, w) for start, (_, w) in zip(bounds, self.schedule[first:])]
        self._windows = list(num_windows)
        self._seed, self._block_size = seed, block_size
        self._phases: dict[int, Mixture] = {}  # built on first use
        # the cursors of ``sources`` at each phase's start (the origin's, then counted)
        self._bases: list[np.ndarray] = [
            np.array([int(self.origin.cursors.get(s, 0)) for s in self.sources], dtype=np.int64)
        ]
        self.starts = np.array(bounds, dtype=np.int64)
        self._ends = [*bounds[1:], _NO_END]
        self._current: tuple[int, int, int, Mixture] | None = None
        """The phase the last draw was in: ``(index, start, end, its Mixture)``."""

    def phase(self, i: int) -> Mixture:
        """The ``Mixture`` of the chain's i-th phase, built on first use: it starts from the
        cursors the phases before leave at its start (``_state_at``), without building them."""
        if i not in self._phases:
            start, weights = self._entries[i]
            self._phases[i] = Mixture(
                self.sources,
                weights,
                self._windows,
                seed=self._seed,
                start=start,
                state=self._state_at(i),
                period=self.period,
                block_size=self._block_size,
                interleave=_interleave(weights, self.period),
            )
        return self._phases[i]

    def _state_at(self, i: int) -> MixtureState:
        """The cursors at the i-th phase's start. Each phase before adds what its interleave
        serves over its length (``interleave.consumed_many``: whole periods are its counts, the
        last partial period is counted in closed form, all phases at once), so resuming late in
        a long schedule builds no interleave of the phases before. Windows of sources the
        origin knows stay the origin's, so the phase's ``Mixture`` still refuses a source whose
        data changed."""
        if len(self._bases) <= i:  # the phases not counted yet, counted together
            ks = range(len(self._bases) - 1, i)
            served = consumed_many(
                [self._entries[k][1] for k in ks],
                [self._entries[k + 1][0] - self._entries[k][0] for k in ks],
                period=self.period,
            )
            self._bases.extend(self._bases[-1] + np.cumsum(served, axis=0))
        if i == 0:
            return self.origin
        cursors, windows = dict(self.origin.cursors), dict(self.origin.windows)
        for s, n, c in zip(self.sources, self._windows, self._bases[i].tolist()):
            cursors[s] = c
            windows.setdefault(s, int(n))
        return MixtureState(consumed=self._entries[i][0], cursors=cursors, windows=windows)

    def append(self, start: int, weights: Sequence[float], *, what: str = "weights") -> None:
        """Serve ``weights`` from global sample ``start`` (``>= self.start``) on: the schedule's
        entries from ``start`` on are replaced by ``(start, weights)`` (``loader.set_weights``).
        The phases before ``start`` and their cursors are kept (a phase does not depend on its
        end), so the cost does not grow with the entries before; the chain is then the one its
        new ``schedule`` gives declared up front. ``ConfigError`` naming ``what`` for bad
        weights, before anything changes."""
        start = int(start)
        if start < self.start:
            raise ValueError(f"an entry at {start}; this chain starts at {self.start}")
        self.schedule = appended(self.schedule, start, weights, what=what)
        checked = self.schedule[-1][1]
        j = int(np.searchsorted(self.starts, start, side="left"))  # phases begun before start
        for i in range(j, len(self._entries)):
            self._phases.pop(i, None)
        self._entries = [*self._entries[:j], (start, checked)]
        self.starts = np.append(self.starts[:j], np.int64(start))
        self._ends = [*self._ends[: max(j - 1, 0)], *([start] if j else []), _NO_END]
        del self._bases[max(j, 1) :]
        self._current = None

    @property
    def start(self) -> int:
        """The first global sample the chain serves (its origin)."""
        return self.origin.consumed

    def phase_of(self, sample: int) -> int:
        """Index into ``schedule`` of the entry in force at global ``sample``."""
        return bisect_right(self.schedule, sample, key=lambda entry: entry[0]) - 1

    def _phase(self, samples: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, samples, side="right") - 1

    def draw(self, samples: npt.ArrayLike, bounds: tuple[int, int] | None = None) -> Draws:
        """``Mixture.draw`` of each sample's phase (one call per phase present). ``bounds``:
        the samples' ``(min, max)`` when the caller has them. A micro-batch inside the phase
        of the one before costs two comparisons more than a blend without a schedule; the
        phases are looked up when a batch leaves it."""
        k = np.asarray(samples, dtype=np.int64).ravel()
        if not k.size:
            return Draws(k.copy(), k.copy(), k.copy())
        lo, hi = (int(_MIN(k)), int(_MAX(k))) if bounds is None else bounds
        current = self._current
        if current is not None and current[1] <= lo and hi < current[2]:
            return current[3]._draw(k, (lo, hi))
        if lo < self.start:
            raise IndexError(f"global samples of this chain start at {self.start}")
        first, last = bisect_right(self._ends, lo), bisect_right(self._ends, hi)
        if first == last:
            mix = self.phase(first)
            self._current = (first, mix.start, self._ends[first], mix)
            return mix._draw(k, (lo, hi))
        which = self._phase(k)
        out = Draws(np.empty_like(k), np.empty_like(k), np.empty_like(k))
        for p in distinct(which).tolist():
            rows = which == p
            part = self.phase(p)._draw(k[rows])
            for dst, src in zip(out, part):
                dst[rows] = src
        return out

    def samples_of(self, source: int, cursors: npt.ArrayLike) -> np.ndarray:
        """int64 global samples that serve ``source``'s samples ``cursors`` (all epochs and
        phases): the inverse of ``draw`` (``tokenload.provenance``). A cursor the chain's origin
        had passed was served before this chain: left out. O(phases) plus a period's table per
        phase that serves one."""
        c = np.asarray(cursors, dtype=np.int64).ravel()
        last = len(self._entries) - 1
        self._state_at(last)
        bases = np.array([b[source] for b in self._bases[: last + 1]], dtype=np.int64)
        phase = np.searchsorted(bases, c, side="right") - 1
        out = np.full(c.size, -1, dtype=np.int64)
        for p in distinct(phase[phase >= 0]).tolist():
            rows = phase == p
            mix = self.phase(p)
            out[rows] = mix.start + mix.interleave.positions(source, c[rows] - bases[p])
        return out[out >= 0]

    def state(self, consumed: int) -> MixtureState:
        """Every source's cursor after ``consumed`` global samples (``>= start``)."""
        if consumed < self.start:
            raise ValueError(f"consumed is {consumed}; this chain starts at {self.start}")
        return self.phase(bisect_right(self._ends, consumed)).state(consumed)

    def cursors(self, consumed: int) -> np.ndarray:
        """int64 cursor of each source (in ``sources`` order) after ``consumed`` samples."""
        state = self.state(consumed)
        return np.array([state.cursors[s] for s in self.sources], dtype=np.int64)
