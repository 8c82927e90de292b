"""Packed rows (``packing="best-fit"``) on real ranks (spawned processes joined by a gloo group):
4 ranks with micro-batch 2 and workers on, then a resume on 2 ranks with micro-batch 4, on both
orders. The merged global stream equals the dataset's own samples 0..N-1 read in one process (the
order depends on the data, the seed and S only), every row holds one source's documents as its
``dataset_id`` says, and no piece of a document is served twice."""

from __future__ import annotations

import numpy as np
import pytest

from .launch import run_ranks

S = 16
ORDERS = ("computed", "megatron")
FIRST, SECOND = 64, 64


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from support import write_documents

    tmp = tmp_path_factory.mktemp("packing")
    rng = np.random.default_rng(11)
    out = []
    for f in (1, 2):
        lengths = np.minimum(rng.lognormal(np.log(8), 1.0, 700).astype(int) + 1, 60)
        docs = [(f << 26) | (d << 12) | np.arange(n) for d, n in enumerate(lengths)]
        out.append(write_documents(tmp / f"s{f}", docs, dtype=np.int32))
    return out


def _dataset(paths, order):
    from tokenload.datasets import MegatronDataConfig, build_datasets

    cfg = MegatronDataConfig(
        sequence_length=S,
        blend=["0.4", paths[0], "0.6", paths[1]],
        split="100,0,0",
        cache="off",
        order=order,
        packing="best-fit",
    )
    return build_datasets(cfg, [FIRST + SECOND, 0, 0])[0]


def rows_on_rank(rank, world, paths, jobs, mbs, samples):
    """Each job (order, state): this rank's (global sample, tokens, dataset_id) of the next
    ``samples`` global samples; rank 0 also returns its state."""
    from tokenload.loader import build_dataloader

    results = []
    for order, state in jobs:
        dataset = _dataset(paths, order)
        loader = build_dataloader(dataset, micro_batch_size=mbs, num_workers=2)
        assert (loader.dp_rank, loader.dp_size) == (rank, world)
        if state is not None:
            loader.load_state_dict(state)
        it, mine = iter(loader), []
        for _ in range(samples // (mbs * world)):
            first = loader.consumed_samples + rank * mbs
            batch = next(it)
            tokens = batch["tokens"].numpy()
            ids = batch["dataset_id"].numpy()
            mine += [(first + i, tokens[i].tolist(), int(ids[i])) for i in range(mbs)]
        results.append((mine, loader.state_dict() if rank == 0 else None))
        loader.close()
    return results


@pytest.mark.timeout(600)
def test_packed_rows_resume_on_fewer_ranks_with_another_micro_batch(paths):
    first = run_ranks(4, rows_on_rank, paths, [(o, None) for o in ORDERS], 2, FIRST, timeout=280)
    states = [first[0][j][1] for j in range(len(ORDERS))]
    second = run_ranks(2, rows_on_rank, paths, list(zip(ORDERS, states)), 4, SECOND, timeout=280)
    for j, order in enumerate(ORDERS):
        merged = sorted(
            [s for rank in first for s in rank[j][0]] + [s for rank in second for s in rank[j][0]]
        )
        assert [s[0] for s in merged] == list(range(FIRST + SECOND))
        want = _dataset(paths, order).__getitems__(np.arange(FIRST + SECOND))
        np.testing.assert_array_equal(np.array([s[1] for s in merged]), want["tokens"], order)
        np.testing.assert_array_equal(np.array([s[2] for s in merged]), want["dataset_id"], order)
        seen = set()
        for _, tokens, source in merged:
            t = np.array(tokens)
            real = t[t != 0]
            assert set((real >> 26).tolist()) == {source + 1}, order
            # each document's first input in the row (pieces start at 0 or at a cut)
            starts = np.flatnonzero(np.diff(real, prepend=-2) != 1)
            for k in starts.tolist():
                piece = (int(real[k]) >> 12, int(real[k]) & 4095)
                assert piece not in seen, (order, piece)
                seen.add(piece)
