"""The training loop's data wait: the share of each step spent waiting for the next micro-batch,
tokenload's DataLoader vs megatron-core's (torch's DataLoader over its GPTDataset).

Usage: python benchmarks/data_wait.py [--data-dir /tmp/tokenload-bench] [--docs 1000000]
                                      [--micro-batch 16] [--rounds 3] [--workers 0 1 2]
                                      [--steps-ms 0.25 0.5 ... 200] [--variants ...] [--quick]

A simulated training step that does not use the CPU: ``time.sleep(step)`` stands in for the GPU.
The loop is ``t = now(); batch = next(it); wait += now() - t; sleep(step)``, micro-batch 16 x 2048
tokens (tokens, labels, loss_mask, position_ids as torch tensors on both sides), first-pass reads:
each configuration runs in a fresh process and reads consecutive dataset indices (already
shuffled samples) that it never reads twice, from a file in the page cache. Step times go up
from the shortest; each level first runs a few untimed steps so the prefetch queue settles. The
share is wait / (wait + slept time) over a level's timed steps. The loop also reads how long it
was runnable but waiting for a CPU during ``next()`` (``/proc/thread-self/schedstat``), and the
report gives the 1% step again without that delay: what a process with its cores to itself would
wait (a worker's own delays still count), on a machine other work shares.

Configurations: tokenload with 0, 1 and 2 workers (``build_dataloader``, defaults), megatron-core
with 0, 1 and 2 workers (``torch.utils.data.DataLoader(ds, batch_size=16)``, persistent workers,
prefetch 2), plus the read-path ideas of ``prototypes.py`` for tokenload with 2 workers. Each
round runs every configuration once, the same indices for both libraries at a worker count,
sides alternating in order; cells are medians over rounds. Reported per configuration: the
smallest step time from which every longer one waits at most 1% of the step.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import MEGATRON_DATASET, MEGATRON_PYTHON, add_data_arguments, docs_file, table  # noqa: E402
from prototypes import VARIANTS, apply_variant  # noqa: E402

SEQ = 2048
SEED = 1234
VOCAB = 50257
STEPS_MS = (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 200)
BAR = 0.01
WARMUP_STEPS = 4

LOOP = r"""
import time


def queued_s():
    # seconds this thread has spent runnable but waiting for a CPU (other processes on the cores);
    # 0 where the kernel does not say (no /proc/thread-self/schedstat)
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def timed_steps(step_s):
    # timed steps per level: about 1 s of sleeping, at least 12, at most 64
    return max(12, min(64, int(1.0 / step_s)))


