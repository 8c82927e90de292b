"""CPU of a computed-order weights schedule resumed mid-schedule, against the fixed blend.

Usage: python benchmarks/mixture_resume.py [--rounds 15] [--entries 64] [--at 66656]
       python benchmarks/mixture_resume.py --prefix-counts

In one process, alternating: the fixed blend's interleave (weights 5:3:2, built from scratch)
against ``ScheduledMixture`` of ``mixture.py``'s ``--entries``-entry schedule (interleave cache
cleared), each up to its first 16 draws at global sample ``--at``. Prints the median CPU time of
``--rounds`` rounds per side. Run it with ``PYTHONPATH=OLD/src`` to measure another version.

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


def main() -> None:
    from tokenload.index import schedule as schedule_mod
    from tokenload.index.interleave import Interleave

    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--entries", type=int, default=64)
    p.add_argument("--train", type=int, default=200_000)
    p.add_argument("--at", type=int, default=66_656)
    p.add_argument("--prefix-counts", action="store_true")
    args = p.parse_args()
    if args.prefix_counts:
        return prefix_counts()
    entries = schedule(args.entries, args.train)
    ks = np.arange(args.at, args.at + 16)

    def fixed():
        Interleave([5, 3, 2])(ks)

    def scheduled():
        schedule_mod._interleave.cache_clear()
        schedule_mod.ScheduledMixture(("a", "b", "c"), entries, (10**6,) * 3, seed=1).draw(ks)

    times: dict = {"fixed": [], f"schedule {args.entries}": []}
    for _ in range(args.rounds):
        for name, f in zip(times, (fixed, scheduled)):
            cpu = time.process_time()
            f()
            times[name].append(time.process_time() - cpu)
    for name, t in times.items():
        print(f"{name}: {statistics.median(t) * 1000:.1f} ms CPU (median of {args.rounds})")


def prefix_counts() -> None:
    from tokenload.index.interleave import DEFAULT_PERIOD, _prefix_counts, period_counts

    sets = [[5, 3, 2], [9, 1, 2], [1, 2, 3, 4, 5], [1] * 7, [1] * 8, list(range(1, 13)),
            [1, 1e-3, 1e-2, 0.5, 0.2, 0.3, 0.7, 0.11, 0.13, 0.17]]
    for weights in sets:
        counts = period_counts(weights, DEFAULT_PERIOD)
        cpu = time.process_time()
        for slots in range(1000, DEFAULT_PERIOD, 6553):
            _prefix_counts(counts, DEFAULT_PERIOD, slots)
        ms = (time.process_time() - cpu) / 10 * 1000
        print(f"{len(weights)} sources {weights}: {ms:.2f} ms CPU per count")


if __name__ == "__main__":
    main()
