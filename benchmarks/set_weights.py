"""The loader's cost per ``loader.set_weights`` (issue 35, point 1), per order.

Usage: python benchmarks/set_weights.py [--data-dir DIR] [--train 200000] [--changes 200]
           [--micro-batch 16] [--seq 2048] [--workers 2]

Data: three token files of 4M random uint16 tokens (documents of 1-4000 tokens, written once
into ``--data-dir``), blended 5:3:2, S = ``--seq``, the train split of ``100,0,0``, ``--train``
samples; the computed order, and Megatron's order with ``mixture_change="continue"``.

*Call*: a loader with 0 workers reads one micro-batch, then ``set_weights`` is called with fresh
random weights, ``--changes`` times; the table gives the median and 90th percentile of the call
alone (what the training loop waits for in it), and the same after ``--changes`` earlier changes
(a long run of an online controller: the call does not grow with them).

*First batch after*: the data wait of the first micro-batch after a change against the median
wait of the others, with 0 workers (the changed phase's first read: the computed order builds a
chunk of the new weights' interleave; the Megatron order builds its new segment's greedy over
the samples left) and with ``--workers`` fork workers (they also remake what they had made
ahead: the wait is for the first remade micro-batch).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import synthetic_token_file


def _blend(paths: list[str], order: str, train: int, seq: int):
    from tokenload.datasets import MegatronDataConfig, build_datasets

    blend = [x for w, p in zip((5, 3, 2), paths) for x in (str(w), p)]
    cfg = MegatronDataConfig(
        sequence_length=seq,
        blend=blend,
        split="100,0,0",
        cache="off",
        order=order,
        # the Megatron order's option (the computed order always continues)
        **({"mixture_change": "continue"} if order == "megatron" else {}),
    )
    return build_datasets(cfg, [train, 0, 0])[0]


def _q(values: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(values), q))


def calls(paths, order, args) -> dict[str, float]:
    from tokenload.loader import build_dataloader

    loader = build_dataloader(
        _blend(paths, order, args.train, args.seq),
        micro_batch_size=args.micro_batch,
        dp_rank=0,
        dp_size=1,
        num_workers=0,
    )
    rng = np.random.default_rng(0)
    it = iter(loader)
    out: dict[str, float] = {}
    for label in ("first", "later"):
        times = []
        for _ in range(args.changes):
            next(it)
            weights = rng.uniform(0.1, 1.0, size=3).tolist()
            t0 = time.perf_counter()
            loader.set_weights(weights)
            times.append(time.perf_counter() - t0)
        out[f"{label}_median_us"] = statistics.median(times) * 1e6
        out[f"{label}_p90_us"] = _q(times, 0.9) * 1e6
    loader.close()
    return out


def first_batch(paths, order, args, workers: int) -> dict[str, float]:
    from tokenload.loader import build_dataloader

    loader = build_dataloader(
        _blend(paths, order, args.train, args.seq),
        micro_batch_size=args.micro_batch,
        dp_rank=0,
        dp_size=1,
        num_workers=workers,
        multiprocessing_context="fork",
    )
    rng = np.random.default_rng(1)
    it = iter(loader)
    for _ in range(8):  # workers started, prefetch full
        next(it)
    plain, after = [], []
    for _ in range(max(3, args.changes // 20)):
        for _ in range(8):
            time.sleep(0.02)  # a training step: the workers fill their prefetch
            t0 = time.perf_counter()
            next(it)
            plain.append(time.perf_counter() - t0)
        loader.set_weights(rng.uniform(0.1, 1.0, size=3).tolist())
        time.sleep(0.02)
        t0 = time.perf_counter()
        next(it)
        after.append(time.perf_counter() - t0)
    loader.close()
    return {
        "plain_median_ms": statistics.median(plain) * 1e3,
        "after_median_ms": statistics.median(after) * 1e3,
        "after_max_ms": max(after) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="/tmp/tokenload-bench-set-weights")
    parser.add_argument("--train", type=int, default=200_000)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    paths = [
        synthetic_token_file(Path(args.data_dir) / f"s{i}", tokens=4_000_000, seed=i)
        for i in range(3)
    ]
    import torch  # noqa: F401  (imported before any clock starts)

    print("| order | call median us | call p90 us | after N changes: median us | p90 us |")
    print("|---|---|---|---|---|")
    for order in ("computed", "megatron"):
        c = calls(paths, order, args)
        print(
            f"| {order} | {c['first_median_us']:.0f} | {c['first_p90_us']:.0f}"
            f" | {c['later_median_us']:.0f} | {c['later_p90_us']:.0f} |"
        )
    print()
    print("| order | workers | plain wait ms (median) | first batch after ms (median) | max |")
    print("|---|---|---|---|---|")
    for order in ("computed", "megatron"):
        for workers in (0, args.workers):
            f = first_batch(paths, order, args, workers)
            print(
                f"| {order} | {workers} | {f['plain_median_ms']:.2f} |"
                f" {f['after_median_ms']:.2f} | {f['after_max_ms']:.2f} |"
            )


if __name__ == "__main__":
    main()
