"""Megatron's greedy blending indices: tokenload's NumPy simulation against megatron-core's C++.

Usage: MEGATRON_PYTHON=... python benchmarks/blending_greedy.py [--datasets 3 100 1000]
           [--samples 1464408] [--rounds 3]

The blend of a Megatron-order build ends with ``build_blending_indices(weights, size)``: a
sequential greedy over ``size`` samples and every dataset. megatron-core runs it as a C++ loop;
tokenload (no compiled code) as a verified parallel-in-time NumPy simulation
(``tokenload.index.blending``). This times the call alone on each side, in a fresh process per
side and round (sides alternating), with lognormal weights normalized as Megatron normalizes
them, and checks that both sides return the same two arrays. CPU seconds, median (range).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import MEGATRON_PYTHON

CHILD = r"""
import hashlib, json, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np
side, d, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
w = np.random.default_rng(0).lognormal(0, 1, d)
w = w / w.sum(); w = w / w.sum()
if side == "megatron-core":
    from megatron.core.datasets import helpers
    di = np.zeros(size, dtype=np.int16); dsi = np.zeros(size, dtype=np.int64)
    c = time.process_time()
    helpers.build_blending_indices(di, dsi, w, d, size, False)
else:
    from tokenload.index.blending import build_blending_indices
    c = time.process_time()
    di, dsi = build_blending_indices(w, size)
cpu = time.process_time() - c
digest = hashlib.sha256(di.astype(np.int16).tobytes() + dsi.astype(np.int64).tobytes()).hexdigest()
print(json.dumps({"cpu": cpu, "digest": digest}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", type=int, nargs="+", default=[3, 100, 1000])
    ap.add_argument("--samples", type=int, default=1_464_408)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sides = {"tokenload": sys.executable, "megatron-core": MEGATRON_PYTHON}
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    print("| datasets | samples | tokenload CPU s | megatron-core CPU s | tokenload / mcore "
          "| same arrays |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for d in args.datasets:
            got: dict[str, list[dict]] = {s: [] for s in sides}
            for r in range(args.rounds):
                order = list(sides) if r % 2 == 0 else list(sides)[::-1]
                for side in order:
                    out = subprocess.run(
                        [sides[side], "-c", CHILD, side, str(d), str(args.samples)],
                        capture_output=True, text=True, check=True, env=env, cwd=tmp)
                    got[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            cpu = {s: [g["cpu"] for g in got[s]] for s in sides}
            med = {s: statistics.median(cpu[s]) for s in sides}
            same = len({g["digest"] for s in sides for g in got[s]}) == 1
            print(f"| {d:,} | {args.samples:,} | {med['tokenload']:.3f} "
                  f"({min(cpu['tokenload']):.3f}-{max(cpu['tokenload']):.3f}) | "
                  f"{med['megatron-core']:.3f} ({min(cpu['megatron-core']):.3f}-"
                  f"{max(cpu['megatron-core']):.3f}) | "
                  f"{med['tokenload'] / med['megatron-core']:.2f} | {'yes' if same else 'NO'} |",
                  flush=True)


if __name__ == "__main__":
    main()
