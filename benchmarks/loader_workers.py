"""tokenload DataLoader throughput by worker count (no peer): does adding workers pay off here?

Usage: python benchmarks/loader_workers.py [--data-dir /tmp/tokenload-bench] [--gb 0.5]
                                            [--micro-batch 16] [--workers 0 1 2 4 8] [--samples 16384]
                                            [--prefetch N]

Same data and dataset as loader.py (lognormal documents, S = 2048, one-epoch Megatron-order train
split), read through ``build_dataloader`` with each worker count. Complements loader.py on
machines with more cores than the 2 of the development machine, where the workers and the
consuming process compete for the same CPUs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import add_data_arguments, docs_file, table  # noqa: E402

from tokenload.datasets import MegatronDataConfig, build_datasets  # noqa: E402
from tokenload.loader import build_dataloader  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_arguments(ap, gb=0.5)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    ap.add_argument("--samples", type=int, default=16384)
    ap.add_argument("--prefetch", type=int, default=None, help="prefetch_factor (default: the loader's)")
    args = ap.parse_args()
    prefix = docs_file(args)
    cfg = MegatronDataConfig(sequence_length=2048, blend=[prefix], split="100,0,0", eod_id=50256,
                             path_to_cache=os.path.join(args.data_dir, "workers_cache"))
    train, _, _ = build_datasets(cfg, [None, None, None])
    rows = []
    for workers in args.workers:
        loader = build_dataloader(train, micro_batch_size=args.micro_batch, num_workers=workers, dp_rank=0,
                                  dp_size=1, prefetch_factor=args.prefetch if workers else None)
        it = iter(loader)
        next(it)  # worker start-up is not timed
        steps = args.samples // args.micro_batch
        t = time.perf_counter()
        for _ in range(steps):
            next(it)
        rate = steps * args.micro_batch / (time.perf_counter() - t)
        loader.close()
        rows.append([workers, f"{rate:,.0f}"])
    print(f"{prefix}: {len(train):,} samples of 2048 tokens, micro-batch {args.micro_batch}, nproc {os.cpu_count()}\n")
    print(table(rows, ["workers", "samples/s"]))


if __name__ == "__main__":
    main()
