"""Weights schedules of the computed order (issue 26, point 1): the mixture changes at declared
global samples with no restart; every source serves its cursors 0, 1, 2, ... in turn across
phases (none repeated within an epoch, none skipped); within each phase every prefix is within
one sample of the phase's weights; and the schedule is the same stream as the run stopped at each
start and resumed with the next weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenload.errors import ConfigError
from tokenload.index.interleave import Interleave
from tokenload.index.mixture import Mixture, MixtureState, resume
from tokenload.index.schedule import ScheduledMixture, check_schedule

SOURCES = ("a", "b", "c", "d")
WINDOWS = (97, 13, 250, 41)
PERIOD = 1 << 10
ALL_SOURCES = range(len(SOURCES))


def _chain(schedule, **kw):
    return ScheduledMixture(SOURCES, schedule, WINDOWS, seed=5, period=PERIOD, **kw)


def _check_cursors(draws, sources=ALL_SOURCES):
    """Each source's cursors, in global order, are 0, 1, 2, ...: no repeat, no gap."""
    for d in sources:
        mine = draws.cursor[draws.source == d]
        np.testing.assert_array_equal(mine, np.arange(mine.size))


weights_st = st.lists(st.integers(0, 9), min_size=4, max_size=4).filter(lambda w: sum(w) > 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), weights_st), min_size=1, max_size=4), weights_st)
def test_every_phase_keeps_its_weights_within_one_sample(later, first):
    starts = np.cumsum([gap for gap, _ in later]).tolist()
    schedule = [(0, first)] + [(s, w) for s, (_, w) in zip(starts, later)]
    total = starts[-1] + 2000
    draws = _chain(schedule).draw(np.arange(total))
    _check_cursors(draws)
    bounds = [s for s, _ in schedule] + [total]
    for (start, weights), end in zip(schedule, bounds[1:]):
        rounded = Interleave(weights, period=PERIOD).weights  # what the phase realizes exactly
        phase = draws.source[start:end]
        m = np.arange(1, phase.size + 1)
        for d in range(len(SOURCES)):
            counts = np.cumsum(phase == d)
            assert (np.abs(counts - m * rounded[d]) < 1).all(), (start, d)
            if weights[d] == 0:
                assert counts[-1] == 0  # an inactive source serves nothing


def test_a_schedule_is_the_run_resumed_at_each_start_with_the_next_weights():
    schedule = [(0, [5, 3, 2, 0]), (700, [2, 5, 3, 0]), (1500, [0, 1, 1, 1]), (2300, [1, 1, 1, 1])]
    whole = _chain(schedule).draw(np.arange(3000))
    pieces, state = [], MixtureState(consumed=0)
    bounds = [s for s, _ in schedule] + [3000]
    for (start, weights), end in zip(schedule, bounds[1:]):
        active = [i for i, w in enumerate(weights) if w > 0]  # a zero weight = the source left out
        phase = resume(state, [SOURCES[i] for i in active], [weights[i] for i in active],
                       [WINDOWS[i] for i in active], seed=5, period=PERIOD)
        draws = phase.draw(np.arange(start, end))
        pieces.append((np.array(active)[draws.source], draws.cursor, draws.window))
        state = phase.state(end)
    for got, want in zip(whole, (np.concatenate(p) for p in zip(*pieces))):
        np.testing.assert_array_equal(got, want)
    _check_cursors(whole)
    assert whole.cursor[whole.source == 1].size > WINDOWS[1]  # b ran into its next epoch


def test_a_new_chain_mid_phase_continues_every_cursor():
    """A resume into another schedule starts a new chain at the saved sample, from the saved
    cursors: the concatenated stream still serves each source's cursors in turn."""
    schedule = [(0, [1, 1, 0, 0]), (333, [0, 2, 1, 1]), (1000, [3, 0, 1, 0])]
    for at in (1, 332, 333, 334, 999, 1000, 1400):
        head = _chain(schedule).draw(np.arange(at))
        origin = _chain(schedule).state(at)
        other = [(0, [1, 2, 3, 4]), (1200, [4, 3, 2, 1])]
        tail = _chain(other, origin=origin).draw(np.arange(at, 1500))
        _check_cursors(type(head)(*(np.concatenate(p) for p in zip(head, tail))))
        if at < 1200:
            assert tail.source[: 1200 - at].tolist().count(3) > 0  # the other schedule's weights


