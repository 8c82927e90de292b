"""``loader.set_weights`` on real ranks (issue 35, point 1), for both orders: 2 ranks with 2
worker processes each call it between the same two steps; the state saved after it resumes on 4
ranks of another micro-batch size (no workers), which continue the stream exactly, and the whole
stream equals the same changes declared up front as a ``weights_schedule`` on 4 ranks."""

from __future__ import annotations

import numpy as np
import pytest

from . import test_mixture_phases
from .launch import run_ranks

S = test_mixture_phases.S
SIZE = test_mixture_phases.SIZE
ORDERS = test_mixture_phases.ORDERS
paths = test_mixture_phases.paths  # the fixture: files a, b, c, d whose tokens name them

FIRST = [3, 1, 0, 0]
CHANGE_AT, CHANGE = 64, [1, 2, 1, 2]  # d and c join (Megatron order: prepared by this entry)
SAVE_AT, END = 96, 256


def _dataset(paths, order, schedule):
    from tokenload.datasets import MegatronDataConfig, build_datasets

    blend = [x for name in "abcd" for x in ("1", paths[name])]
    cfg = MegatronDataConfig(
        sequence_length=S,
        blend=blend,
        split="100,0,0",
        cache="off",
        eod_id=0,
        order=order,
        weights_schedule=schedule,
        # the Megatron order's choice (the computed order always continues)
        **({"mixture_change": "continue"} if order == "megatron" else {}),
    )
    return build_datasets(cfg, [SIZE, 0, 0])[0]


def run_on_rank(rank, world, paths, jobs, mbs, workers, until, change):
    """Each job (order, schedule, state): this rank's (global sample, token row) up to global
    sample ``until``, calling ``set_weights(change[1])`` on reaching ``change[0]``; rank 0's
    state at the end."""
    from tokenload.loader import build_dataloader

    out = []
    for order, schedule, state in jobs:
        loader = build_dataloader(
            _dataset(paths, order, schedule),
            micro_batch_size=mbs,
            num_workers=workers,
            multiprocessing_context="fork",
        )
        assert (loader.dp_rank, loader.dp_size) == (rank, world)
        if state is not None:
            loader.load_state_dict(state)
        it, mine = iter(loader), []
        while loader.consumed_samples < until:
            if change is not None and loader.consumed_samples == change[0]:
                loader.set_weights(change[1])
            first = loader.consumed_samples + rank * mbs
            rows = next(it)["tokens"].numpy().tolist()
            mine += list(zip(range(first, first + mbs), rows))
        out.append((mine, loader.state_dict() if rank == 0 else None))
        loader.close()
    return out


def _merge(per_rank, j):
    return [row for _, row in sorted(s for rank in per_rank for s in rank[j][0])]


@pytest.mark.timeout(600)  # three launches of 2 to 4 spawned ranks
def test_set_weights_on_two_ranks_resumed_on_four_is_the_declared_schedule(paths):
    first = [(0, FIRST)]
    jobs = [(order, first, None) for order in ORDERS]
    head = run_ranks(2, run_on_rank, paths, jobs, 4, 2, SAVE_AT, (CHANGE_AT, CHANGE), timeout=280)
    states = [head[0][j][1] for j in range(len(ORDERS))]
    assert all(s["weights_changes"] == [[CHANGE_AT, CHANGE]] for s in states)
    jobs = [(order, first, states[j]) for j, order in enumerate(ORDERS)]
    tail = run_ranks(4, run_on_rank, paths, jobs, 3, 0, END, None, timeout=280)
    declared = [(0, FIRST), (CHANGE_AT, CHANGE)]
    jobs = [(order, declared, None) for order in ORDERS]
    whole = run_ranks(4, run_on_rank, paths, jobs, 3, 0, END, None, timeout=280)
    for j, order in enumerate(ORDERS):
        stream = _merge(head, j) + _merge(tail, j)
        expected = _merge(whole, j)
        assert len(stream) >= END - 12
        assert stream == expected[: len(stream)], order
        sources = np.array([row[0] // 1_000_000 for row in stream])
        assert set(sources[:CHANGE_AT].tolist()) == {0, 1}, order
        assert set(sources[CHANGE_AT:].tolist()) == {0, 1, 2, 3}, order
