"""The first pass of the Megatron order with and without issue 25's read checks, side by side.

Usage: python benchmarks/integrity_first_pass.py --prefix PREFIX --baseline-src DIR
                                                 [--rounds 7] [--batches 512] [--micro-batch 16]

Each side is a fresh process (this checkout's ``src``, and ``--baseline-src``: a worktree with
the checks turned off, or an earlier commit), alternating in order from round to round, on the
same random fresh sample indices: ``build_datasets`` of the one-epoch train split (S = 2048,
split 100,0,0, cache prepared first), one untimed micro-batch, then ``--batches`` timed
micro-batches of ``__getitems__`` (tokens, labels, loss mask, position ids). Reported per side:
samples/s and CPU microseconds per micro-batch, median of the rounds and their spread. The
token file is read once into the page cache first. benchmarks/loader.py measures the same
regime next to megatron-core; this script needs only tokenload.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIDE = r"""
import json, sys, time, os, logging
import numpy as np
logging.disable(logging.WARNING)
from tokenload.datasets import MegatronDataConfig, build_datasets
p = json.loads(sys.argv[1])
cfg = MegatronDataConfig(sequence_length=2048, blend=[p["prefix"]], split="100,0,0",
                         random_seed=1234, path_to_cache=p["cache"])
train = build_datasets(cfg, [None, 0, 0])[0]
rng = np.random.default_rng(p["seed"])
order = rng.permutation(len(train))
mb = p["micro_batch"]
train.__getitems__(order[:mb].tolist())
batches = [order[mb * (i + 1): mb * (i + 2)].tolist() for i in range(p["batches"])]
cpu, wall = time.process_time(), time.perf_counter()
for b in batches:
    train.__getitems__(b)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({"rate": mb * len(batches) / wall, "cpu_us": cpu / len(batches) * 1e6,
                  "src": __import__("tokenload").__file__}))
"""


def run(src: str, payload: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", SIDE, json.dumps(payload)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--baseline-src", required=True)
    ap.add_argument("--cache", default="/tmp/tokenload-bench/integrity-first-pass-cache")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batches", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=16)
    args = ap.parse_args()
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    sides = {"checks on (this checkout)": here, "baseline": args.baseline_src}
    for path in (args.prefix + ".bin", args.prefix + ".idx"):
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass
    results: dict[str, list[dict]] = {name: [] for name in sides}
    for r in range(args.rounds):
        names = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in names:
            cache = f"{args.cache}-{list(sides).index(name)}"
            payload = {"prefix": args.prefix, "cache": cache, "seed": r,
                       "micro_batch": args.micro_batch, "batches": args.batches}
            res = run(sides[name], payload)
            results[name].append(res)
            print(f"  round {r + 1} {name}: {res['rate']:,.0f} samples/s,"
                  f" {res['cpu_us']:.1f} CPU us/batch", flush=True)
    load = os.getloadavg()[0]
    print(f"\n{args.rounds} rounds, {args.batches} micro-batches of {args.micro_batch} per side and"
          f" round; nproc {os.cpu_count()}, load average at the end {load:.1f} (a busy machine:"
          " medians)\n")
    print("| side | samples/s median (min-max) | CPU us per micro-batch median (min-max) |")
    print("|---|---|---|")
    med = {}
    for name, rows in results.items():
        rates, cpus = [x["rate"] for x in rows], [x["cpu_us"] for x in rows]
        med[name] = (statistics.median(rates), statistics.median(cpus))
        print(f"| {name} | {med[name][0]:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) |"
              f" {med[name][1]:.1f} ({min(cpus):.1f}-{max(cpus):.1f}) |")
    on, off = med["checks on (this checkout)"], med["baseline"]
    print(f"\nchecks on / baseline: samples/s {on[0] / off[0]:.3f}x,"
          f" CPU per micro-batch {on[1] / off[1]:.3f}x")


if __name__ == "__main__":
    main()
