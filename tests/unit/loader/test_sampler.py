"""Megatron's samplers: the spec's examples (§4.1, §4.2) and world-size independence."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenload.errors import ConfigError
from tokenload.loader import CyclicSampler, MicroBatchPlan, PretrainingSampler


def _plan(total, mbs, rank, dp, drop_last=True):
    return MicroBatchPlan(total_samples=total, micro_batch_size=mbs, dp_rank=rank, dp_size=dp, drop_last=drop_last)


def test_spec_example_single():
    # total 20, consumed 4, mbs 2, dp 2
    r0 = list(PretrainingSampler(_plan(20, 2, 0, 2), 4))
    r1 = list(PretrainingSampler(_plan(20, 2, 1, 2), 4))
    assert r0 == [[4, 5], [8, 9], [12, 13], [16, 17]]
    assert r1 == [[6, 7], [10, 11], [14, 15], [18, 19]]
    assert len(PretrainingSampler(_plan(20, 2, 0, 2), 4)) == 4


def test_drop_last_false_yields_partial_group():
    plan = lambda r: _plan(11, 2, r, 2, drop_last=False)  # noqa: E731
    assert list(PretrainingSampler(plan(0)))[-1] == [8, 9]
    assert list(PretrainingSampler(plan(1)))[-1] == [10]
    assert len(PretrainingSampler(plan(1))) == 3 and len(PretrainingSampler(plan(0))) == 3
    three = [list(PretrainingSampler(_plan(9, 2, r, 3, drop_last=False))) for r in range(3)]
    assert [b[-1] for b in three] == [[6, 7], [8], []]  # same step count on every rank


def test_spec_example_cyclic():
    r0 = list(CyclicSampler(_plan(21, 2, 0, 2)))
    r1 = list(CyclicSampler(_plan(21, 2, 1, 2)))
    assert r0 == [[4, 1], [7, 5], [3, 9], [0, 8], [6, 2]]
    assert r1 == [[14, 11], [17, 15], [13, 19], [10, 18], [16, 12]]
    unsharded = list(CyclicSampler(_plan(21, 2, 0, 2), data_sharding=False))
    assert unsharded == [[4, 13], [7, 3], [9, 11], [16, 10], [15, 1]]


def test_cyclic_resume_continues_epoch_and_next_epoch_differs():
    full = list(CyclicSampler(_plan(21, 2, 0, 2)))
    resumed = list(CyclicSampler(_plan(21, 2, 0, 2), consumed_samples=8))
    assert resumed == full[2:]
    next_epoch = list(CyclicSampler(_plan(21, 2, 0, 2), consumed_samples=20))
    assert len(next_epoch) == 5 and next_epoch != full
    with pytest.raises(ConfigError, match="not a multiple"):
        CyclicSampler(_plan(21, 2, 0, 2), consumed_samples=6)


@settings(max_examples=80, deadline=None)
@given(
    total=st.integers(1, 400),
    mbs=st.integers(1, 5),
    dp=st.integers(1, 8),
    steps=st.integers(0, 30),
)
def test_global_order_is_independent_of_topology(total, mbs, dp, steps):
    """Interleaving the ranks' micro-batches reproduces the plain order, from any resume point."""
    group = mbs * dp
    consumed = min(steps * group, (total // group) * group)
    per_rank = [list(PretrainingSampler(_plan(total, mbs, r, dp), consumed)) for r in range(dp)]
    order = [i for step in zip(*per_rank) for batch in step for i in batch]
    usable = consumed + ((total - consumed) // group) * group
    assert order == list(range(consumed, usable))


def test_invalid_plans():
    with pytest.raises(ConfigError):
        _plan(0, 1, 0, 1)
    with pytest.raises(ConfigError):
        _plan(10, 1, 2, 2)
    with pytest.raises(ConfigError, match="more samples"):
        PretrainingSampler(_plan(10, 1, 0, 1), 11)
