"""Why a Megatron-order index build is not linear in the documents (issue 27, goal 1's growth).

Usage: python benchmarks/growth.py [--sizes 1000000 10000000 100000000] [--rounds 3]

Megatron's order is defined by two NumPy primitives that tokenload must call exactly as Megatron
does to stay bit-identical: the legacy ``RandomState.shuffle`` (Fisher-Yates: one swap with a
random position per element) of the document index, and the sample index's walk, which reads
each document's length at a random position of the length array (``lengths[document_index]``).
This script times those two primitives alone, on arrays of the build's sizes (int32 ids, int32
lengths), beside sequential controls (``cumsum`` of the same ids into memory already used, and
into a fresh array, whose first touch this VM charges dearly), each in a fresh process
per size and round, sizes rotating. CPU nanoseconds per element, median of the rounds (range):
if the primitives themselves cost several times more per element at 100M than at 1M, no build
that keeps Megatron's order can be linear, and the build's own growth is bounded by theirs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
import numpy as np
n = int(sys.argv[1])
out = {}
def timed(name, fn):
    c, w = time.process_time(), time.perf_counter()
    r = fn()
    out[name] = ((time.process_time() - c) * 1e9 / n, (time.perf_counter() - w) * 1e9 / n)
    return r
ids = timed("arange (fresh array)", lambda: np.arange(n, dtype=np.int32))
acc = np.ones(n, dtype=np.int64)
timed("cumsum into a used array (sequential control)", lambda: np.cumsum(ids, out=acc))
timed("cumsum into a fresh array (first touch)", lambda: np.cumsum(ids, dtype=np.int64))
rng = np.random.RandomState(1234)
timed("RandomState.shuffle (document index)", lambda: rng.shuffle(ids))
lengths = np.random.default_rng(0).integers(1, 4096, n, dtype=np.int32)
timed("lengths[document_index] (random gather)", lambda: lengths[ids])
timed("lengths[arange] (sequential gather)", lambda: lengths[np.arange(n, dtype=np.int32)])
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    got: dict[int, list[dict[str, list[float]]]] = {n: [] for n in args.sizes}
    for r in range(args.rounds):
        sizes = args.sizes[r % len(args.sizes) :] + args.sizes[: r % len(args.sizes)]
        for n in sizes:
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", CHILD, str(n)], capture_output=True,
                                 text=True, check=True)
            got[n].append(json.loads(res.stdout))
            print(f"round {r + 1}, {n:,}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    names = list(got[args.sizes[0]][0])
    print("| step | " + " | ".join(f"{n:,} CPU ns/elem" for n in args.sizes)
          + f" | {args.sizes[-1]:,} / {args.sizes[0]:,} |")
    print("|---|" + "---|" * (len(args.sizes) + 1))
    for name in names:
        cells, medians = [], []
        for n in args.sizes:
            cpu = [run[name][0] for run in got[n]]
            medians.append(statistics.median(cpu))
            cells.append(f"{medians[-1]:.1f} ({min(cpu):.1f}-{max(cpu):.1f})")
        print(f"| {name} | " + " | ".join(cells) + f" | {medians[-1] / medians[0]:.2f}x |")


if __name__ == "__main__":
    main()
