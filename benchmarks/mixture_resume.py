"""CPU of a computed-order weights schedule resumed mid-schedule, against the fixed blend.

Usage: python benchmarks/mixture_resume.py [--rounds 15] [--entries 64] [--sources 3]
           [--entry 21 | --at 66656]
       python benchmarks/mixture_resume.py --sources 12 --entry 40 --rounds 41
       python benchmarks/mixture_resume.py --sources 12 --entry 40 --rounds 41 --full
       python benchmarks/mixture_resume.py --prefix-counts

In one process, alternating: the *fixed* blend, ``ScheduledMixture`` with the one entry
``[(0, weights)]`` (what a blend without a schedule builds), against the *schedule*,
``ScheduledMixture`` of an ``--entries``-entry schedule (equal spacing over ``--train`` samples),
each with the interleave cache cleared and taken to its first 16 draws at global sample ``--at``
(default: 5 samples into entry ``--entry``). The fixed blend has the weights of the entry resumed
in, so both build the same interleave and the difference is what the schedule adds: counting the
cursors the phases before leave (``interleave.consumed``) and checking the schedule. 3 sources:
``benchmarks/mixture.py``'s schedule (5:3:2 first); more: random integer weights 1..12 per entry
(first entry 1, 2, ..., n). Prints the median CPU per side, the median of the per-round
differences and ratios, and their range. Run it with ``PYTHONPATH=OLD/src`` to measure another
version.

``--full``: the whole startup instead, in one process, alternating: ``build_datasets`` of a
computed-order blend of ``--sources`` token files (1M random tokens each, written once into
``--data-dir``; S = 2048, ``--train`` samples, ``cache="off"``), a loader at ``consumed_samples``
= ``--at`` (0 workers, micro-batch 16) and its first micro-batch; the fixed blend has the weights
of the entry resumed in, the schedule the ``--entries`` entries (interleave cache cleared).

``--prefix-counts``: CPU per partial-period count (what each phase before the resumed one costs),
``interleave._prefix_counts`` at 10 slots spread over the default period, per weight vector.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from mixture import schedule  # noqa: E402  (the schedule benchmarks/mixture.py declares)


def many(entries: int, train: int, sources: int) -> list:
    rng = np.random.default_rng(sources)
    return [(0, [float(x) for x in range(1, sources + 1)])] + [
        (i * train // entries, [float(x) for x in rng.integers(1, 13, size=sources)])
        for i in range(1, entries)
    ]


def main() -> None:
    from tokenload.index import schedule as schedule_mod

    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--entries", type=int, default=64)
    p.add_argument("--sources", type=int, default=3)
    p.add_argument("--train", type=int, default=200_000)
    p.add_argument("--entry", type=int, default=None)
    p.add_argument("--at", type=int, default=None)
    p.add_argument("--prefix-counts", action="store_true")
    p.add_argument("--full", action="store_true")
    p.add_argument("--data-dir", default="/tmp/tokenload-bench-mixture-resume")
    args = p.parse_args()
    if args.prefix_counts:
        return prefix_counts()
    if args.sources == 3:
        entries = schedule(args.entries, args.train)
    else:
        entries = many(args.entries, args.train, args.sources)
    if args.at is None:
        entry = 21 * args.entries // 64 if args.entry is None else args.entry
        args.at = entries[entry][0] + 5
    entry = max(i for i, (s, _) in enumerate(entries) if s <= args.at)
    names = tuple(f"source{i}" for i in range(args.sources))
    windows = (10**6,) * args.sources
    ks = np.arange(args.at, args.at + 16)
    fixed_weights = entries[entry][1]

    def fixed():
        schedule_mod._interleave.cache_clear()
        chain = schedule_mod.ScheduledMixture(names, [(0, fixed_weights)], windows, seed=1)
        chain.draw(ks)

    def scheduled():
        schedule_mod._interleave.cache_clear()
        schedule_mod.ScheduledMixture(names, entries, windows, seed=1).draw(ks)

    if args.full:
        fixed, scheduled = full_startup(args, fixed_weights, entries)

    label = f"schedule {args.entries} at entry {entry}"
    times: dict = {"fixed": [], label: []}
    for r in range(args.rounds):
        sides = list(zip(times, (fixed, scheduled)))
        for name, f in sides if r % 2 == 0 else sides[::-1]:
            cpu = time.process_time()
            f()
            times[name].append(time.process_time() - cpu)
    print(f"{args.sources} sources, resumed at sample {args.at} (entry {entry} of {args.entries})")
    for name, t in times.items():
        print(f"{name}: {statistics.median(t) * 1000:.2f} ms CPU (median of {args.rounds})")
    diff = [(b - a) * 1000 for a, b in zip(*times.values())]
    ratio = [b / a for a, b in zip(*times.values())]
    print(f"schedule - fixed per round: median {statistics.median(diff):+.2f} ms"
          f" (range {min(diff):+.2f} .. {max(diff):+.2f})")
    print(f"schedule / fixed per round: median {statistics.median(ratio):.3f}"
          f" (range {min(ratio):.3f} .. {max(ratio):.3f})")


def full_startup(args, fixed_weights, entries):
    """The two sides of ``--full``: build, loader at ``--at``, first micro-batch."""
    import logging

    import torch  # noqa: F401  (imported before any clock, as in a training script)

    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.format import TokenFileWriter
    from tokenload.index import schedule as schedule_mod
    from tokenload.loader import build_dataloader

    logging.disable(logging.WARNING)  # the small files repeat: the loader says so every time
    folder = Path(args.data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    prefixes = []
    for f in range(args.sources):
        prefix = folder / f"src{f}"
        prefixes.append(str(prefix))
        if Path(f"{prefix}.idx").exists():
            continue
        rng = np.random.default_rng(f)
        with TokenFileWriter(str(prefix), np.uint16) as w:
            left = 1_000_000
            while left > 0:
                n = min(int(rng.integers(1, 4000)), left)
                w.add_document(rng.integers(1, 50000, size=n, dtype=np.int64), None)
                left -= n
    blend = [x for w, p in zip(fixed_weights, prefixes) for x in (str(w), p)]

    def start(schedule):
        schedule_mod._interleave.cache_clear()
        cfg = MegatronDataConfig(sequence_length=2048, blend=blend, split="100,0,0", cache="off",
                                 order="computed", weights_schedule=schedule)
        dataset = build_datasets(cfg, [args.train, 0, 0])[0]
        loader = build_dataloader(dataset, micro_batch_size=16, dp_rank=0, dp_size=1,
                                  num_workers=0, consumed_samples=args.at)
        next(iter(loader))

    start(None)  # the first build opens and caches what every later one shares
    return (lambda: start(None)), (lambda: start(entries))


def prefix_counts() -> None:
    from tokenload.index.interleave import DEFAULT_PERIOD, _prefix_counts, period_counts

    sets = [[5, 3, 2], [9, 1, 2], [1, 2, 3, 4, 5], [1] * 7, [1] * 8, list(range(1, 13)),
            [1, 1e-3, 1e-2, 0.5, 0.2, 0.3, 0.7, 0.11, 0.13, 0.17], list(range(1, 33))]
    for weights in sets:
        counts = period_counts(weights, DEFAULT_PERIOD)
        cpu = time.process_time()
        for slots in range(1000, DEFAULT_PERIOD, 6553):
            _prefix_counts(counts, DEFAULT_PERIOD, slots)
        ms = (time.process_time() - cpu) / 10 * 1000
        print(f"{len(weights)} sources {weights}: {ms:.3f} ms CPU per count")


if __name__ == "__main__":
    main()
