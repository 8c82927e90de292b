"""Where a packed micro-batch's time goes (benchmarks/README.md, "Packing", read path).

Usage: python benchmarks/packing_read_steps.py [--prefix DATA/web_200000] [--batches 300]

One process, the web mix of benchmarks/packing.py (made by it), the computed order at S = 2,048,
micro-batches of 16 rows read one after the other within the first block (no block is packed in
the timed part). Each step of a packed read is timed alone (CPU time): the rows' pieces
(``PackedRows.pieces``), their tokens (``source.read_pieces``), laying them into the padded
windows (the per-token scatter of ``datasets/packed_rows.read_rows``, reproduced here), the
boundaries (``items.document_bounds``) and the item fields (``items.build_items``); then the
whole ``__getitems__`` packed and concatenated. It calls internals of the packed dataset as of
commit 5bb3c52: a later change of those may need this script changed too. Also times the
scatter against two equivalent layouts on the same arrays (16 slice copies, a boolean mask).
"""

from __future__ import annotations

import argparse
import time
import timeit

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", default="/tmp/tokenload-bench/packing/web_200000")
    ap.add_argument("--batches", type=int, default=300)
    args = ap.parse_args()
    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.datasets.items import build_items, document_bounds

    def dataset(packing: str):
        cfg = MegatronDataConfig(
            sequence_length=2048,
            random_seed=1234,
            blend=[args.prefix],
            split="100,0,0",
            order="computed",
            packing=packing,
            eod_id=0,
            pad_id=0,
        )
        ds = build_datasets(cfg, [91_000, 0, 0])[0]
        ds.__getitems__(np.arange(16))  # the first block's plan, imports, first calls
        return ds

    ds = dataset("best-fit")
    item, source, n = ds.item, ds.source, args.batches
    steps = dict.fromkeys(("pieces", "read_pieces", "scatter", "bounds", "items"), 0.0)
    last = None
    for b in range(16, 16 + n * 16, 16):
        c0 = time.process_time()
        p = ds.rows.pieces(np.arange(b, b + 16))
        c1 = time.process_time()
        flat = source.read_pieces(p.sequence, p.start, p.length, np.int64)
        c2 = time.process_time()
        rows = p.first.size
        out = np.full((rows, item.window), item.pad_id, dtype=np.int64)
        tokens = np.add.reduceat(p.length, p.first)
        row = np.repeat(np.arange(rows), tokens)
        starts = np.cumsum(tokens) - tokens
        out[row, np.arange(flat.size) - np.repeat(starts, tokens)] = flat
        c3 = time.process_time()
        bounds = document_bounds(p.length, p.first, item.sequence_length, 0)
        c4 = time.process_time()
        build_items(out, item, padded=True, bounds=bounds)
        c5 = time.process_time()
        for k, v in zip(steps, (c1 - c0, c2 - c1, c3 - c2, c4 - c3, c5 - c4), strict=True):
            steps[k] += v
        last = (out, flat, tokens)
    whole = {}
    for name, d in (("best-fit", ds), ("concat", dataset("concat"))):
        c0 = time.process_time()
        for b in range(16, 16 + n * 16, 16):
            d.__getitems__(np.arange(b, b + 16))
        whole[name] = time.process_time() - c0
    print(f"CPU us per micro-batch of 16, S = 2048, {n} micro-batches")
    for k, v in steps.items():
        print(f"  {k:12s} {v / n * 1e6:8.0f}")
    for k, v in whole.items():
        print(f"  __getitems__ {k:9s} {v / n * 1e6:8.0f}")

    out, flat, tokens = last
    width = out.shape[1]

    def scatter():
        o = np.zeros_like(out)
        row = np.repeat(np.arange(tokens.size), tokens)
        starts = np.cumsum(tokens) - tokens
        o[row, np.arange(flat.size) - np.repeat(starts, tokens)] = flat
        return o

    def mask():
        o = np.zeros_like(out)
        o[np.arange(width) < tokens[:, None]] = flat
        return o

    def slices():
        o = np.zeros_like(out)
        s = 0
        for r, k in enumerate(tokens.tolist()):
            o[r, :k] = flat[s : s + k]
            s += k
        return o

    assert np.array_equal(scatter(), mask()) and np.array_equal(scatter(), slices())
    print("laying the tokens out, us (best of 5 x 200):")
    for f in (scatter, mask, slices):
        print(f"  {f.__name__:8s} {min(timeit.repeat(f, number=200, repeat=5)) / 200 * 1e6:8.0f}")


if __name__ == "__main__":
    main()
