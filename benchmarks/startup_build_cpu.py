"""CPU time per phase of one rank's in-memory build of the startup blend (issue 11's data).

Usage:
    python benchmarks/startup_build_cpu.py --data-dir /tmp/startup-bench/data
    python benchmarks/startup_build_cpu.py --data-dir DATA --baseline-src /tmp/old-checkout/src

What an ``auto`` non-writer rank does on an empty cache: ``build_datasets`` with
``build_policy="every-rank"`` over the blend of benchmarks/startup_data.py (100 prefixes, 3M
documents, S=2048, sizes [2,000,000, 20,480, 5,120], split 99,1,0), then the first item. Each
phase's CPU time is summed over the calls of that phase by the thread that made them
(``time.thread_time``), so the figures hold on a machine shared with other work, where wall
times of startup.py swing 2x between runs. Phases: document index, sample index, shuffle index
(inside GPT builds), blending indices, the oversampling check, and the total CPU of the process
over the whole build (``time.process_time``, every thread). ``--threads`` sets the builder's
pool (default: the builder's own). With ``--baseline-src`` each round runs that source tree
first, then this one, in fresh processes, so load from other processes falls on both alike;
the best round of each is reported.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GPT_PHASES = ("build_document_index", "build_sample_index", "build_shuffle_index")
BUILDER_PHASES = ("build_blending_indices", "check_oversampling", "build_gpt_indices")


def _timed(module, name: str, acc: collections.Counter) -> None:
    """Wrap ``module.name`` so the calling thread's CPU time inside it adds to ``acc[name]``."""
    fn = getattr(module, name)

    def wrapper(*args, **kwargs):
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[name] += time.thread_time() - start

    setattr(module, name, wrapper)


def measure(data_dir: str, threads: int | None) -> dict:
    """One build in this process; CPU seconds per phase and in all."""
    from startup_data import make_blend

    blend = make_blend(data_dir, 100, 3_000_000)
    import tokenload.datasets.megatron.builder as builder
    import tokenload.index.gpt as gpt
    from tokenload.datasets import MegatronDataConfig, build_datasets

    if threads:
        builder.BUILD_THREADS = threads
    acc: collections.Counter = collections.Counter()
    for name in GPT_PHASES:
        _timed(gpt, name, acc)
    for name in BUILDER_PHASES:
        _timed(builder, name, acc)
    paths = [x for w, p in zip(blend["weights"], blend["prefixes"]) for x in (str(w), p)]
    config = MegatronDataConfig(blend=paths, split="99,1,0", sequence_length=2048, random_seed=1234,
                                tokenizer=None, build_policy="every-rank")
    wall, cpu = time.perf_counter(), time.process_time()
    train, _, _ = build_datasets(config, [2_000_000, 20_480, 5_120])
    train[0]
    out = {k: round(v, 4) for k, v in acc.items()}
    out["gpt_other"] = round(acc["build_gpt_indices"] - sum(acc[k] for k in GPT_PHASES), 4)
    out["total_cpu"] = round(time.process_time() - cpu, 4)
    out["wall"] = round(time.perf_counter() - wall, 4)
    out["threads"] = builder.BUILD_THREADS
    return out


def run_child(src: str | None, args) -> dict:
    """``measure`` in a fresh interpreter, with ``src`` first on the import path if given."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if src:
        env["PYTHONPATH"] = src
    cmd = [sys.executable, __file__, "--data-dir", args.data_dir, "--child"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="/tmp/tokenload-bench/startup")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, help="the builder's thread pool (default: its own)")
    ap.add_argument("--baseline-src", help="another checkout's src/ to compare against")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.data_dir, args.threads)))
        return
    sides = ([("baseline", args.baseline_src)] if args.baseline_src else []) + [("this tree", None)]
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for name, src in sides:
            rec = run_child(src, args)
            if name not in best or rec["total_cpu"] < best[name]["total_cpu"]:
                best[name] = rec
    keys = [*GPT_PHASES, "gpt_other", "build_blending_indices", "check_oversampling", "total_cpu", "wall"]
    print(f"best of {args.rounds} rounds (CPU s; wall s last), threads {best[sides[-1][0]]['threads']}")
    print("| phase | " + " | ".join(n for n, _ in sides) + " |")
    print("|---|" + "---|" * len(sides))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{best[n].get(k, 0):.3f}" for n, _ in sides) + " |")


if __name__ == "__main__":
    main()
