"""A weights schedule resumed late builds one interleave, and serves exactly what the chain of
phases built one after the other (the implementation before issue 26's startup fix, kept here as
the reference) serves: the same draws and the same states, from any origin and at any sample."""

from __future__ import annotations

import numpy as np
import pytest

from tokenload.errors import StateError
from tokenload.index import interleave as interleave_mod
from tokenload.index import schedule as schedule_mod
from tokenload.index.interleave import Interleave
from tokenload.index.mixture import Mixture, MixtureState
from tokenload.index.schedule import ScheduledMixture

SOURCES = ("a", "b", "c")
WINDOWS = (97, 13, 250)
PERIOD = 1 << 9


def reference_states(schedule, origin, upto):
    """Every phase built in order from the state the one before leaves (no shortcut)."""
    starts = [s for s, _ in schedule]
    first = int(np.searchsorted(starts, origin.consumed, side="right")) - 1
    bounds = [origin.consumed, *starts[first + 1 :]]
    phases, state = [], origin
    for start, (_, w) in zip(bounds, schedule[first:]):
        if phases:
            state = phases[-1].state(start)
        phases.append(
            Mixture(
                SOURCES,
                w,
                WINDOWS,
                seed=3,
                start=start,
                state=state,
                period=PERIOD,
                interleave=Interleave(w, period=PERIOD),
            )
        )
        if start > upto:
            break
    return bounds, phases


def random_schedule(rng, entries):
    gaps = rng.integers(1, 3 * PERIOD, size=entries - 1)
    starts = [0, *np.cumsum(gaps).tolist()]
    out = []
    for s in starts:
        w = rng.integers(0, 6, size=3).astype(float)
        w[rng.integers(3)] += 1  # a positive sum
        out.append((s, w.tolist()))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_a_late_resume_serves_what_the_phase_by_phase_chain_serves(seed):
    rng = np.random.default_rng(seed)
    schedule = random_schedule(rng, int(rng.integers(2, 12)))
    end = schedule[-1][0] + 2 * PERIOD
    at = int(rng.integers(0, end))
    origin = MixtureState(consumed=0, cursors={"gone": 7}, windows={"gone": 5})
    if seed % 2:  # a chain that starts at a saved state, mid-schedule
        cut = int(rng.integers(0, at + 1))
        bounds, phases = reference_states(schedule, origin, cut)
        p = int(np.searchsorted(bounds, cut, side="right")) - 1
        origin = phases[p].state(cut)
    bounds, phases = reference_states(schedule, origin, at + 3 * PERIOD)
    p = int(np.searchsorted(bounds, at, side="right")) - 1
    chain = ScheduledMixture(SOURCES, schedule, WINDOWS, seed=3, period=PERIOD, origin=origin)
    assert chain.state(at) == phases[p].state(at)
    ks = np.arange(at, at + 3 * PERIOD)
    want = [phases[int(np.searchsorted(bounds, k, side="right")) - 1].draw([k]) for k in ks[::7]]
    got = chain.draw(ks[::7])
    for i, w in enumerate(want):
        assert (got.source[i], got.cursor[i], got.window[i]) == (
            w.source[0],
            w.cursor[0],
            w.window[0],
        )


@pytest.mark.parametrize("sources", [3, 12])
def test_resuming_at_entry_40_of_64_builds_one_interleave(monkeypatch, sources):
    """The phases before the one resumed in only count their last partial period (no EDF walk
    at all, whatever the number of sources: 12 unequal ones made the earlier count schedule the
    prefix); the one resumed in builds the chunk of its period that the batch reads."""
    walked = []
    walk = interleave_mod._walk

    def counting_walk(counts, period, start, served, stop, sources, ranks):
        walked.append(stop - start)
        return walk(counts, period, start, served, stop, sources, ranks)

    monkeypatch.setattr(schedule_mod, "_interleave", schedule_mod._interleave.__wrapped__)
    monkeypatch.setattr(interleave_mod, "_walk", counting_walk)
    rng = np.random.default_rng(64)
    starts = [i * 3125 for i in range(64)]
    schedule = [(s, rng.integers(1, 13, size=sources).tolist()) for s in starts]
    names = tuple(f"s{i}" for i in range(sources))
    chain = ScheduledMixture(names, schedule, (97,) * sources, seed=3, period=1 << 16)
    got = chain.draw([40 * 3125 + 5])
    assert walked == [interleave_mod._CHUNK]  # the chunk read; the 40 phases before count
    # the cursors it started from are the phase-by-phase chain's
    state = MixtureState(consumed=0)
    for k in range(40):
        inter = Interleave(schedule[k][1], period=1 << 16)
        served = inter.consumed(3125)
        state = MixtureState(
            consumed=starts[k + 1],
            cursors={s: state.cursors.get(s, 0) + int(n) for s, n in zip(names, served)},
        )
    assert chain.state(starts[40]).cursors == state.cursors
    assert got.cursor[0] >= state.cursors[names[got.source[0]]]


def test_a_changed_source_is_refused_even_when_resumed_late():
    schedule = [(0, [1, 1, 1]), (100, [2, 1, 1]), (200, [1, 2, 1])]
    origin = MixtureState(consumed=0, cursors={"a": 3}, windows={"a": 96})
    chain = ScheduledMixture(SOURCES, schedule, WINDOWS, seed=3, period=PERIOD, origin=origin)
    with pytest.raises(StateError, match="had 96 windows"):
        chain.draw([250])
