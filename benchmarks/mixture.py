"""The cost of a weights schedule (issue 26) on startup and read throughput, side by side.

Usage: python benchmarks/mixture.py [--data-dir DIR] [--rounds 5] [--train 200000]
           [--batches 20] [--blocks 15] [--micro-batch 16]

Data: three token files of ``--tokens`` random uint16 tokens each (documents of 1-4000 tokens),
written once into ``--data-dir``; S = 2048, the train split of ``100,0,0``, ``--train`` samples.
Variants, per order:

* ``fixed``: the blend with fixed weights 5:3:2 (today's path);
* ``schedule 4``: the same blend with a 4-entry ``weights_schedule`` (one change per quarter);
* ``schedule 64``: a 64-entry schedule (computed order);
* ``continue``: ``mixture_change="continue"`` and no schedule (Megatron order: the blend served
  through the segment chain instead of Megatron's arrays).

*Startup*: each variant in a fresh process (torch imported before the clock starts), from the
``build_datasets`` call to the first micro-batch out of a loader (0 workers, in-memory build,
``cache="off"``); variants alternate within each round; medians of ``--rounds``. *Read*: one
process per order holds every variant's loader (0 workers, starting at sample ``train // 3``,
past the first change, page cache warm) and reads them in alternating blocks of ``--batches``
micro-batches, ``--blocks`` times; the cell is samples per CPU second of the median block, so a
preempted block costs wall time, not the ratio. The machine may be shared: compare the sides of
one run, not absolute figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SEQ = 2048


def make_data(folder: Path, tokens: int) -> list[str]:
    from tokenload.format import TokenFileWriter

    folder.mkdir(parents=True, exist_ok=True)
    prefixes = []
    for f in range(3):
        prefix = folder / f"src{f}-{tokens}"
        prefixes.append(str(prefix))
        if Path(f"{prefix}.idx").exists():
            continue
        rng = np.random.default_rng(f)
        with TokenFileWriter(str(prefix), np.uint16) as w:
            left = tokens
            while left > 0:
                n = min(int(rng.integers(1, 4000)), left)
                w.add_document(rng.integers(1, 50000, size=n, dtype=np.int64), None)
                left -= n
    return prefixes


def schedule(entries: int, train: int) -> list:
    rng = np.random.default_rng(entries)
    return [(0, [5, 3, 2])] + [
        (i * train // entries, [float(x) for x in rng.integers(1, 10, size=3)])
        for i in range(1, entries)
    ]


def build(order: str, variant: str, args):
    from tokenload.datasets import MegatronDataConfig, build_datasets

    extra = {}
    if variant.startswith("schedule"):
        extra["weights_schedule"] = schedule(int(variant.split()[1]), args.train)
    if variant == "continue":
        extra["mixture_change"] = "continue"
    blend = [x for w, p in zip((5, 3, 2), args.prefixes) for x in (str(w), p)]
    cfg = MegatronDataConfig(sequence_length=SEQ, blend=blend, split="100,0,0", cache="off",
                             order=order, **extra)
    return build_datasets(cfg, [args.train, 0, 0])[0]


def loader_at(dataset, args):
    from tokenload.loader import build_dataloader

    start = (args.train // 3) // args.micro_batch * args.micro_batch
    return build_dataloader(dataset, micro_batch_size=args.micro_batch, dp_rank=0, dp_size=1,
                            num_workers=0, consumed_samples=start)


def child_startup(args) -> None:
    """One variant in a fresh process: build + loader + first micro-batch (imports excluded)."""
    import torch  # noqa: F401  (imported before the clock starts, as in a training script)

    import tokenload.datasets  # noqa: F401
    import tokenload.loader  # noqa: F401

    order, variant = args.child
    started = time.perf_counter()
    next(iter(loader_at(build(order, variant, args), args)))
    print(json.dumps({"startup": time.perf_counter() - started}))


def child_read(args) -> None:
    """Every variant of one order in one process, read in alternating blocks: CPU seconds per
    block, so that a preempted block costs wall time but not the ratio."""
    order = args.child[0]
    iters = {v: iter(loader_at(build(order, v, args), args)) for v in VARIANTS[order]}
    for it in iters.values():
        next(it)
    times: dict = {v: [] for v in iters}
    for _ in range(args.blocks):
        for v, it in iters.items():
            cpu = time.process_time()
            for _ in range(args.batches):
                next(it)
            times[v].append(time.process_time() - cpu)
    print(json.dumps(times))


VARIANTS = {
    "computed": ["fixed", "schedule 4", "schedule 64"],
    "megatron": ["fixed", "continue", "schedule 4"],
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default="/tmp/tokenload-bench-mixture")
    p.add_argument("--tokens", type=int, default=4_000_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--train", type=int, default=200_000)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--blocks", type=int, default=15)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--child", nargs=2, default=None)
    p.add_argument("--prefixes", nargs="*", default=None)
    args = p.parse_args()
    if args.child:
        return child_read(args) if args.child[1] == "read" else child_startup(args)
    prefixes = make_data(Path(args.data_dir), args.tokens)
    common = ["--prefixes", *prefixes, "--train", str(args.train), "--batches", str(args.batches),
              "--blocks", str(args.blocks), "--micro-batch", str(args.micro_batch)]

    def run(*child):
        cmd = [sys.executable, __file__, "--child", *child, *common]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return json.loads(out.splitlines()[-1])

    startup: dict = {}
    reads: dict = {}
    for _ in range(args.rounds):
        for order, variants in VARIANTS.items():
            for variant in variants:
                startup.setdefault((order, variant), []).append(run(order, variant)["startup"])
    for order in VARIANTS:
        for variant, blocks in run(order, "read").items():
            reads[(order, variant)] = blocks
    samples = args.batches * args.micro_batch
    print("| order | variant | startup s (median) | vs fixed | samples per CPU s (median block) |"
          " vs fixed |")
    print("|---|---|---|---|---|---|")
    for order, variants in VARIANTS.items():
        base_s = statistics.median(startup[(order, "fixed")])
        base_r = samples / statistics.median(reads[(order, "fixed")])
        for variant in variants:
            s = statistics.median(startup[(order, variant)])
            r = samples / statistics.median(reads[(order, variant)])
            print(f"| {order} | {variant} | {s:.3f} | {s / base_s:.2f} | {r:,.0f} |"
                  f" {r / base_r:.3f} |")


if __name__ == "__main__":
    main()
