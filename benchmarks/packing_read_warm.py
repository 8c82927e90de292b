"""Warm read path in one process: CPU per micro-batch of 16 rows of the computed order, packed
against concatenated, on the same file, within one packed block (no block is packed in the timed
part), sides alternating. Usage:

    python benchmarks/packing_read_warm.py PREFIX [--rounds 2] [--batches 300]

(PREFIX: e.g. packing.py's web mix, /tmp/tokenload-bench/packing/web_200000.)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tokenload.datasets import MegatronDataConfig, build_datasets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--seq-length", type=int, default=2048)
    args = ap.parse_args()
    for _ in range(args.rounds):
        for packing in ("concat", "best-fit"):
            cfg = MegatronDataConfig(
                sequence_length=args.seq_length,
                blend=[args.prefix],
                split="100,0,0",
                order="computed",
                packing=packing,
            )
            ds = build_datasets(cfg, [60_000, 0, 0])[0]
            for i in range(20):  # the first block packed, the pages touched
                ds.__getitems__(np.arange(16 * i, 16 * i + 16))
            start = time.process_time()
            for i in range(args.batches):
                ds.__getitems__(np.arange(320 + 16 * i, 336 + 16 * i))
            cpu = (time.process_time() - start) / args.batches
            print(f"{packing:8s} {cpu * 1e6:6.0f} us CPU per micro-batch of 16")


if __name__ == "__main__":
    main()
