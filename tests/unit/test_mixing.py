"""``tokenload.mixing`` (issue 35, point 2): per-source losses from a batch's ``dataset_id``
(NumPy and torch alike, checked against a loop over rows) and ODM's Exp3 rule (checked against
the paper's algorithm written out step by step)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokenload.errors import ConfigError
from tokenload.mixing import ODMExp3, per_source_loss


def _by_loop(loss, ids, k):
    sums, counts = [0.0] * k, [0] * k
    for x, d in zip(loss.tolist(), ids.tolist()):
        sums[d] += x
        counts[d] += 1
    return sums, counts


def test_per_source_loss_sums_and_counts_each_sources_rows():
    rng = np.random.default_rng(0)
    loss = rng.uniform(0, 5, size=37)
    ids = rng.integers(0, 3, size=37)  # source 3 of 4 has no row
    got = per_source_loss(loss, ids, 4)
    sums, counts = _by_loop(loss, ids, 4)
    np.testing.assert_allclose(got.sum, sums)
    np.testing.assert_array_equal(got.count, counts)
    np.testing.assert_allclose(got.mean[:3], np.array(sums[:3]) / np.array(counts[:3]))
    assert math.isnan(got.mean[3])


def test_per_source_loss_keeps_torch_tensors_as_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    loss = rng.uniform(0, 5, size=20).astype(np.float32)
    ids = rng.integers(0, 2, size=20)
    got = per_source_loss(torch.from_numpy(loss), torch.from_numpy(ids).to(torch.int16), 3)
    assert isinstance(got.sum, torch.Tensor) and got.sum.dtype == torch.float32
    sums, counts = _by_loop(loss, ids, 3)
    np.testing.assert_allclose(got.sum.numpy(), sums, rtol=1e-6)
    assert got.count.tolist() == counts
    assert math.isnan(float(got.mean[2]))


def test_per_source_loss_refuses_what_is_not_one_loss_per_row():
    with pytest.raises(ConfigError, match="one loss per row"):
        per_source_loss(np.zeros((2, 8)), np.zeros(2, dtype=np.int64), 2)
    with pytest.raises(ConfigError, match="2 sources"):
        per_source_loss(np.zeros(3), np.array([0, 1, 2]), 2)
    with pytest.raises(ConfigError, match="num_sources"):
        per_source_loss(np.zeros(3), np.zeros(3, dtype=np.int64), 0)


def _paper(losses_per_step, k, alpha):
    """ODM's Algorithm 1 written out (every source with rows counts as sampled)."""
    rewards = [0.0] * k
    eps = [None] + [min(1 / k, math.sqrt(math.log(k) / (k * t))) for t in range(1, 100)]
    pi = [1 / k] * k
    out = []
    for t, losses in enumerate(losses_per_step, start=1):
        for i in range(k):
            if losses[i] is not None:
                rewards[i] = alpha * rewards[i] + (1 - alpha) * losses[i] / pi[i]
        z = [math.exp(eps[t] * r) for r in rewards]  # the next step t + 1 uses eps_t
        pi = [(1 - k * eps[t + 1]) * x / sum(z) + eps[t + 1] for x in z]
        out.append(pi)
    return out


def test_odm_exp3_follows_the_papers_rule():
    steps = [[3.0, 1.0, 2.0], [2.5, None, 2.0], [2.4, 0.9, 1.5], [2.0, 0.8, None]] * 3
    controller = ODMExp3(3, alpha=0.8)
    for got, expected in zip((controller.update(s) for s in steps), _paper(steps, 3, 0.8)):
        np.testing.assert_allclose(got, expected, rtol=1e-12)
        assert abs(sum(got) - 1) < 1e-12


def test_odm_exp3_moves_weight_to_the_source_with_the_higher_loss():
    controller = ODMExp3(2)
    history = [controller.update([4.0, 0.5]) for _ in range(200)]  # a hard source, an easy one
    assert all(w[0] > 0.5 > w[1] >= controller._epsilon(201) - 1e-12 for w in history)
    with pytest.raises(ConfigError, match="2 or more"):
        ODMExp3(1)