def wait_loop(it, levels_ms, warmup):
    # per step-time level: wait share, mean wait and mean step (us), over the level's timed steps
    out = []
    now, sleep = time.perf_counter, time.sleep
    next(it)  # worker start-up, not timed
    for ms in levels_ms:
        step = ms / 1000
        for _ in range(warmup):
            next(it)
            sleep(step)
        waits = []
        slept = queued = 0.0
        n = timed_steps(step)
        for _ in range(n):
            q, t = queued_s(), now()
            batch = next(it)
            t1 = now()
            queued += queued_s() - q
            sleep(step)
            waits.append(t1 - t)
            slept += now() - t1
        del batch
        waited = sum(waits)
        own = max(waited - queued, 0.0)
        out.append({"ms": ms, "share": waited / (waited + slept), "wait_us": waited / n * 1e6,
                    "p50_us": sorted(waits)[n // 2] * 1e6, "step_us": (waited + slept) / n * 1e6,
                    "queued_us": queued / n * 1e6, "own_share": own / (own + slept)})
    return out


def samples_needed(levels_ms, warmup, mb):
    return (1 + sum(warmup + timed_steps(ms / 1000) for ms in levels_ms)) * mb
"""
exec(LOOP)  # the same loop runs on both sides

PEER = LOOP + MEGATRON_DATASET + r"""
w, mb, start = a["workers"], a["micro_batch"], a["start"]
n = samples_needed(a["levels"], a["warmup"], mb)
dl = torch.utils.data.DataLoader(ds, batch_size=mb, sampler=range(start, start + n), num_workers=w,
                                 persistent_workers=w > 0)
print(json.dumps(wait_loop(iter(dl), a["levels"], a["warmup"])))
"""


def side_tokenload(a: dict) -> list:
    """tokenload's loop, in this fresh process."""
    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.loader import build_dataloader

    variant = apply_variant(a.get("variant", "mmap"))
    config = MegatronDataConfig(
        sequence_length=a["seq"], random_seed=a["seed"], blend=[a["prefix"]], split="100,0,0",
        eod_id=a["vocab"] - 1, pad_id=-1, path_to_cache=a["tokenload_cache"], read_mode=variant["read_mode"],
    )
    ds = build_datasets(config, [None, None, None])[0]
    loader = build_dataloader(ds, micro_batch_size=a["micro_batch"], num_workers=a["workers"], dp_rank=0,
                              dp_size=1, consumed_samples=a["start"], **variant["loader"])
    try:
        return wait_loop(iter(loader), a["levels"], a["warmup"])  # noqa: F821 (from LOOP)
    finally:
        loader.close()


def run(side: str, payload: dict) -> list:
    """One configuration in a fresh process (tokenload's venv or megatron-core's)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(payload, f)
        f.flush()
        if side == "megatron":
            cmd = [MEGATRON_PYTHON, "-c", PEER, f.name]
        else:
            cmd = [sys.executable, __file__, "--side", f.name]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{side} side failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def threshold(shares: dict[float, float]) -> float:
    """Smallest step time (ms) from which every longer step waits at most ``BAR``; inf if none."""
    best = math.inf
    for ms in sorted(shares, reverse=True):
        if shares[ms] > BAR:
            break
        best = ms
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_arguments(ap, docs=1_000_000)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps-ms", type=float, nargs="+", default=list(STEPS_MS))
    ap.add_argument("--variants", nargs="*", default=["pread", "ahead-populate"],
                    choices=[v for v in VARIANTS if v not in ("mmap", "populate")],
                    help="read-path ideas measured for tokenload with 2 workers")
    ap.add_argument("--quick", action="store_true", help="small smoke run: 1 round, 3 step times, 1 variant")
    ap.add_argument("--side", help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    if args.side:
        print(json.dumps(side_tokenload(json.loads(Path(args.side).read_text()))))
        return
    if args.quick:
        args.rounds, args.steps_ms, args.variants = 1, [0.5, 4, 32], args.variants[:1]
    prefix = docs_file(args)
    cache = Path(args.data_dir) / "loader_cache"
    mb = args.micro_batch
    payload = {"prefix": prefix, "cache": str(cache / "megatron"), "tokenload_cache": str(cache / "tokenload"),
               "seq": SEQ, "seed": SEED, "vocab": VOCAB, "micro_batch": mb, "levels": sorted(args.steps_ms),
               "warmup": WARMUP_STEPS}
    need = samples_needed(payload["levels"], WARMUP_STEPS, mb) + 8 * mb  # noqa: F821 (workers read ahead)
    configs = [("tokenload", w, "mmap") for w in args.workers] + [("megatron", w, "mmap") for w in args.workers]
    configs += [("tokenload", 2, v) for v in args.variants]
    results: dict = {c: [] for c in configs}
    start = 0
    total = _split_size(payload)
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        starts = {}
        for w in args.workers:  # both libraries read the same fresh range at a worker count
            starts[w] = start
            start += need
        for v in args.variants:
            starts[v] = start
            start += need
        if start > total:
            sys.exit(f"the split has {total} samples, too few for {args.rounds} rounds; use a larger --docs")
        order = configs[: len(args.workers) * 2]
        pairs = [(order[i], order[i + len(args.workers)]) for i in range(len(args.workers))]
        sequence = [c for a, b in pairs for c in ((b, a) if r % 2 else (a, b))] + configs[len(args.workers) * 2 :]
        for side, w, v in sequence:
            p = {**payload, "workers": w, "variant": v, "start": starts[w if v == "mmap" else v]}
            got = run(side, p)
            results[(side, w, v)].append({x["ms"]: x for x in got})
            print(f"  round {r + 1} {side} {w} workers {v}: "
                  + " ".join(f"{x['ms']:g}ms {100 * x['share']:.1f}%" for x in got), file=sys.stderr)
        load.append(os.getloadavg()[0])
    report(args, configs, results, prefix, load)


def _split_size(payload: dict) -> int:
    from tokenload.datasets import MegatronDataConfig, build_datasets

    config = MegatronDataConfig(
        sequence_length=payload["seq"], random_seed=payload["seed"], blend=[payload["prefix"]], split="100,0,0",
        eod_id=payload["vocab"] - 1, pad_id=-1, path_to_cache=payload["tokenload_cache"],
    )
    return len(build_datasets(config, [None, None, None])[0])


def report(args, configs: list, results: dict, prefix: str, load: list[float]) -> None:
    """Wait shares per step time, thresholds, and the goal."""
    levels = sorted(args.steps_ms)

    def name(c):
        side, w, v = c
        return f"{'megatron-core' if side == 'megatron' else 'tokenload'}, {w} workers" + ("" if v == "mmap" else f", {v}")

    def med(c, ms, key="share"):
        return statistics.median(r[ms][key] for r in results[c])

    size = Path(prefix + ".bin").stat().st_size
    print(f"file: {prefix} ({size / 1e9:.2f} GB .bin), micro-batch {args.micro_batch} x {SEQ} tokens, first-pass reads "
          f"(fresh process, fresh indices), sleep as the step; median of {args.rounds} rounds, sides alternating; "
          f"nproc {os.cpu_count()}; 1-minute load average at the start and after each round: "
          f"{', '.join(f'{x:.1f}' for x in load)}\n")
    rows = [[name(c)] + [f"{100 * med(c, ms):.1f}" for ms in levels] for c in configs]
    print(table(rows, ["wait, % of step"] + [f"{ms:g} ms" for ms in levels]))
    for key, title in (("wait_us", "mean wait per step, us"),
                       ("p50_us", "median wait per step, us (robust to other work's preemptions)"),
                       ("queued_us", "of the mean wait, us the loop was runnable but another process had the CPU")):
        rows = [[name(c)] + [f"{med(c, ms, key):,.0f}" for ms in levels] for c in configs]
        print("\n" + table(rows, [title] + [f"{ms:g} ms" for ms in levels]))
    limits = {c: threshold({ms: med(c, ms) for ms in levels}) for c in configs}
    # the same bar on each level's median step (median wait over the step time): what a step
    # typically waits, robust to the preemptions other work on a shared machine causes
    typical = {c: threshold({ms: med(c, ms, "p50_us") / (ms * 1000) for ms in levels}) for c in configs}
    # the mean share without the loop's own run-queue delay (/proc/thread-self/schedstat): what a
    # training process with its cores to itself would wait; a worker's delays still count
    own = {c: threshold({ms: med(c, ms, "own_share") for ms in levels}) for c in configs}

    def fmt(ms):
        return f"{ms:g} ms" if math.isfinite(ms) else f"> {levels[-1]:g} ms"

    print("\n" + table([[name(c), fmt(limits[c]), fmt(typical[c]), fmt(own[c])] for c in configs],
                       ["configuration", f"smallest step with wait <= {100 * BAR:g}% (mean share: the goal)",
                        "same bar on the median step", "mean share less the loop's run-queue delay"]))
    for title, lim in (("mean share: the goal", limits), ("median step", typical),
                       ("mean share less the loop's run-queue delay", own)):
        rows = []
        for w in args.workers:
            t, m = lim[("tokenload", w, "mmap")], lim[("megatron", w, "mmap")]
            rows.append([f"{w} workers", fmt(t), fmt(m), *_ratio(m, t, levels[-1])])
        best_t = min(v for c, v in lim.items() if c[0] == "tokenload" and c[2] == "mmap")
        best_m = min(v for c, v in lim.items() if c[0] == "megatron")
        rows.append(["best setting of each (tokenload without variants)", fmt(best_t), fmt(best_m),
                     *_ratio(best_m, best_t, levels[-1])])
        print("\n" + table(rows, [f"goal: tokenload's step >= 5x smaller ({title})", "tokenload", "megatron-core",
                                  "megatron-core / tokenload", ""]))


def _ratio(theirs: float, ours: float, top: float) -> tuple[str, str]:
    """How many times smaller tokenload's threshold is, and the verdict against 5x (a threshold
    beyond the longest step counts as that step: a lower bound)."""
    if not math.isfinite(ours):
        return "-", "NOT met"
    ratio = min(theirs, top) / ours
    more = "" if math.isfinite(theirs) else ">= "
    return f"{more}{ratio:.1f}x", "met" if ratio >= 5 else ("NOT met" if math.isfinite(theirs) else "NOT shown")


if __name__ == "__main__":
    main()
