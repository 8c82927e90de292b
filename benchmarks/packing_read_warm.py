"""The packed read path in one process, without the loader: CPU per micro-batch of 16 rows of the
computed order's dataset (``__getitems__``), packed against concatenated, on the same file, the
sides alternating. Usage:

    python benchmarks/packing_read_warm.py PREFIX [--rounds 2] [--batches 300]
    python benchmarks/packing_read_warm.py PREFIX --first-pass [--rounds 6] [--batches 60]

(PREFIX: e.g. packing.py's web mix, /tmp/tokenload-bench/packing/web_200000.) By default the
rows lie within the first packed block and its pages were touched before timing (warm, no block
packed in the timed part), read by mmap. ``--first-pass``: every round reads rows no side has
read before (the file in the page cache, the process's first touch of them), by mmap and by
pread.
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
    ap.add_argument("--first-pass", action="store_true", help="rows never read, mmap and pread")
    args = ap.parse_args()
    modes = ("mmap", "pread") if args.first_pass else ("mmap",)
    sides = {}
    for packing in ("concat", "best-fit"):
        for mode in modes:
            cfg = MegatronDataConfig(
                sequence_length=args.seq_length,
                blend=[args.prefix],
                split="100,0,0",
                order="computed",
                packing=packing,
                read_mode=mode,
            )
            sides[packing, mode] = build_datasets(cfg, [60_000, 0, 0])[0]
    for ds in sides.values():  # the first block packed (warm: its pages touched)
        for i in range(1 if args.first_pass else 20):
            ds.__getitems__(np.arange(16 * i, 16 * i + 16))
    cpu: dict[tuple[str, str], list[float]] = {k: [] for k in sides}
    for r in range(args.rounds):
        for key, ds in sides.items():
            start = time.process_time()
            for i in range(args.batches):
                # first pass: rows no side has read; warm: the same rows every round
                first = 1000 + (r * args.batches + i) * 16 if args.first_pass else 320 + 16 * i
                ds.__getitems__(np.arange(first, first + 16))
            cpu[key].append((time.process_time() - start) / args.batches * 1e6)
    for (packing, mode), values in cpu.items():
        print(f"{packing:8s} {mode:5s} {np.median(values):6.0f} us CPU per micro-batch (median)")


if __name__ == "__main__":
    main()
