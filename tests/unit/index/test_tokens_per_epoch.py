"""``tokens_per_epoch`` sums a split's run of ids in place (issue 27): the same total as the
gather for every ``documents``, and the gather's IndexError for an id out of range."""

from __future__ import annotations

import numpy as np
import pytest

from tokenload.index.document import _RUN_CHECK, tokens_per_epoch

N = 3 * _RUN_CHECK


@pytest.fixture(scope="module")
def lengths():
    return np.random.default_rng(0).integers(0, 5000, size=N).astype(np.int32)


def _cases():
    run = np.arange(5, N - 7, dtype=np.int32)
    gap = np.arange(0, N, dtype=np.int64)
    gap[_RUN_CHECK + 3] += 1  # ends and length of a run, one id inside repeated
    late = np.arange(0, N, dtype=np.int32)
    late[-2] = 0  # differs in the last, shorter block only
    return {"run": run, "int64 run": np.arange(N, dtype=np.int64), "reversed": run[::-1].copy(),
            "one id repeated": gap, "last block differs": late, "short": np.arange(3, 10)}


@pytest.mark.parametrize("name", list(_cases()))
def test_the_total_is_the_gathers_for_every_kind_of_documents(lengths, name):
    docs = _cases()[name]
    assert tokens_per_epoch(lengths, docs) == int(np.sum(lengths[docs], dtype=np.int64))


def test_a_run_past_the_end_raises_as_the_gather_does(lengths):
    with pytest.raises(IndexError):
        tokens_per_epoch(lengths, np.arange(1, N + 1))
