"""``build_policy="none"``'s data startup, two source trees side by side: ``build_datasets`` from
a prepared build manifest, then the first micro-batch (which maps and verifies the arrays it
reads), timed inside fresh processes after their imports, the trees alternating each round.

Usage: python benchmarks/none_start.py --before SRC --after SRC [--rounds 15]
           [--blend BLEND_JSON] [--work DIR]

BLEND_JSON: ``startup_data.py``'s blend (default: 100 prefixes of 1M documents in all, made in
``DIR/data`` if missing); S = 2048, seed 1234, split ``99,1,0``, 200,000 train and 2,000 valid
samples (``startup_side.py``'s configuration). Each tree prepares its own cache first
(``DIR/cache-before``, ``DIR/cache-after``: a tree's manifest format may differ), with ``auto``.
Session 34 used it for the digests a build manifest carries (issue 34, point 8).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, resource, sys, time
import numpy
from tokenload.datasets import MegatronDataConfig, build_datasets
policy, cache, blend = sys.argv[1:4]
prefixes = json.load(open(blend))["prefixes"]
cfg = MegatronDataConfig(sequence_length=2048, random_seed=1234, blend=prefixes, split="99,1,0",
                         path_to_cache=cache, build_policy=policy, eod_id=0)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
t0, c0 = time.perf_counter(), cpu()
ds = build_datasets(cfg, [200_000, 2_000, 0])[0]
t1, c1 = time.perf_counter(), cpu()
assert ds.__getitems__(numpy.arange(16))["tokens"].shape == (16, 2048)
t2, c2 = time.perf_counter(), cpu()
print(json.dumps({"build": t1 - t0, "build_cpu": c1 - c0, "first": t2 - t1, "first_cpu": c2 - c1}))
"""


def child(src: str, policy: str, cache: Path, blend: str) -> dict:
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, policy, str(cache), blend], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--blend", default=None)
    ap.add_argument("--work", default="/tmp/tokenload-bench/none-start")
    args = ap.parse_args()
    work = Path(args.work)
    blend = args.blend
    if blend is None:
        sys.path.insert(0, str(HERE))
        from startup_data import make_blend

        make_blend(str(work / "data"), 100, 1_000_000)
        blend = str(work / "data" / "blend_100x1000000" / "blend.json")
    trees = {"before": args.before, "after": args.after}
    for name, src in trees.items():
        child(src, "auto", work / f"cache-{name}", blend)  # prepared by the tree itself
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            runs[name].append(child(trees[name], "none", work / f"cache-{name}", blend))
    print(f"{args.rounds} rounds, medians (ms); load {os.getloadavg()[0]:.1f}")
    print("| tree | build_datasets wall | CPU | first micro-batch wall | CPU |")
    print("|---|---|---|---|---|")
    for name in trees:
        m = {k: 1000 * statistics.median(x[k] for x in runs[name]) for k in runs[name][0]}
        print(f"| {name} | {m['build']:.1f} | {m['build_cpu']:.1f} | {m['first']:.1f} |"
              f" {m['first_cpu']:.1f} |")
    pairs = [a["build"] + a["first"] - b["build"] - b["first"]
             for a, b in zip(runs["after"], runs["before"])]
    print(f"paired difference after - before, build + first batch: median"
          f" {1000 * statistics.median(pairs):+.1f} ms")


if __name__ == "__main__":
    main()
