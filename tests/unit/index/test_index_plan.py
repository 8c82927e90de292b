"""The builder plan: the five cases of spec §3.3, sizes with the surplus, and the errors."""

from __future__ import annotations

import pytest

from tokenload.errors import ConfigError
from tokenload.index import Blend, plan_splits, resolve_blend, samples_per_dataset

W = Blend(prefixes=("x", "y"), weights=(30.0, 70.0))
U = Blend(prefixes=("x", "y"))


def test_targets_and_buffers_of_golden_c():
    w = [0.3, 0.7]
    assert samples_per_dataset(w, [40, 5, 0]) == [[12, 2, 0], [28, 4, 0]]
    assert samples_per_dataset(w, [40, 5, 0], 0.005) == [[13, 3, 0], [29, 5, 0]]


def test_case1_single_unweighted_prefix():
    train, valid, test = plan_splits(blend=Blend(prefixes=("x",)), split="80,20,0",
                                     sizes=[40, 5, None])
    assert not train.blended and train.datasets[0].num_samples == 40
    assert train.datasets[0].bookend == (0, 0.8)
    assert valid.datasets[0].num_samples == 5 and test is None


def test_case2_weighted_blend_with_sizes():
    train, valid, test = plan_splits(blend=W, split="80,20,0", sizes=[40, 5, 0])
    assert train.blended and train.weights == (0.3, 0.7) and train.size == 40
    assert [m.num_samples for m in train.datasets] == [13, 29]
    assert valid.size == 6 and [m.num_samples for m in valid.datasets] == [3, 5]
    assert test is None
    assert resolve_blend(train, [27, 48]) == ([0.3, 0.7], 40)


def test_case3_weights_without_size_is_an_error():
    with pytest.raises(ConfigError, match="pass an int size"):
        plan_splits(blend=W, split="80,20,0", sizes=[40, 5, None])  # even the unused test split
    with pytest.raises(ConfigError):
        plan_splits(blend_per_split=[W, None, None], sizes=[None, 1, 1])


def test_case4_unweighted_with_size():
    (train, _, _) = plan_splits(blend_per_split=[U, None, None], sizes=[50, None, None])
    assert [m.num_samples for m in train.datasets] == [None, None]
    weights, size = resolve_blend(train, [35, 63])
    assert weights == [0.35714285714285715, 0.6428571428571429] and size == 50
    assert resolve_blend(train, [10, 20])[1] == 30  # capped by the total


def test_case5_unweighted_exhaustive():
    (train, _, _) = plan_splits(blend_per_split=[U, None, None], sizes=[None, None, None])
    assert resolve_blend(train, [35, 63]) == ([35, 63], None)
    with pytest.raises(ConfigError):
        resolve_blend(train, [35, 0])  # Megatron asserts weights > 0


def test_single_weighted_prefix_blend_vs_per_split():
    one = Blend(prefixes=("y",), weights=(1.0,))
    train = plan_splits(blend=one, split="90/5/5", sizes=[20, 4, 2])[0]
    assert train.blended and train.weights == (1.0,) and train.datasets[0].num_samples == 21
    train = plan_splits(blend_per_split=[one, None, None], sizes=[20, None, None])[0]
    assert not train.blended and train.datasets[0].num_samples == 20
    assert train.datasets[0].bookend == (0.0, 1.0)


def test_mock_mode_forces_the_split():
    plans = plan_splits(sizes=[10, 5, 5])
    assert [p.datasets[0].prefix for p in plans] == [None, None, None]
    assert plans[1].datasets[0].bookend == (0.3333333333333333, 0.6666666666666666)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"blend": W, "blend_per_split": [W, None, None], "sizes": [1, 1, 1]},
        {"blend": W, "sizes": [1, 1, 1]},  # no split string
        {"blend": U, "split": "1,1,1", "sizes": [1, 1]},
        {"blend": U, "split": "1,1,1", "sizes": [1, -1, 1]},
        {"blend": U, "split": "1,1,1", "sizes": [1, 1, 1], "surplus": -0.1},
    ],
)
def test_bad_plans(kwargs):
    with pytest.raises(ConfigError):
        plan_splits(**kwargs)
