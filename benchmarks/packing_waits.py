"""The waits a training loop sees, and the CPU each process of a loader spends, packed against
concatenated (benchmarks/README.md, "Packing", the read path).

Usage: python benchmarks/packing_waits.py [--prefix DATA/web_200000] [--workers 2] [--start 39056]
                                          [--steps 2047] [--rounds 2] [--step-ms 0]

The web mix of benchmarks/packing.py (made by it), the computed order at S = 2,048, micro-batches
of 16. Each side runs in a fresh process (the file warmed into the page cache first), sides
alternating per round: the loader from row ``--start``, its first micro-batch untimed, then
``--steps`` calls of ``next()``, each timed, with ``--step-ms`` of sleep after each (a training
step: the workers then have time between micro-batches, as they do in training). Reported per
side: the whole pass, the longest wait
and where it fell (a block packed while the workers wait shows as one wait of tens of ms), the mean
wait per eighth of the pass, and each process's user and system CPU and minor faults over the pass
(``/proc/PID/stat``: the training process, then each worker).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

SIDE = r"""
import json, os, sys, time
import numpy as np
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.format import warmup_file
from tokenload.loader import build_dataloader

a = json.loads(sys.argv[1])
warmup_file(a["prefix"] + ".bin")
warmup_file(a["prefix"] + ".idx")
cfg = MegatronDataConfig(sequence_length=2048, random_seed=1234, blend=[a["prefix"]],
                         split="100,0,0", order="computed", packing=a["packing"], eod_id=0,
                         pad_id=0)
ds = build_datasets(cfg, [10**6, 0, 0])[0]
loader = build_dataloader(ds, micro_batch_size=16, num_workers=a["workers"], dp_rank=0,
                          dp_size=1, persistent_workers=True, consumed_samples=a["start"])
it = iter(loader)
next(it)
tick = os.sysconf("SC_CLK_TCK")
pids = [os.getpid()] + [p.pid for p in loader.worker_processes]

def usage(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) / tick, int(f[12]) / tick, int(f[7])

before = [usage(p) for p in pids]
waits = []
for _ in range(a["steps"]):
    t = time.perf_counter()
    next(it)
    waits.append(time.perf_counter() - t)
    if a["step_s"]:
        time.sleep(a["step_s"])
after = [usage(p) for p in pids]
loader.close()
w = np.array(waits) * 1e6
print(json.dumps({
    "pass_ms": round(w.sum() / 1e3, 1),  # the waits only (the steps' sleep not counted)
    "longest_wait_ms": round(w.max() / 1e3, 2),
    "at_step": int(w.argmax()),
    "mean_wait_us_per_eighth": [int(c.mean()) for c in np.array_split(w, 8)],
    "user_ms_sys_ms_minflt": [
        [round(1e3 * (b[0] - x[0])), round(1e3 * (b[1] - x[1])), b[2] - x[2]]
        for x, b in zip(before, after)
    ],
}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", default="/tmp/tokenload-bench/packing/web_200000")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--start", type=int, default=39056)
    ap.add_argument("--steps", type=int, default=2047)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=0.0)
    args = ap.parse_args()
    sides = ["concat", "best-fit"]
    for r in range(args.rounds):
        for packing in sides[r % 2 :] + sides[: r % 2]:
            payload = {
                "prefix": args.prefix,
                "packing": packing,
                "workers": args.workers,
                "start": args.start,
                "steps": args.steps,
                "step_s": args.step_ms / 1e3,
            }
            got = (
                subprocess.run(
                    [sys.executable, "-c", SIDE, json.dumps(payload)],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            print(f"round {r + 1} {packing} {args.workers} workers: {got}", flush=True)


if __name__ == "__main__":
    main()
