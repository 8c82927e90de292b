"""Megatron-order blends whose weights change: schedules and ``mixture_change="continue"``.

Megatron's blend is two arrays over the whole run (``dataset_index``, ``dataset_sample_index``)
built by its greedy from fixed weights; changing the weights at a resume rebuilds them, so some
samples of a source repeat and others are never served (Megatron-LM issue #457). Here a run is a
chain of *segments* instead:

* Each source (blend member) has its **prepared order**: Megatron's per-source order (document,
  sample and shuffle index) built for the ``num_samples`` of the first phase the source appears
  in, and kept for the rest of the run (the state records it, and a later phase rebuilds the
  member with that number, from the same cache). Its *cursor* is the number of its samples the
  run has drawn.
* Segment 0 of a run that starts at sample 0 is Megatron's own blend, bit for bit.
* At a change (a schedule entry, or a resume with other weights or sources) a new segment starts
  at global sample C: Megatron's greedy (``build_blending_indices``, with the weights normalized
  twice as Megatron does) restarted at step 0 over the sources of positive weight, and source d's
  j-th sample of the segment is sample ``cursor_d(C) + j`` of its prepared order.

So each source serves its prepared order's samples 0, 1, 2, ... in turn across all changes: none
repeated, none skipped. **When a prepared order runs out** (the new weights ask a source for
more than it was prepared with, its ``len``) the source starts its prepared order again from
sample 0, as a new pass (a warning is logged once; the accounting's epoch counts on): samples
repeat only after every sample of the prepared order has been served. The counts per segment
follow Megatron's greedy: never one sample ahead of the weights, at most about 1.3 behind with
three or more sources (docs/ORDER.md).

A schedule is the same chain declared up front: the same global stream as the run stopped at
each entry's start and resumed with that entry's weights (a 0 weight is the source left out),
each source's prepared order being the one its first entry of positive weight plans.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from ...arrays import distinct
from ...contract import MixtureCursors, Sources
from ...errors import ConfigError, ForeignStateError, StateError
from ...index import SPLIT_NAMES, Blend, build_blending_indices, plan_splits
from ...index.blends import distinct_sources
from ...index.plan import MidLevelPlan, SplitPlan, samples_per_dataset
from ...index.schedule import Schedule, appended, check_schedule
from ...index.splits import normalize
from ..config import DataConfig
from ..pieces import not_answered
from .blended import BlendedDataset

logger = logging.getLogger(__name__)

_MAX = np.maximum.reduce

__all__ = ["ContinuableBlendedDataset", "entry_plans"]


class EntryPlan:
    """A schedule entry's blend: its sources of positive weight, their weights as Megatron's
    plan normalizes them (twice), and that plan, made on first use (a long schedule plans only
    the entries a run reaches and those that prepare a source)."""

    __slots__ = ("_make", "_plan", "active", "weights")

    def __init__(
        self,
        active: list[int],
        weights: tuple[float, ...],
        *,
        plan: SplitPlan | None = None,
        make: Callable[[], SplitPlan] | None = None,
    ) -> None:
        self.active = active
        """Indices of the entry's sources (weight > 0) among the blend's."""
        self.weights = weights
        """The greedy's weights: the plan's (``normalize`` twice, as Megatron's builder)."""
        self._plan, self._make = plan, make

    @property
    def plan(self) -> SplitPlan:
        """The train-split plan Megatron makes for that blend."""
        if self._plan is None:
            assert self._make is not None  # a plan or the means to make it
            self._plan, self._make = self._make(), None
        return self._plan


def _entry_plan(
    split: str | None,
    surplus: float,
    sizes: tuple[int | None, ...],
    blend: Blend,
    per_split: bool,
) -> SplitPlan:
    if per_split:
        plan = plan_splits(blend_per_split=[blend, None, None], sizes=list(sizes), surplus=surplus)
        plan[0] = None if plan[0] is None else scheduled_plan(plan[0], surplus)
    else:
        plan = plan_splits(
            blend=blend, blend_per_split=None, split=split, sizes=list(sizes), surplus=surplus
        )
    assert plan[0] is not None  # a train split with samples
    return plan[0]


def entry_plans(
    split: str | None,
    surplus: float,
    sizes: Sequence[int | None],
    prefixes: Sequence[str],
    schedule: Sequence[tuple[int, Sequence[float]]],
    *,
    per_split: bool = False,
) -> list[EntryPlan]:
    """The train-split plan Megatron makes for each schedule entry's blend (its sources of
    positive weight, with those weights), made when first asked for: the weights (normalized
    twice) and buffers a phase run with that entry's blend would use; ``per_split``: the blend
    is the train split's own (``blend_per_split``), not one cut by ``split``."""
    plan = partial(entry_plan, split, surplus, tuple(sizes), tuple(prefixes), per_split)
    return [plan(weights) for _, weights in schedule]


def entry_plan(
    split: str | None,
    surplus: float,
    sizes: tuple[int | None, ...],
    prefixes: tuple[str, ...],
    per_split: bool,
    weights: Sequence[float],
) -> EntryPlan:
    """One entry's ``EntryPlan`` (``entry_plans``), its plan made when first asked for."""
    active = [i for i, w in enumerate(weights) if w > 0]
    blend = Blend(
        prefixes=tuple(prefixes[i] for i in active), weights=tuple(weights[i] for i in active)
    )
    make = partial(_entry_plan, split, surplus, sizes, blend, per_split)
    return EntryPlan(active, _greedy_weights(weights), make=make)


class _Segment:
    """Global samples ``[start, end)`` served by one greedy blend from ``base`` cursors."""

    def __init__(
        self,
        start: int,
        end: int,
        sources: np.ndarray,
        di: np.ndarray,
        dsi: np.ndarray,
        base: np.ndarray,
        weights: np.ndarray,
    ) -> None:
        self.start, self.end, self.sources, self.di, self.dsi = start, end, sources, di, dsi
        self.base, self.weights = base, weights
        smallest = max(float(weights.min()), 1e-9) if weights.size else 1.0
        self._tail = int(min(4 / smallest, 1 << 24)) + 16
        """Samples before a point within which every source of the greedy was served."""
        self.every = bool(np.array_equal(sources, np.arange(base.size)))
        """Every member is in the greedy, in order: its source numbers are the members'."""
        self.based = bool(base.any())
        """Some member starts past cursor 0 (not a run's first segment)."""
        self.safe = 0
        """Samples from ``start`` on that no source can run out in (``room``)."""

    def room(self, lengths: np.ndarray) -> None:
        """Set ``safe``: before sample j of the segment, source d has served ``dsi[j] <= j`` of
        it, and Megatron's greedy (given ``weights``) never serves a source more than
        ``w_d * max(j - 1, 1) + 1`` of the first j (it picks the largest error, and the errors
        sum to at least 0): within 2 for floats. So no sample before ``min(room_d)`` nor before
        ``min((room_d - 2) / w_d)`` can find its source's prepared order run out (room_d: its
        length less the cursor at the start); past that, each batch is checked."""
        room = lengths[self.sources] - self.base[self.sources]
        if not room.size:
            self.safe = 0
            return
        with np.errstate(divide="ignore"):
            greedy = np.floor((room - 2) / self.weights).min()
        self.safe = int(max(room.min(), min(greedy, float(1 << 62))))

    def cursors(self, consumed: int) -> np.ndarray:
        """Every member's cursor after global sample ``consumed``. ``dsi[j]`` is how many
        samples of ``di[j]``'s source the segment served before j, so a source's count is
        ``dsi + 1`` at its last sample before ``consumed``: found in the last few samples, since
        the greedy serves a source of weight w at least every ``1/w + 2`` samples (a count over
        the whole prefix only when a source is not seen there). Cost independent of the
        segment's length: a resume late in a long entry reads a few KB of its arrays."""
        upto = consumed - self.start
        counts = np.zeros(self.base.size, dtype=np.int64)
        if upto <= 0:
            return self.base + counts
        tail = min(upto, self._tail)
        di = np.asarray(self.di[upto - tail : upto], dtype=np.int64)[::-1]
        seen, last = distinct(di, first_index=True)  # each source's last sample before upto
        if tail == upto or seen.size == self.sources.size:
            dsi = np.asarray(self.dsi[upto - tail : upto], dtype=np.int64)[::-1]
            counts[self.sources[seen]] = dsi[last] + 1
            return self.base + counts
        for at in range(0, upto, 1 << 22):  # a source of tiny weight: count the prefix
            part = np.asarray(self.di[at : min(at + (1 << 22), upto)], dtype=np.int64)
            counts += np.bincount(self.sources[part], minlength=self.base.size)
        return self.base + counts


class ContinuableBlendedDataset(BlendedDataset):
    """A Megatron blend served as a chain of segments (module docstring)."""

    def __init__(
        self,
        blend: BlendedDataset,
        members: list[Any],
        *,
        keys: list[str],
        schedule: Sequence[tuple[int, Sequence[float]]],
        plans: list[EntryPlan],
        prepared: list[int],
        rebuild: Callable[[int, int], Any],
        allow_change: bool,
        order: str,
        entry_spans: dict[int, tuple[int, int]] | None = None,
        plan_entry: Callable[[Sequence[float]], EntryPlan] | None = None,
    ) -> None:
        super().__init__(
            members,
            blend.indices,
            identity=blend.identity,
            length=len(blend),
            startup_phases=blend.startup_phases,
        )
        self.megatron = blend  # the first entry's arrays: Megatron's (then, when cached, the rest)
        self.sources = list(keys)
        self.schedule = check_schedule(schedule, len(members))
        self.plans = plans  # per entry: (active member indices, the entry's plan)
        self.prepared = list(prepared)
        self.rebuild = rebuild
        self.allow_change = allow_change
        self.order = order
        self.entry_spans = dict(entry_spans or {})
        """Per later schedule entry held in Megatron's blend's arrays (a cache of every entry's,
        one after another: ``entry_parts``): where its arrays start there, and their length."""
        self.carried: dict[str, dict[str, int]] = {}
        self._warned: set[int] = set()
        self.plan_entry = plan_entry
        """An entry's ``EntryPlan`` from its weights (``change_weights``)."""
        self.declared = (self.schedule, list(plans), dict(self.entry_spans))
        """The schedule, plans and cached spans the blend was built with."""
        self.megatron_plan = plans[0]
        """The first entry's plan as built, whose blending arrays are Megatron's (``megatron``):
        a ``set_weights`` at sample 0 replaces the first entry, whose arrays are then built."""
        self._firsts = _first_entries(plans)  # source -> its first entry of positive weight
        self._chain(0, np.zeros(len(members), dtype=np.int64))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["rebuild"] = None  # a worker reads; only the training process resumes (and rebuilds)
        return state

    # -- the chain ------------------------------------------------------------------------------
    def _chain(self, origin: int, cursors: np.ndarray) -> None:
        """Plan the segments from ``origin`` (each built on first use: ``_segment_at``)."""
        self.origin, self.origin_cursors = int(origin), cursors.copy()
        starts = [s for s, _ in self.schedule]
        first = int(np.searchsorted(starts, origin, side="right")) - 1
        bounds = [origin, *starts[first + 1 :], len(self)]
        self._planned: list[tuple[int, int, int]] = []  # (entry, start, end) of every segment
        for e, (start, end) in enumerate(itertools.pairwise(bounds), start=first):
            if start >= len(self):
                break
            self._planned.append((e, start, end))
        self._built: list[_Segment] = []
        self._starts = np.array([start for _, start, _ in self._planned], dtype=np.int64)
        self._lengths_changed()
        # the segment of the last micro-batch: none before the first (no array is read while
        # building, so a cache the build finds missing is reported as that, not as a bad file)
        self._current: _Segment | None = None

    @property
    def entry_arrays(self) -> Any | None:
        """The cache holding every schedule entry's blending arrays (``IndexArrays``), or None
        when the blend's arrays are Megatron's of the first entry only."""
        return self.megatron.indices if self.entry_spans else None

    def _segment_at(self, p: int) -> _Segment:
        """Segment ``p``, built with those before it when first needed: a segment's greedy
        starts from the cursors the one before leaves, so a run from sample 0 builds only what
        it reads (startup pays for the segment it starts in, not the whole schedule)."""
        while len(self._built) <= p:
            e, start, end = self._planned[len(self._built)]
            base = self._built[-1].cursors(start) if self._built else self.origin_cursors
            entry = self.plans[e]
            sources = np.asarray(entry.active, dtype=np.int64)
            # The greedy is prefix-stable (step i does not depend on the size), so a segment of
            # entry e, which starts the greedy at step 0, is a prefix of the entry's arrays:
            # Megatron's own for the first entry (built for its blend), the cache's for a later
            # one; only a later entry without a cache folder, or a first one that set_weights
            # replaced at sample 0, builds its segment's.
            if e == 0 and entry is self.megatron_plan:
                di, dsi = self.megatron.dataset_index, self.megatron.dataset_sample_index
            elif e in self.entry_spans:
                at, n = self.entry_spans[e]
                di = self.megatron.dataset_index[at : at + n]
                dsi = self.megatron.dataset_sample_index[at : at + n]
            else:
                di, dsi = build_blending_indices(list(entry.weights), end - start)
            assert di.shape[0] >= end - start, (e, di.shape, start, end)
            weights = np.asarray(entry.weights, dtype=np.float64)
            segment = _Segment(start, end, sources, di, dsi, base, weights)
            segment.room(self._lengths)
            self._built.append(segment)
        return self._built[p]

    @property
    def segments(self) -> list[_Segment]:
        """Every segment of the chain (built if not yet)."""
        return [self._segment_at(p) for p in range(len(self._planned))]

    def _lengths_changed(self) -> None:
        """Keep the members' lengths (a member rebuilt at a resume changes its own)."""
        self._lengths = np.array([len(m) for m in self.datasets], dtype=np.int64)
        self._shortest = int(self._lengths.min())
        for s in self._built:
            s.room(self._lengths)

    def _locate(
        self, idx: np.ndarray, bounds: tuple[int, int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Member and member sample of each global sample. A micro-batch inside the segment of
        the one before is two lookups, as in Megatron's arrays; segments are searched only
        when a batch leaves it, and the members' lengths checked only past ``_Segment.safe``."""
        if not idx.size:
            return idx.copy(), idx.copy()
        lo, hi = (int(idx.min()), int(idx.max())) if bounds is None else bounds
        s = self._current
        if s is not None and s.start <= lo and hi < s.end:
            j = idx - s.start if s.start else idx
            which = np.asarray(s.di[j], dtype=np.int64)
            within = np.asarray(s.dsi[j], dtype=np.int64)
            if not s.every:
                which = s.sources[which]
            if s.based:
                within = within + s.base[which]
            if hi - s.start < s.safe or _MAX(within) < self._shortest:
                return which, within
            return self._past_ends(which, within)
        if lo < self.origin:
            raise IndexError(f"global samples of this run start at {self.origin}")
        which = np.empty(idx.size, dtype=np.int64)
        within = np.empty(idx.size, dtype=np.int64)
        seg = np.searchsorted(self._starts, idx, side="right") - 1
        present = distinct(seg).tolist()
        for p in present:
            rows = seg == p
            s = self._segment_at(p)
            j = idx[rows] - s.start
            d = s.sources[np.asarray(s.di[j], dtype=np.int64)]
            which[rows] = d
            within[rows] = s.base[d] + np.asarray(s.dsi[j], dtype=np.int64)
        self._current = self._segment_at(present[-1])
        return self._past_ends(which, within)

    def _past_ends(self, which: np.ndarray, within: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A source whose prepared order has run out starts it again (a new pass)."""
        lengths = self._lengths
        over = within >= lengths[which]
        if over.any():
            for d in distinct(which[over]).tolist():
                if d not in self._warned:
                    self._warned.add(d)
                    logger.warning(
                        "source %s has served all %d samples of its prepared order; it starts"
                        " it again from its first sample (a new pass)",
                        self.sources[d],
                        lengths[d],
                    )
            within[over] %= lengths[which[over]]
        return which, within

    def _segment(self, consumed: int) -> _Segment:
        return self._segment_at(
            max(int(np.searchsorted(self._starts, consumed, side="right")) - 1, 0)
        )

    # -- runtime changes (loader.set_weights) ---------------------------------------------------
    def change_weights(self, start: int, weights: Sequence[float] | None) -> bool:
        """Serve ``weights`` from global sample ``start`` on: an entry appended to the schedule
        at ``start``, replacing its entries from there (None: the declared ones again). The
        segments before ``start`` are kept, so the chain is the one the new schedule declared up
        front gives: a new segment of Megatron's greedy from every source's cursor at ``start``.
        A source that no entry before ``start`` drew is prepared, as a declared schedule does,
        by this entry's plan: when that rebuilds it, returns False (another process's copy
        must be replaced, not changed by the same call); else True. ``ConfigError`` before
        anything changes unless built with ``mixture_change="continue"``."""
        if not self.allow_change or self.plan_entry is None:
            raise ConfigError(
                "set_weights on a Megatron-order blend built with mixture_change='refuse'"
                " (with a weights_schedule): its weights change only as the schedule says",
                hint="build the blend with MegatronDataConfig(mixture_change='continue')"
                " (--mixture-change continue) to change its weights while it runs",
                field="mixture_change",
            )
        start = int(start)
        if start < self.origin:
            raise ValueError(f"an entry at {start}; this run starts at {self.origin}")
        kept = bisect_left(self.schedule, start, key=lambda entry: entry[0])
        if weights is None:
            schedule, plans, spans = self.declared
            tail = [e for e, (s, _) in enumerate(schedule) if s >= start]
            self.schedule = check_schedule((*self.schedule[:kept], *(schedule[e] for e in tail)))
            self.plans = [*self.plans[:kept], *(plans[e] for e in tail)]
            moved = {kept + i: spans[e] for i, e in enumerate(tail) if e in spans}
            self.entry_spans = {e: v for e, v in self.entry_spans.items() if e < kept} | moved
            self._firsts = _first_entries(self.plans)
            self._chain(self.origin, self.origin_cursors)
            return True
        schedule = appended(self.schedule, start, weights)
        entry = self.plan_entry(schedule[-1][1])
        self.schedule = schedule
        rebuilt = False
        self._firsts = {d: e for d, e in self._firsts.items() if e < kept}
        for d in entry.active:
            if d in self._firsts:
                continue  # prepared by an earlier entry (or the state of a resume)
            self._firsts[d] = kept
            n = _prepared(entry.plan.datasets[entry.active.index(d)])
            if n != self.prepared[d] and not self.source_cursors(start)[d]:
                # a worker's copy never gets here: the training process's call returned False
                assert self.rebuild is not None, "a loader worker cannot rebuild a source"
                self.datasets[d], self.prepared[d], rebuilt = self.rebuild(d, n), n, True
        self.plans = [*self.plans[:kept], entry]
        self.entry_spans = {e: v for e, v in self.entry_spans.items() if e < kept}
        # the segments begun before start stay (the last one now ends there)
        p = int(np.searchsorted(self._starts, start, side="left"))
        self._planned = self._planned[:p]
        if p:
            e, first, _ = self._planned[-1]
            self._planned[-1] = (e, first, start)
        if start < len(self):
            self._planned.append((kept, start, len(self)))
        del self._built[p:]
        if self._built:
            self._built[-1].end = start
        self._starts = np.array([s for _, s, _ in self._planned], dtype=np.int64)
        self._current = None
        if rebuilt:
            self._lengths_changed()
        return not rebuilt

    # -- provenance (contract.PieceSource) ------------------------------------------------------
    def samples_of(self, source: int, document: int) -> np.ndarray:
        """The global samples of this chain whose ``tokens`` hold a token of ``document`` of
        member ``source``: the member's samples of it, then where each segment's blending
        arrays draw them (one pass over each; a source's samples past its prepared order are
        its next pass, as served)."""
        member = self.datasets[source]
        if not hasattr(member, "samples_of"):
            raise not_answered(member)
        held = member.samples_of(0, document)
        found = [np.zeros(0, dtype=np.int64)]
        if held.size:
            for s in self.segments:
                di = np.asarray(s.di[: s.end - s.start], dtype=np.int64)
                rows = np.flatnonzero(s.sources[di] == source)
                within = (s.base[source] + s.dsi[rows]) % self._lengths[source]
                found.append(s.start + rows[np.isin(within, held)])
        return np.concatenate(found)

    # -- accounting -----------------------------------------------------------------------------
    def source_cursors(self, consumed: int) -> np.ndarray:
        """int64 samples drawn from each member by global ``consumed`` (all phases)."""
        if consumed < self.origin:
            raise ValueError(f"consumed is {consumed}; this run starts at {self.origin}")
        return self._segment(consumed).cursors(consumed)

    def schedule_position(self, consumed: int) -> dict[str, Any]:
        starts = [s for s, _ in self.schedule]
        entry = int(np.searchsorted(starts, consumed, side="right")) - 1
        following = starts[entry + 1] if entry + 1 < len(starts) else None
        # a chain begun at a resume serves the entry from there (its origin)
        return {
            "entry": entry,
            "entries": len(starts),
            "start": max(starts[entry], self.origin),
            "weights": list(self.schedule[entry][1]),
            "next_change": following,
        }

    # -- the loader's contract (contract.LoaderDataset) ------------------------------------------
    def describe_sources(self) -> Sources:
        """The members, keyed by ``sources`` (so a source removed at a resume keeps its key)."""
        described = [d.describe_sources() for d in self.datasets]
        infos = [info for d in described for info in d.members]
        members = tuple(replace(info, key=key) for info, key in zip(infos, self.sources))
        return Sources(members=members, blended=True, packed=any(d.packed for d in described))

    def mixture_cursors(self) -> MixtureCursors | None:
        """This blend: its cursors, schedule position and resumable mixture state."""
        return self

    def cyclic_key(self) -> str:
        """``"None"``: under the cyclic sampler this blend's fingerprint has never covered its
        weights, and saved states must keep matching."""
        return "None"

    # -- resume -----------------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.order}|{'|'.join(self.sources)}".encode()).hexdigest()[:16]

    def mixture_state(self, consumed: int) -> dict[str, Any]:
        now = self.source_cursors(consumed)
        sources = {k: dict(v) for k, v in self.carried.items()}
        for k, c, n in zip(self.sources, now.tolist(), self.prepared):
            sources[k] = {"cursor": int(c), "num_samples": int(n)}
        phase = {
            "keys": self.sources,
            "schedule": [[s, list(w)] for s, w in self.schedule],
            "origin": self.origin,
            "origin_cursors": self.origin_cursors.tolist(),
        }
        return {"order": self.order, "consumed": int(consumed), "sources": sources, "phase": phase}

    def resume_mixture(self, state: dict[str, Any]) -> str:
        """Continue the run that saved ``state``: the same chain when its sources and schedule are
        this blend's; otherwise (``mixture_change="continue"`` only) a new segment from the saved
        ``consumed`` in which every source continues its prepared order at its cursor."""
        consumed, sources, phase = _parse(state, self.order)
        if consumed > len(self):
            raise StateError(
                f"the mixture state was saved after {consumed} samples; this blend"
                f" holds {len(self)}",
                hint="build the blend with at least as many samples",
            )
        for i, key in enumerate(self.sources):
            n = sources.get(key, {}).get("num_samples")
            if n and n != self.prepared[i]:  # 0: a source never prepared (never drawn)
                self.datasets[i] = self.rebuild(i, n)  # the source's own prepared order
                self.prepared[i] = n
                self._lengths_changed()
        same = phase.get("keys") == self.sources and _schedule(phase) == self.schedule
        if same:
            cursors = np.array(phase.get("origin_cursors"), dtype=np.int64)
            self.carried = {k: v for k, v in sources.items() if k not in self.sources}
            origin: Any = phase.get("origin")
            self._chain(int(origin), cursors)
            return "same"
        if not self.allow_change:
            raise StateError(
                "the loader state was saved for a Megatron-order blend of other weights or sources",
                hint="resume with the saved blend (Megatron's behaviour), or set"
                " MegatronDataConfig(mixture_change='continue') to continue every source where"
                " it stopped",
            )
        self.carried = {k: v for k, v in sources.items() if k not in self.sources}
        cursors = np.array(
            [sources.get(k, {}).get("cursor", 0) for k in self.sources], dtype=np.int64
        )
        self._chain(consumed, cursors)
        return "weights" if set(sources) == set(self.sources) else "sources"


def _first_entries(plans: Sequence[EntryPlan]) -> dict[int, int]:
    """Each source drawn by some entry: the first entry that draws it (its prepared order's)."""
    firsts: dict[int, int] = {}
    for e, plan in enumerate(plans):
        for d in plan.active:
            firsts.setdefault(d, e)
    return firsts


def _parse(state: Any, order: str) -> tuple[int, dict[str, dict[str, int]], dict[str, Any]]:
    if not isinstance(state, dict) or state.get("order") != order:
        found = state.get("order") if isinstance(state, dict) else type(state).__name__
        raise ForeignStateError(
            f"the mixture state was saved for order {found!r}; this blend's is {order!r}",
            hint="resume with the seed, split, sequence length, item options and packing of the"
            " saved run",
        )
    try:
        consumed = int(state["consumed"])
        sources = {
            str(k): {"cursor": int(v["cursor"]), "num_samples": int(v["num_samples"])}
            for k, v in state["sources"].items()
        }
        phase = dict(state["phase"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateError(
            f"mixture state is malformed ({type(exc).__name__}: {exc})",
            hint="pass the dict loader.state_dict() saved, unchanged",
        ) from None
    if consumed < 0 or any(v["cursor"] < 0 or v["num_samples"] < 0 for v in sources.values()):
        raise StateError(
            f"mixture state has a negative count: {state!r}",
            hint="pass the dict loader.state_dict() saved, unchanged",
        )
    return consumed, sources, phase


def _schedule(phase: dict[str, Any]) -> Schedule | None:
    try:
        return check_schedule(phase.get("schedule"))
    except Exception:  # a malformed record never matches: a change, refused or continued
        return None


def continuable(
    *,
    data: DataConfig,
    schedule: Sequence[tuple[int, tuple[float, ...]]] | None,
    sizes: Sequence[int | None],
    name: str,
    plan: SplitPlan,
    blend: BlendedDataset,
    members: Sequence[Any],
    build_member: Callable[[MidLevelPlan], Any],
    allow_change: bool,
    entries_in_blend: bool = False,
) -> ContinuableBlendedDataset:
    """``blend`` wrapped for schedules and mixture changes (called by the builder, train split
    with a schedule or any blend with ``mixture_change="continue"``). ``members``: the blend's
    datasets, one per ``plan.datasets``; ``build_member(mid)``: a source's dataset built for
    another number of samples (a source that joins later, or a later phase);
    ``entries_in_blend``: ``blend``'s arrays (a cache) hold every schedule entry's blending
    one after another (``entry_parts``), not only Megatron's arrays of the first entry.
    ``schedule``: the config's checked ``weights_schedule`` (it applies to the train split)."""
    c = data
    prefixes = list(_blend_of(c, name).prefixes)
    schedule = schedule if name == "train" else None
    if schedule is None:
        assert plan.weights is not None  # the builder wraps weighted blends only
        schedule = [(0, tuple(plan.weights))]
        entries = [EntryPlan(list(range(len(prefixes))), tuple(plan.weights), plan=plan)]
    else:
        entries = entry_plans(
            c.split,
            c.mid_level_dataset_surplus,
            sizes,
            prefixes,
            check_schedule(schedule, len(prefixes)),
            per_split=c.blend_per_split is not None,
        )
        entries[0] = EntryPlan(entries[0].active, entries[0].weights, plan=plan)  # the builder's
    datasets: list[Any] = [None] * len(prefixes)
    prepared = [0] * len(prefixes)
    for j, ds in enumerate(members):
        i = entries[0].active[j]
        datasets[i], prepared[i] = ds, _prepared(plan.datasets[j])
    template = plan.datasets[0]

    def rebuild(i: int, n: int) -> Any:
        return build_member(replace(template, prefix=prefixes[i], num_samples=n))

    for i in range(len(prefixes)):
        if datasets[i] is None:  # weight 0 in the first entry: prepared by its first positive one
            first = next((entry for entry in entries if i in entry.active), None)
            # weight 0 in every entry: never drawn, prepared for 0 samples (one epoch), so that
            # it is described and its cursor (0) kept like any member's
            if first is not None:
                prepared[i] = _prepared(first.plan.datasets[first.active.index(i)])
            datasets[i] = rebuild(i, prepared[i])
    spans: dict[int, tuple[int, int]] = {}
    if entries_in_blend:
        at = 0
        for e, (_, n) in enumerate(entry_parts(schedule, len(blend))):
            spans[e] = (at, n)
            at += n
        del spans[0]  # the first entry's are read as Megatron's arrays
    keys = distinct_sources([str(p) for p in prefixes])
    # what a saved cursor counts: a packed source's samples are rows of whole documents, so a
    # state of another packing (or cap) is another order (concatenation's text is unchanged,
    # so that its states saved before packing existed still resume)
    packed = "" if c.packing == "concat" else f"|{c.packing}|{c.max_documents_per_row}"
    order = hashlib.sha256(
        f"megatron-blend|{name}|{c.random_seed}|{c.split}|{c.item!r}{packed}".encode()
    ).hexdigest()[:16]
    return ContinuableBlendedDataset(
        blend,
        datasets,
        keys=keys,
        schedule=schedule,
        plans=entries,
        prepared=prepared,
        rebuild=rebuild,
        allow_change=allow_change,
        order=order,
        entry_spans=spans,
        plan_entry=partial(
            entry_plan,
            c.split,
            c.mid_level_dataset_surplus,
            tuple(sizes),
            tuple(prefixes),
            c.blend_per_split is not None,
        ),
    )


def scheduled_plan(plan: SplitPlan, surplus: float) -> SplitPlan:
    """A schedule's train split (or entry) planned as a blend, even of one source.
    ``blend_per_split`` uses a one-source blend directly (Megatron's rule): planned so, a train
    split whose first entry has one source of positive weight would be that source's plain
    dataset and serve it through every later entry. Here it is the one-member weighted blend
    ``blend`` plans for one source (``ceil(size * (1 + surplus))`` samples prepared)."""
    if plan.blended:
        return plan
    mid = plan.datasets[0]
    assert mid.num_samples is not None  # a schedule's blend is weighted: it has a size
    [[target]] = samples_per_dataset([1.0], [mid.num_samples])
    [[buffer]] = samples_per_dataset([1.0], [mid.num_samples], surplus)
    return SplitPlan(
        split=plan.split,
        datasets=(replace(mid, num_samples=buffer),),
        blended=True,
        weights=(1.0,),
        size=target,
    )


def _prepared(mid: MidLevelPlan) -> int:
    """The samples a weighted blend's member is built for (always a number there)."""
    assert mid.num_samples is not None
    return mid.num_samples


def mixture_mode(mixture_change: str, schedule: object | None) -> bool:
    """Whether the builder wraps blends in ``ContinuableBlendedDataset``."""
    return mixture_change == "continue" or schedule is not None


def entry_parts(schedule: Sequence[Any], size: int) -> list[tuple[tuple[float, ...], int]]:
    """Per schedule entry that starts before ``size``: the weights of its greedy (its sources of
    positive weight, normalized twice as Megatron's plan does) and its number of samples."""
    checked = check_schedule(schedule)
    ends = [s for s, _ in checked[1:]] + [size]
    return [
        (_greedy_weights(weights), min(end, size) - start)
        for (start, weights), end in zip(checked, ends)
        if start < size
    ]


def _greedy_weights(weights: Sequence[float]) -> tuple[float, ...]:
    """An entry's greedy weights: its positive ones normalized twice, as Megatron's plan does."""
    return tuple(normalize(normalize([w for w in weights if w > 0])))


def first_segment(schedule: Sequence[Any] | None, size: int) -> int:
    """The samples of a chain's first segment (from sample 0): up to the schedule's first
    change, all ``size`` without one; the only samples a chain reads from Megatron's arrays."""
    parts = [] if schedule is None else entry_parts(schedule, size)
    return parts[0][1] if parts else size


def first_entry_blend(schedule: Sequence[Any] | None, blend: Blend | None) -> Blend | None:
    """With a schedule, the blend Megatron builds first: the first entry's sources of positive
    weight with those weights (the others join at their first positive entry)."""
    if schedule is None or blend is None:
        return blend
    weights = check_schedule(schedule, len(blend.prefixes))[0][1]
    active = [i for i, w in enumerate(weights) if w > 0]
    return Blend(
        prefixes=tuple(blend.prefixes[i] for i in active), weights=tuple(weights[i] for i in active)
    )


def _blend_of(data: DataConfig, name: str) -> Blend:
    """The blend of split ``name``: ``blend`` (cut by ``split``) or its ``blend_per_split``."""
    if data.blend_per_split is not None:
        blend = data.blend_per_split[SPLIT_NAMES.index(name)]
    else:
        blend = data.blend
    if blend is None:
        raise ConfigError(
            f"a Megatron-order weights_schedule or mixture_change='continue' needs a blend for"
            f" the {name} split",
            hint="list the sources in blend or in blend_per_split",
        )
    return blend
