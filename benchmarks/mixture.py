"""The cost of a weights schedule (issue 26) on startup and read throughput, side by side.

Usage: python benchmarks/mixture.py [--data-dir DIR] [--rounds 5] [--train 200000]
           [--batches 20] [--blocks 15] [--micro-batch 16]
           [--parts startup warm read machinery] [--cache off|default|path] [--warm-rounds 41]
           [--machinery-rounds 41] [--machinery-batches 200]

Data: three token files of ``--tokens`` random uint16 tokens each (documents of 1-4000 tokens),
written once into ``--data-dir``; S = 2048, the train split of ``100,0,0``, ``--train`` samples.
Variants, per order:

* ``fixed``: the blend with fixed weights 5:3:2 (today's path);
* ``schedule 4``: the same blend with a 4-entry ``weights_schedule`` (one change per quarter);
* ``schedule 64``: a 64-entry schedule (computed order);
* ``continue``: ``mixture_change="continue"`` and no schedule (Megatron order: the blend served
  through the segment chain instead of Megatron's arrays).

*Startup*: each variant in a fresh process (torch imported and the config made before the clock
starts), from the ``build_datasets`` call to the first micro-batch out of a loader (0 workers) at
sample ``train // 3`` (in the schedules' second entry); variants alternate within each round, the
first variant rotating; medians of ``--rounds``, and the median (quartiles) of the per-round
ratios. ``--cache``: ``off`` (in-memory build, ``cache="off"``), ``default`` (``cache="auto"``
without ``path_to_cache``: each source's indices cached beside its token file, the blend built in
memory, as Megatron does) or ``path`` (``path_to_cache``: Megatron's blend and a schedule's later
entries cached too); the last two run every variant once before the rounds, so the caches exist.
*Warm startup* (``--parts warm``): the same build and first micro-batch in one process per order,
every variant built once first, then ``--warm-rounds`` alternating rounds: the difference a
schedule makes resolved to tens of microseconds, shown as a share of the fresh-process startup of
the fixed blend (a fresh process's own spread, ~15%, hides a 1% difference). *Read*: one
process per order holds every variant's loader (0 workers, starting at sample ``train // 3``,
past the first change, page cache warm) and reads them in alternating blocks of ``--batches``
micro-batches, ``--blocks`` times; the cell is samples per CPU second of the median block, so a
preempted block costs wall time, not the ratio, and of all blocks together (which counts what
happens once per phase, such as building the chunks of its interleave it reads, that the median
block leaves out). The machine may be shared: compare the sides of
one run, not absolute figures.

*Machinery* (``--parts machinery``): what a schedule adds per micro-batch, measured directly. One
process per order holds every variant's dataset and times only the step that maps a micro-batch
of global samples to (source, sample): the computed blend's ``mixture.draw`` (phase lookup,
interleave, window permutation), the Megatron blend's ``_locate`` (Megatron's two arrays, or the
segment chain's). ``--machinery-rounds`` rounds; in each, every variant (order rotating) maps the
same ``--machinery-batches`` consecutive micro-batches of ``--micro-batch`` (the loader's
positions, fresh each round, from sample ``train // 3``). Per round and variant the CPU per
micro-batch; the table gives the median of the per-round differences against ``fixed`` (with
their quartiles), and that difference as a share of the CPU one micro-batch costs in the read
part (the fixed variant's median block). Before the timed rounds every variant maps every
position once, so the computed order's interleave tables are built (steady state); what a phase
pays to build the chunks of its period it reads (once per phase, and once per run for the fixed
blend) is timed apart: ``Interleave._build`` of one chunk (``_CHUNK`` slots), for fresh weights, per
micro-batch of its slots. For the computed order, ``fixed (phase only)`` times the fixed blend's
one phase directly (``Mixture._draw``), without the chain around it, and the ``(chain only)``
rows time each variant's chain with its phases' draws replaced by a stub (compared with the fixed
blend's chain only): the machinery alone, which the ~70 us of a draw's window permutation would
otherwise drown in noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SEQ = 2048


def make_data(folder: Path, tokens: int) -> list[str]:
    from tokenload.format import TokenFileWriter

    folder.mkdir(parents=True, exist_ok=True)
    prefixes = []
    for f in range(3):
        prefix = folder / f"src{f}-{tokens}"
        prefixes.append(str(prefix))
        if Path(f"{prefix}.idx").exists():
            continue
        rng = np.random.default_rng(f)
        with TokenFileWriter(str(prefix), np.uint16) as w:
            left = tokens
            while left > 0:
                n = min(int(rng.integers(1, 4000)), left)
                w.add_document(rng.integers(1, 50000, size=n, dtype=np.int64), None)
                left -= n
    return prefixes


def schedule(entries: int, train: int) -> list:
    rng = np.random.default_rng(entries)
    return [(0, [5, 3, 2])] + [
        (i * train // entries, [float(x) for x in rng.integers(1, 10, size=3)])
        for i in range(1, entries)
    ]


def options(order: str, variant: str, args) -> dict:
    """The variant's ``MegatronDataConfig`` arguments (a user's literal config: made before any
    clock starts)."""
    extra: dict = {}
    if variant.startswith("schedule"):
        extra["weights_schedule"] = schedule(int(variant.split()[1]), args.train)
    if variant == "continue":
        extra["mixture_change"] = "continue"
    cache = getattr(args, "cache", "off")
    if cache == "off":
        extra["cache"] = "off"
    elif cache == "path" and order == "megatron":  # the computed order keeps no index cache
        extra["path_to_cache"] = str(Path(args.prefixes[0]).parent / "cache")
    # "default": cache="auto" without path_to_cache (members cached beside their token files)
    blend = [x for w, p in zip((5, 3, 2), args.prefixes) for x in (str(w), p)]
    return dict(sequence_length=SEQ, blend=blend, split="100,0,0", order=order, **extra)


def build(order: str, variant: str, args, config: dict | None = None):
    from tokenload.datasets import MegatronDataConfig, build_datasets

    cfg = MegatronDataConfig(**(config or options(order, variant, args)))
    return build_datasets(cfg, [args.train, 0, 0])[0]


def loader_at(dataset, args):
    from tokenload.loader import build_dataloader

    start = (args.train // 3) // args.micro_batch * args.micro_batch
    return build_dataloader(dataset, micro_batch_size=args.micro_batch, dp_rank=0, dp_size=1,
                            num_workers=0, consumed_samples=start)


def child_startup(args) -> None:
    """One variant in a fresh process: build + loader + first micro-batch (imports excluded)."""
    import torch  # noqa: F401  (imported before the clock starts, as in a training script)

    import tokenload.datasets  # noqa: F401
    import tokenload.loader  # noqa: F401

    order, variant = args.child
    config = options(order, variant, args)
    started = time.perf_counter()
    next(iter(loader_at(build(order, variant, args, config), args)))
    print(json.dumps({"startup": time.perf_counter() - started}))


def child_warm(args) -> None:
    """Every variant of one order in one warm process (imports done, each variant built once
    first), built and read to its first micro-batch in turn, ``--warm-rounds`` times: what a
    schedule adds to startup, resolved to tens of microseconds."""
    import logging

    logging.disable(logging.WARNING)  # a small demo blend repeats its sources: said once each
    order = args.child[0]
    configs = {v: options(order, v, args) for v in VARIANTS[order]}
    for v, config in configs.items():
        next(iter(loader_at(build(order, v, args, config), args)))
    times: dict = {v: [] for v in configs}
    names = list(configs)
    for r in range(args.warm_rounds):
        for v in names[r % len(names):] + names[: r % len(names)]:
            started = time.perf_counter()
            next(iter(loader_at(build(order, v, args, configs[v]), args)))
            times[v].append(time.perf_counter() - started)
    print(json.dumps(times))


def child_read(args) -> None:
    """Every variant of one order in one process, read in alternating blocks: CPU seconds per
    block, so that a preempted block costs wall time but not the ratio."""
    order = args.child[0]
    iters = {v: iter(loader_at(build(order, v, args), args)) for v in VARIANTS[order]}
    for it in iters.values():
        next(it)
    times: dict = {v: [] for v in iters}
    for _ in range(args.blocks):
        for v, it in iters.items():
            cpu = time.process_time()
            for _ in range(args.batches):
                next(it)
            times[v].append(time.process_time() - cpu)
    print(json.dumps(times))


def child_machinery(args) -> None:
    """Every variant of one order in one process: CPU per micro-batch of the step that maps
    global samples to (source, sample), the same positions for every variant in a round."""
    order = args.child[0]
    datasets = {v: build(order, v, args) for v in VARIANTS[order]}
    mb, n = args.micro_batch, args.machinery_batches
    first = (args.train // 3) // mb * mb
    span = (args.train - first) // (n * mb) * (n * mb)  # rounds wrap around within the split
    steps = {}
    for v, ds in datasets.items():
        if order == "computed":
            steps[v] = ds.mixture.draw
        else:
            steps[v] = ds._locate
    if order == "computed":
        from tokenload.index.mixture import Draws

        # the fixed blend's one phase without the chain around it
        phase = datasets["fixed"].mixture.phase(0)
        steps["fixed (phase only)"] = lambda k, bounds: phase._draw(k, bounds)
        # the chain alone: every phase's draw replaced by a stub (the machinery, resolved)
        for v in VARIANTS[order]:
            chain = build(order, v, args).mixture
            for p in range(chain.starts.size):
                chain.phase(p)._draw = lambda k, bounds=None: Draws(k, k, k)
            steps[f"{v} (chain only)"] = chain.draw
    times: dict = {v: [] for v in steps}
    names = list(steps)

    def positions(r):
        at = first + (r * n * mb) % span
        batches = [np.arange(at + i * mb, at + (i + 1) * mb, dtype=np.int64) for i in range(n)]
        return batches, [(int(b[0]), int(b[-1])) for b in batches]

    for r in range(args.machinery_rounds):  # warm: every table chunk the rounds read is built
        for k, b in zip(*positions(r)):
            for step in steps.values():
                step(k, b)
    for r in range(args.machinery_rounds):
        batches, bounds = positions(r)
        for v in names[r % len(names) :] + names[: r % len(names)]:
            step = steps[v]
            cpu = time.process_time()
            for k, b in zip(batches, bounds):
                step(k, b)
            times[v].append((time.process_time() - cpu) / n)
    if order == "computed":  # what a phase pays once per chunk of its period that it reads
        from tokenload.index.interleave import _CHUNK, Interleave

        rng = np.random.default_rng(0)
        builds = []
        for _ in range(args.machinery_rounds):
            inter = Interleave([float(x) for x in rng.integers(1, 10, size=3)])
            slot = int(rng.integers(1, 32)) * _CHUNK  # a chunk past the first: a counted state
            cpu = time.process_time()
            inter._build(slot, slot)
            builds.append(time.process_time() - cpu)
        times["chunk build"] = builds
        times["chunk slots"] = [_CHUNK]
    print(json.dumps(times))


VARIANTS = {
    "computed": ["fixed", "schedule 4", "schedule 64"],
    "megatron": ["fixed", "continue", "schedule 4"],
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default="/tmp/tokenload-bench-mixture")
    p.add_argument("--tokens", type=int, default=4_000_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--train", type=int, default=200_000)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--blocks", type=int, default=15)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--child", nargs=2, default=None)
    p.add_argument("--prefixes", nargs="*", default=None)
    p.add_argument("--parts", nargs="*", default=["startup", "warm", "read", "machinery"],
                   choices=["startup", "warm", "read", "machinery"])
    p.add_argument("--warm-rounds", type=int, default=41)
    p.add_argument("--machinery-rounds", type=int, default=41)
    p.add_argument("--machinery-batches", type=int, default=200)
    p.add_argument("--cache", default="off", choices=["off", "default", "path"],
                   help="startup's index cache: off (in memory), default (cache='auto' beside"
                   " the token files), path (path_to_cache: Megatron's blend cached too); the"
                   " last two warmed by one untimed run of every variant first")
    args = p.parse_args()
    if args.child:
        if args.child[1] == "machinery":
            return child_machinery(args)
        if args.child[1] == "warm":
            return child_warm(args)
        return child_read(args) if args.child[1] == "read" else child_startup(args)
    prefixes = make_data(Path(args.data_dir), args.tokens)
    common = ["--prefixes", *prefixes, "--train", str(args.train), "--batches", str(args.batches),
              "--blocks", str(args.blocks), "--micro-batch", str(args.micro_batch),
              "--machinery-rounds", str(args.machinery_rounds),
              "--machinery-batches", str(args.machinery_batches), "--cache", args.cache,
              "--warm-rounds", str(args.warm_rounds)]

    def run(*child):
        cmd = [sys.executable, __file__, "--child", *child, *common]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return json.loads(out.splitlines()[-1])

    startup: dict = {}
    reads: dict = {}
    if "startup" in args.parts and args.cache != "off":  # warm: the caches exist
        for order, variants in VARIANTS.items():
            for variant in variants:
                run(order, variant)
    for r in range(args.rounds if "startup" in args.parts else 0):
        for order, variants in VARIANTS.items():
            turn = variants[r % len(variants):] + variants[: r % len(variants)]
            for variant in turn:
                startup.setdefault((order, variant), []).append(run(order, variant)["startup"])
    for order in VARIANTS if "read" in args.parts else ():
        for variant, blocks in run(order, "read").items():
            reads[(order, variant)] = blocks
    samples = args.batches * args.micro_batch
    if startup or reads:
        if startup:
            print(f"Startup: index cache {args.cache!r}, {args.rounds} rounds; 'vs fixed' is the"
                  " ratio of medians, then the median (quartiles) of the per-round ratios.\n")
        print("| order | variant | startup (median) | vs fixed | samples per CPU s (median"
              " block) | vs fixed | samples per CPU s (all blocks) | vs fixed |")
        print("|---|---|---|---|---|---|---|---|")
    for order, variants in VARIANTS.items() if startup or reads else ():
        base_s = statistics.median(startup[(order, "fixed")]) if startup else None
        base_r = samples / statistics.median(reads[(order, "fixed")]) if reads else None
        for variant in variants:
            cells = [order, variant]
            if base_s is not None:
                s = statistics.median(startup[(order, variant)])
                paired = [a / b for a, b in zip(startup[(order, variant)],
                                                startup[(order, "fixed")])]
                q = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
                cells += [f"{s * 1e3:.1f} ms", f"{s / base_s:.3f}; {statistics.median(paired):.3f}"
                          f" ({q[0]:.2f}..{q[2]:.2f})"]
            else:
                cells += ["", ""]
            if base_r is not None:
                r = samples / statistics.median(reads[(order, variant)])
                cells += [f"{r:,.0f}", f"{r / base_r:.3f}"]
                total = samples * len(reads[(order, variant)]) / sum(reads[(order, variant)])
                base_t = samples * len(reads[(order, "fixed")]) / sum(reads[(order, "fixed")])
                cells += [f"{total:,.0f}", f"{total / base_t:.3f}"]
            else:
                cells += ["", "", "", ""]
            print("| " + " | ".join(cells) + " |")
    if "warm" in args.parts:
        print(f"\nWarm startup (one process per order, {args.warm_rounds} alternating rounds):"
              " what the variant adds, and that as a share of the fresh-process startup of the"
              " fixed blend above.\n")
        print("| order | variant | warm startup (median) | minus fixed: median (quartiles) |"
              " share of the fresh fixed startup |")
        print("|---|---|---|---|---|")
        for order in VARIANTS:
            times = run(order, "warm")
            fresh = statistics.median(startup[(order, "fixed")]) if startup else None
            for variant, t in times.items():
                diff = [(a - b) * 1e3 for a, b in zip(t, times["fixed"])]
                q = statistics.quantiles(diff, n=4)
                med = statistics.median(diff)
                share = "" if fresh is None else f"{med / (fresh * 1e3):+.1%}"
                print(f"| {order} | {variant} | {statistics.median(t) * 1e3:.2f} ms |"
                      f" {med:+.2f} ms ({q[0]:+.2f} .. {q[2]:+.2f}) | {share} |")
    if "machinery" not in args.parts:
        return
    print()
    print("| order | variant | CPU us per micro-batch (median round) | minus fixed (or fixed's"
          " chain only), us: median (quartiles) | share of a micro-batch's read CPU |")
    print("|---|---|---|---|---|")
    chunk = None
    for order in VARIANTS:
        times = run(order, "machinery")
        if "chunk build" in times:
            chunk = (statistics.median(times.pop("chunk build")), times.pop("chunk slots")[0])
        batch = statistics.median(reads[(order, "fixed")]) / args.batches if reads else None
        for variant, t in times.items():
            base = "fixed (chain only)" if variant.endswith("(chain only)") else "fixed"
            diff = sorted((a - b) * 1e6 for a, b in zip(t, times[base]))
            q1, med, q3 = statistics.quantiles(diff, n=4) if len(diff) > 1 else diff * 3
            med = statistics.median(diff)
            share = "" if batch is None else f"{med / (batch * 1e6):+.2%}"
            print(f"| {order} | {variant} | {statistics.median(t) * 1e6:.1f} |"
                  f" {med:+.2f} ({q1:+.2f} .. {q3:+.2f}) | {share} |")
        if batch is not None:
            print(f"| {order} | (a micro-batch in the read part: {batch * 1e6:.0f} us CPU) |"
                  " | | |")
    if chunk is not None:
        per = chunk[0] / chunk[1] * args.micro_batch
        print(f"\nComputed order, a chunk of the interleave's period ({chunk[1]} slots) built"
              f" once per phase it is read in: {chunk[0] * 1e3:.2f} ms CPU (median), i.e."
              f" {per * 1e6:.1f} us per micro-batch of {args.micro_batch} in a phase shorter than"
              " the period (every slot new)" + ("" if batch is None else
              f", {per / batch:.2%} of a micro-batch's read CPU") + ".")


if __name__ == "__main__":
    main()
