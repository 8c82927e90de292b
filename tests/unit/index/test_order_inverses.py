"""The inverses ``tokenload.provenance`` uses (issue 35, point 3): the window order's
(``WindowOrder.epoch_positions``, flat and block modes) and the interleave's
(``Interleave.positions``), each checked against the forward map on every element."""

from __future__ import annotations

import numpy as np
import pytest

from tokenload.index.interleave import Interleave
from tokenload.index.schedule import ScheduledMixture
from tokenload.index.window_order import WindowOrder


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1000, 12345])
@pytest.mark.parametrize("block_size", [None, 1, 3, 16, 64])
def test_epoch_positions_invert_the_window_order(n, block_size):
    order = WindowOrder(n, 977 * n + 3, block_size=block_size)
    for epoch in (0, 1, 5):
        windows = order.epoch_windows(np.arange(n), epoch)
        assert sorted(windows.tolist()) == list(range(n))  # a permutation
        np.testing.assert_array_equal(order.epoch_positions(windows, epoch), np.arange(n))
    epochs = np.arange(n) % 3  # one epoch per window
    windows = order.global_windows(epochs * n + np.arange(n))
    np.testing.assert_array_equal(order.epoch_positions(windows, epochs), np.arange(n))


@pytest.mark.parametrize("weights", [[1, 1], [5, 3, 2], [0.7, 0.01, 0.29]])
def test_interleave_positions_invert_the_interleave(weights):
    interleave = Interleave(weights, period=512)
    k = np.arange(3 * 512 + 17)
    source, cursor = interleave(k)
    for d in range(len(weights)):
        mine = source == d
        np.testing.assert_array_equal(interleave.positions(d, cursor[mine]), k[mine])


def test_schedule_samples_of_inverts_the_draws_across_phases():
    schedule = [(0, [3, 1, 0]), (700, [1, 1, 2]), (1500, [0, 1, 0])]
    mixture = ScheduledMixture(["a", "b", "c"], schedule, [50, 40, 30], seed=7, period=256)
    k = np.arange(2000)
    draws = mixture.draw(k)
    for d in range(3):
        mine = draws.source == d
        np.testing.assert_array_equal(mixture.samples_of(d, draws.cursor[mine]), k[mine])