def test_samples_of_several_phases_in_one_call():
    schedule = [(0, [1, 0, 0, 0]), (5, [0, 1, 0, 0]), (9, [0, 0, 1, 1])]
    chain = _chain(schedule)
    draws = chain.draw(np.array([11, 0, 6, 4, 9, 5]))
    singly = [chain.draw(np.array([k])) for k in (11, 0, 6, 4, 9, 5)]
    for i, one in enumerate(singly):
        assert [int(x[i]) for x in draws] == [int(x[0]) for x in one]
    assert draws.source[1] == 0 and draws.source[2] == 1 and draws.source[3] == 0
    assert chain.phase_of(4) == 0 and chain.phase_of(5) == 1 and chain.phase_of(10 ** 9) == 2


def test_a_removed_source_keeps_its_cursor_through_a_chain():
    first = Mixture(SOURCES[:2], [1, 1], WINDOWS[:2], seed=5, period=PERIOD)
    state = first.state(100)
    without_b = ScheduledMixture(["a", "c"], [(0, [1, 1])], [WINDOWS[0], WINDOWS[2]], seed=5,
                                 origin=state, period=PERIOD)
    later = without_b.state(300)
    assert later.cursors["b"] == state.cursors["b"] == 50  # carried, unchanged
    back = ScheduledMixture(SOURCES[:3], [(0, [1, 1, 1])], WINDOWS[:3], seed=5, origin=later,
                            period=PERIOD)
    draws = back.draw(np.arange(300, 330))
    assert draws.cursor[draws.source == 1].tolist()[:3] == [50, 51, 52]  # b continues


@pytest.mark.parametrize(
    "schedule, match",
    [
        ([], "empty"),
        ([(1, [1, 1])], "first entry at 0"),
        ([(0, [1, 1]), (0, [1, 2])], "strictly increasing"),
        ([(0, [1, 1]), (5.5, [1, 2])], "strictly increasing"),
        ([(0, [1, 1, 1])], "3 weights"),
        ([(0, [0, 0])], "positive sum"),
        ([(0, [1, -1])], "positive sum"),
        ([(0, [1, float("nan")])], "positive sum"),
        ([(0, [1, float("inf")])], "positive sum"),
        ([(0, [1e308, 1e308])], "positive sum"),
        ([(0, "ab")], "weights"),
        (5, "pairs"),
    ],
)
def test_malformed_schedules_are_config_errors(schedule, match):
    with pytest.raises(ConfigError, match=match):
        check_schedule(schedule, 2)


def test_batches_in_any_order_draw_what_single_samples_draw():
    """The chain keeps the phase of the last batch and looks phases up only when a batch leaves
    it: batches forwards, backwards, across changes and of one sample all draw what each sample
    drawn alone from a fresh chain draws; a sample before the chain's origin stays an error."""
    rng = np.random.default_rng(9)
    schedule = [(0, [1, 2, 0, 1]), (700, [0, 1, 1, 1]), (1500, [3, 0, 1, 0]), (1510, [1, 1, 1, 1])]
    reference = _chain(schedule)
    ks = np.arange(0, 2600)
    want = reference.draw(ks)
    for i in range(0, ks.size, 311):  # the reference itself, one phase per call
        one = _chain(schedule).draw(ks[i : i + 1])
        assert [int(x[0]) for x in one] == [int(x[i]) for x in want]
    chain = _chain(schedule)
    for _ in range(300):
        first = int(rng.integers(0, 2590))
        size = int(rng.choice([1, 4, 16, 200]))
        k = np.arange(first, min(first + size, 2600))
        if rng.random() < 0.3:
            k = rng.permutation(k)
        got = chain.draw(k, (int(k.min()), int(k.max())) if rng.random() < 0.5 else None)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w[k])
    origin = _chain(schedule).state(1000)
    later = _chain(schedule, origin=origin)
    later.draw(np.arange(1000, 1016))
    with pytest.raises(IndexError, match="start at 1000"):
        later.draw(np.arange(998, 1002))
    empty = later.draw(np.array([], dtype=np.int64))
    assert all(x.size == 0 and x.dtype == np.int64 for x in empty)


def test_a_checked_schedule_is_checked_again_only_for_another_blend():
    checked = check_schedule([(0, [1, 2]), (10, [2, 1])])
    assert check_schedule(checked, 2) is checked  # not checked again
    assert checked == ((0, (1.0, 2.0)), (10, (2.0, 1.0)))
    with pytest.raises(ConfigError, match="3 sources"):
        check_schedule(checked, 3)
    uneven = check_schedule([(0, [1, 2]), (10, [2, 1, 1])])  # no blend given: widths unchecked
    with pytest.raises(ConfigError, match="entry at sample 10 has 3 weights"):
        check_schedule(uneven, 2)
