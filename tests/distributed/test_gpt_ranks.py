"""Megatron-order datasets across real ranks (gloo, CPU): every rank builds the same blended
dataset at once, racing to write one cache with no barrier; the ranks' micro-batches interleave
into exactly the global order; a 4-rank checkpoint resumes on 2 ranks with nothing repeated or
skipped."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from support import write_documents

from .launch import run_ranks

SIZES = [400, 40, 0]


def _config(folder):
    from tokenload.datasets import MegatronDataConfig

    return MegatronDataConfig(
        sequence_length=32,
        blend=["30", os.path.join(folder, "a"), "70", os.path.join(folder, "b")],
        split="90,10,0",
        tokenizer={"class": "test", "vocab_size": "5000"},
        eod_id=4999,
        path_to_cache=os.path.join(folder, "cache"),
    )


def _row_ids(batch):
    return [hashlib.md5(row.tobytes()).hexdigest()[:12] for row in np.asarray(batch["tokens"])]


def rank_run(rank, world_size, folder, state, steps):
    from tokenload.datasets import build_datasets
    from tokenload.loader import build_dataloader

    train, _, _ = build_datasets(_config(folder), SIZES)
    loader = build_dataloader(train, micro_batch_size=2, num_workers=2, multiprocessing_context="fork")
    if state is not None:
        loader.load_state_dict(state)
    it = iter(loader)
    rows = [_row_ids(next(it)) for _ in range(steps)]
    return rows, loader.state_dict()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt")
    rng = np.random.default_rng(1)
    for name, n in (("a", 300), ("b", 500)):
        docs = [np.append(rng.integers(0, 4999, size=int(k)), 4999) for k in rng.integers(5, 120, size=n)]
        write_documents(folder / name, docs)
    return str(folder)


def _global(per_rank):
    return [i for step in zip(*per_rank) for batch in step for i in batch]


def test_ranks_race_to_one_cache_and_read_the_global_order(data):
    from tokenload.datasets import build_datasets

    results = run_ranks(4, rank_run, data, None, 10)
    cache = os.path.join(data, "cache")
    assert not [n for n in os.listdir(cache) if ".tmp-" in n]  # every racing writer finished cleanly
    train, _, _ = build_datasets(_config(data), SIZES)  # now a cache hit
    expected = _row_ids(train.__getitems__(list(range(10 * 2 * 4))))
    assert _global([rows for rows, _ in results]) == expected
    # resume the 4-rank run after 6 steps (48 samples) on 2 ranks: the next samples follow on
    first = run_ranks(4, rank_run, data, None, 6)
    state = first[0][1]
    assert state["consumed_samples"] == 48
    resumed = run_ranks(2, rank_run, data, state, 8)
    assert _global([rows for rows, _ in resumed]) == _row_ids(train.__getitems__(list(range(48, 48 + 32))))
