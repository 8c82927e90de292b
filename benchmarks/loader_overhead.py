"""What the self-healing machinery (issue 24) costs a fault-free first pass: this checkout's
loader against another source folder's (the code before the change), side by side.

Usage: python benchmarks/loader_overhead.py --baseline-src /tmp/base/src [--baseline-src ...]
                                             [--src SRC] [--docs 200000] [--rounds 5]
                                             [--samples 4096] [--workers 2] [--drop-caches]

Data as loader.py (lognormal documents, S = 2048, micro-batch 16, one-epoch Megatron-order train
split, its cache built once). Each side runs in a fresh process (``PYTHONPATH`` = its source
folder), sides alternate in order from round to round, and each round reads other samples (a
first pass: the page cache holds the file, the process's page tables hold nothing; past the
split's end the start wraps around, still a first pass for the fresh process). Per side:
samples/s over the pass (its first micro-batch, worker start-up, not timed) and CPU per
micro-batch of the training process and its workers together (the wall rate moves with the
machine's load, the CPU less). Cells are medians over rounds. Several ``--baseline-src`` run
as several "before" sides in the same rotation, each compared with "after". ``--drop-caches``
(root) drops the page cache before every pass, so each reads the token file from disk: the
regime of a first epoch over data that is not cached.

``--tiny``: the training process's fixed cost per hand-over instead (a dataset of tiny batches
made from the indices, 20,000 micro-batches of 4 x 8 after 500 untimed, 2 workers, prefetch 8):
where the consumer's per-batch bookkeeping is most of the work, any cost added to it shows most.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import add_data_arguments, docs_file  # noqa: E402

SIDE = r"""
import json, os, resource, sys, time
payload = json.loads(sys.argv[1])
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.loader import build_dataloader
import torch  # noqa: F401

cfg = MegatronDataConfig(sequence_length=2048, blend=[payload["prefix"]], split="100,0,0",
                         eod_id=50256, path_to_cache=payload["cache"])
ds = build_datasets(cfg, [None, None, None])[0]
mb = payload["micro_batch"]
start = payload["start"] % max(1, len(ds) - payload["samples"] - 4 * mb)  # wraps: fresh process
loader = build_dataloader(ds, micro_batch_size=mb, num_workers=payload["workers"], dp_rank=0,
                          dp_size=1, consumed_samples=start)
tick = os.sysconf("SC_CLK_TCK")

def worker_cpu():
    total = 0
    for p in loader.worker_processes:
        with open(f"/proc/{p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick

def self_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

it = iter(loader)
next(it)  # start-up: not timed
steps = payload["samples"] // mb
c0, w0, t0 = self_cpu(), worker_cpu(), time.perf_counter()
for _ in range(steps):
    batch = next(it)
    del batch
t1, c1, w1 = time.perf_counter(), self_cpu(), worker_cpu()
loader.close()
print(json.dumps({"rate": steps * mb / (t1 - t0), "cpu_us": 1e6 * (c1 - c0 + w1 - w0) / steps,
                  "consumer_us": 1e6 * (c1 - c0) / steps}))
"""


TINY = r"""
import json, resource, time
import numpy as np
import torch  # noqa: F401
from tokenload.loader import build_dataloader

class Tiny:
    def __len__(self):
        return 10**7

    def __getitems__(self, idx):
        return {"tokens": np.asarray(idx, dtype=np.int64)[:, None].repeat(8, 1)}

loader = build_dataloader(Tiny(), micro_batch_size=4, num_workers=2, dp_rank=0, dp_size=1,
                          prefetch_factor=8)
it = iter(loader)
for _ in range(500):
    next(it)
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
n = 20000
for _ in range(n):
    b = next(it)
    del b
t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
loader.close()
print(json.dumps({"rate": n / (t1 - t0), "cpu_us": 1e6 * cpu / n, "consumer_us": 1e6 * cpu / n}))
"""


def run_side(src: str, payload: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": src}
    script = TINY if payload.get("tiny") else SIDE
    out = subprocess.run([sys.executable, "-c", script, json.dumps(payload)], env=env,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"side {src} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def drop_page_cache() -> None:
    """Write back and drop the page cache (needs root): the next pass reads from disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_arguments(ap, docs=200_000)
    ap.add_argument("--baseline-src", required=True, action="append",
                    help="a source folder before the change (repeat for several)")
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"),
                    help="the source folder after the change (default: this checkout's)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=4096, help="samples per pass")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--tiny", action="store_true", help="the per-hand-over cost (module docstring)")
    ap.add_argument("--drop-caches", action="store_true",
                    help="drop the page cache before every pass (root; module docstring)")
    args = ap.parse_args()
    prefix = docs_file(args)
    here = args.src
    sides = {"after (--src)": here}
    for i, src in enumerate(args.baseline_src):
        sides[f"before {i + 1} ({src})" if len(args.baseline_src) > 1 else "before"] = src
    payload = {"prefix": prefix, "cache": os.path.join(args.data_dir, "overhead_cache"),
               "micro_batch": args.micro_batch, "workers": args.workers, "samples": args.samples,
               "tiny": args.tiny}
    if not args.tiny:
        run_side(here, {**payload, "samples": args.micro_batch * 2, "start": 0})  # the cache
    got: dict[str, list[dict]] = {name: [] for name in sides}
    start = args.micro_batch * 4
    for r in range(args.rounds):
        order = list(sides.items())
        order = order[r % len(order):] + order[:r % len(order)]  # each side leads in turn
        for name, src in order:
            if args.drop_caches:
                drop_page_cache()
            res = run_side(src, {**payload, "start": start})
            start += args.samples + 2 * args.micro_batch  # fresh samples for every pass
            got[name].append(res)
            print(f"round {r + 1} {name}: {res['rate']:,.0f} per s, {res['cpu_us']:.1f} us CPU"
                  f" per micro-batch ({res['consumer_us']:.1f} in the training process)",
                  file=sys.stderr)
    what = ("tiny micro-batches (--tiny): 20,000 of 4 x 8, 2 workers, prefetch 8" if args.tiny else
            f"{args.workers} workers, micro-batch {args.micro_batch}, S = 2048, {args.samples}"
            " samples per pass")
    print(f"\n{what}, {args.rounds} rounds (medians), load {os.getloadavg()[0]:.1f}\n")
    unit = "micro-batches/s" if args.tiny else "samples/s"
    print(f"| side | {unit} | CPU us / micro-batch | of which training process |")
    print("|---|---|---|---|")
    keys = ("rate", "cpu_us", "consumer_us")
    med = {n: {k: statistics.median(r[k] for r in got[n]) for k in keys}
           for n in sides}
    for name in sides:
        m = med[name]
        print(f"| {name} | {m['rate']:,.0f} | {m['cpu_us']:.1f} | {m['consumer_us']:.1f} |")
    after = med["after (--src)"]
    for name in list(sides)[1:]:
        before = med[name]
        print(f"\nafter / {name}: rate {after['rate'] / before['rate']:.3f},"
              f" CPU per micro-batch {after['cpu_us'] / before['cpu_us']:.3f},"
              f" training process CPU {after['consumer_us'] / before['consumer_us']:.3f}")
        for key in ("rate", "cpu_us"):
            spread = [a[key] / b[key] for a, b in zip(got["after (--src)"], got[name])]
            print(f"  per-round {key} ratios: {', '.join(f'{x:.3f}' for x in spread)}"
                  f" (median {statistics.median(spread):.3f})")


if __name__ == "__main__":
    main()
