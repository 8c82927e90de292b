"""A fresh process's data startup, two source trees side by side: build a 3-prefix blend and take
the first micro-batch (timed inside the process, after its imports of numpy and torch), for the
Megatron and the computed order, alternating the trees each round (paired differences).

Usage: python benchmarks/fresh_start.py --before SRC --after SRC [--rounds 15] [--docs 120]

SRC is a tree's ``src`` folder (e.g. a ``git worktree`` of an earlier commit). Session 32 used it
for ``tokenload.arrays.distinct``: NumPy 2.x's first ``np.unique`` of a process imports
``numpy.ma``, which every rank and spawned worker paid in its first micro-batch.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import synthetic_docs_file  # noqa: E402

CHILD = r"""
import json, sys, time
import numpy, torch  # imported before the clock: only the data's startup is timed
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.datasets.computed.computed_dataset import build_computed_datasets
from tokenload.loader import build_dataloader
order, prefixes = sys.argv[1], sys.argv[2:]
t = time.perf_counter()
blend = [x for w, p in zip(("0.5", "0.3", "0.2"), prefixes) for x in (w, p)]
config = MegatronDataConfig(blend=blend, split="100,0,0", sequence_length=16)
build = build_datasets if order == "megatron" else build_computed_datasets
dataset = build(config, [200, 0, 0])[0]
next(iter(build_dataloader(dataset, micro_batch_size=8, num_workers=0)))
print(json.dumps(time.perf_counter() - t))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the earlier tree's src folder")
    ap.add_argument("--after", required=True, help="the later tree's src folder")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--docs", type=int, default=120, help="documents per prefix")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tokenload-fresh-start-"))
    prefixes = [synthetic_docs_file(folder / name, docs=args.docs, mean_len=20, seed=i, vocab=999)
                for i, name in enumerate("abc")]
    trees = {"before": args.before, "after": args.after}
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for order in ("megatron", "computed"):
            for tree in ("before", "after") if r % 2 == 0 else ("after", "before"):
                env = dict(os.environ, PYTHONPATH=trees[tree])
                run = subprocess.run([sys.executable, "-c", CHILD, order, *prefixes], env=env,
                                     capture_output=True, text=True, check=True)
                times.setdefault((order, tree), []).append(json.loads(run.stdout) * 1e3)
    for order in ("megatron", "computed"):
        before, after = times[order, "before"], times[order, "after"]
        paired = statistics.median(b - a for b, a in zip(before, after))
        print(f"{order}: before median {statistics.median(before):.1f} ms, after"
              f" {statistics.median(after):.1f} ms, paired difference median {paired:.1f} ms"
              f" ({args.rounds} rounds)")


if __name__ == "__main__":
    main()
