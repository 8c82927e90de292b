"""The cost of ``tokenload.provenance``'s two queries (issue 35, point 3), per order.

Usage: python benchmarks/provenance.py [--data-dir DIR] [--documents 5000000] [--seq 1024]
           [--train 150000] [--global-batch 256] [--queries 20] [--scan]

Data: two uint16 token files of ``--documents`` documents each (lengths 1-40 tokens, mean ~20:
about 100M tokens per file), written once into ``--data-dir``, blended 1:1 (so the blend holds
twice ``--documents`` documents), S = ``--seq``, ``--train`` samples, the train split of
``100,0,0``, a weights schedule with a change at a third of the run.

Per order, from a fresh build (Megatron's order: in memory, ``cache="off"``): ``explain`` of
``--queries`` random steps and ``where`` of ``--queries`` random documents (of either source;
the first query of each pays for what is made on first use: the interleave's period table,
Megatron's index arrays are already built); median and max seconds. ``--scan`` also times the
full scan that answers ``where`` without an inverse: the pieces of every sample of the run,
searched for the document (what replaying the loader costs at best).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np


def write(prefix: Path, documents: int, seed: int) -> str:
    from tokenload.format import TokenFileWriter

    if prefix.with_suffix(".idx").exists():
        return str(prefix)
    rng = np.random.default_rng(seed)
    with TokenFileWriter(str(prefix), np.uint16) as w:
        left = documents
        while left:
            n = min(left, 1_000_000)
            lengths = rng.integers(1, 41, size=n)
            w.add_documents(
                rng.integers(0, 50000, size=int(lengths.sum()), dtype=np.uint16), lengths
            )
            left -= n
    return str(prefix)


def build(paths: list[str], order: str, args: argparse.Namespace):
    from tokenload.datasets import MegatronDataConfig, build_datasets

    cfg = MegatronDataConfig(
        sequence_length=args.seq,
        blend=["1", paths[0], "1", paths[1]],
        split="100,0,0",
        cache="off",
        order=order,
        weights_schedule=[(0, [1, 1]), (args.train // 3, [1, 3])],
        # the Megatron order's option (the computed order always continues)
        **({"mixture_change": "continue"} if order == "megatron" else {}),
    )
    return build_datasets(cfg, [args.train, 0, 0])[0]


def timed(fn, *a, **kw):
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return time.perf_counter() - t0, out


def main() -> None:
    from tokenload.provenance import explain, where

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="/tmp/tokenload-bench-provenance")
    parser.add_argument("--documents", type=int, default=5_000_000)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--train", type=int, default=150_000)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--scan", action="store_true")
    args = parser.parse_args()
    folder = Path(args.data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    t, paths = timed(lambda: [write(folder / f"p{i}", args.documents, i) for i in range(2)])
    print(f"data: 2 x {args.documents:,} documents ({t:.1f} s to write or find)")
    g = args.global_batch
    steps = args.train // g
    rng = np.random.default_rng(0)
    print(
        "| order | build s | explain s (first, median, max) | where s (first, median, max) |"
        " steps found (median) | full scan s |"
    )
    print("|---|---|---|---|---|---|")
    for order in ("computed", "megatron"):
        t_build, data = timed(build, paths, order, args)
        ex = [
            timed(explain, data, step=int(s), global_batch_size=g)[0]
            for s in rng.integers(0, steps, size=args.queries)
        ]
        found, wh = [], []
        for _ in range(args.queries):
            source = int(rng.integers(0, 2))
            document = int(rng.integers(0, args.documents))
            t, hits = timed(where, data, source=source, document=document, global_batch_size=g)
            wh.append(t)
            found.append(len(hits.steps))
        scan = ""
        if args.scan:
            t0 = time.perf_counter()
            target = (0, int(rng.integers(0, args.documents)))
            chunk, held = 8192, []
            for at in range(0, steps * g, chunk):
                p = data.sample_pieces(np.arange(at, min(at + chunk, steps * g)))
                rows = np.repeat(np.arange(p.offsets.size - 1), np.diff(p.offsets))
                hit = (p.source == target[0]) & (p.document == target[1])
                held.extend((at + rows[hit]).tolist())
            scan = f"{time.perf_counter() - t0:.1f}"
        print(
            f"| {order} | {t_build:.1f} | {ex[0]:.3f}, {statistics.median(ex):.3f}, {max(ex):.3f}"
            f" | {wh[0]:.3f}, {statistics.median(wh):.3f}, {max(wh):.3f}"
            f" | {statistics.median(found):.0f} | {scan} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
