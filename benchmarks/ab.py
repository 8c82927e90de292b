"""One command, two or more source trees, side by side: did a change move wall time, CPU or memory?

Usage:
    python benchmarks/ab.py --src /tmp/before/src --src src [--rounds 7] [--drop-caches]
                            [--before 'rm -rf /tmp/out && mkdir /tmp/out'] -- COMMAND ARGS...

Each round runs COMMAND once per source tree, with ``PYTHONPATH`` set to that tree (so
``tokenload`` and everything the command starts imports it), the trees in a rotating order so
that none always runs first. ``--before`` is a shell command run before every run, untimed (to
remove the previous run's output). ``--drop-caches`` (root) drops the page cache before every
run, so the data is read from disk: the regime of a first epoch over data that is not cached.
Per run: wall seconds, CPU seconds of the command and every process it waited for (``wait4``),
and the largest peak RSS among them. The report is medians over rounds with the range, and the
ratio of each tree's median to the first tree's, with the per-round ratios of wall time (rounds
are paired, so a machine that slows down for a minute slows both sides of that round).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def drop_page_cache() -> None:
    """Write back and drop the page cache (needs root): the next run reads from disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def run_once(command: list[str], src: str) -> dict[str, float]:
    """Wall s, CPU s (the command and its reaped descendants) and peak RSS MB of one run."""
    env = {**os.environ, "PYTHONPATH": src}
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{command[0]} with PYTHONPATH={src} exited {proc.returncode}:\n"
                 f"{err.decode(errors='replace')[-3000:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", action="append", required=True,
                    help="a source tree (repeat; the first is the reference)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--before", default=None, help="shell command run before every run, untimed")
    ap.add_argument("--drop-caches", action="store_true", help="drop the page cache before runs")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or len(args.src) < 2:
        ap.error("give at least two --src and a command after --")
    got: dict[str, list[dict[str, float]]] = {src: [] for src in args.src}
    for r in range(args.rounds):
        order = args.src[r % len(args.src):] + args.src[: r % len(args.src)]
        for src in order:
            if args.before:
                subprocess.run(args.before, shell=True, check=True)
            if args.drop_caches:
                drop_page_cache()
            res = run_once(command, src)
            got[src].append(res)
            print(f"round {r + 1} {src}: {res['wall']:.3f} s wall, {res['cpu']:.3f} s CPU,"
                  f" {res['rss']:.0f} MB", file=sys.stderr)
    print(f"\n`{' '.join(command)}`, {args.rounds} rounds, load {os.getloadavg()[0]:.1f}"
          f"{', page cache dropped before each run' if args.drop_caches else ''}\n")
    print("| source | wall s | CPU s | peak RSS MB | wall vs first | CPU vs first |")
    print("|---|---|---|---|---|---|")
    ref = args.src[0]

    def med(src: str, key: str) -> float:
        return statistics.median(x[key] for x in got[src])

    def spread(src: str, key: str) -> str:
        xs = [x[key] for x in got[src]]
        return f"{med(src, key):.3f} ({min(xs):.3f}-{max(xs):.3f})"

    for src in args.src:
        print(f"| {src} | {spread(src, 'wall')} | {spread(src, 'cpu')} | {med(src, 'rss'):.0f} |"
              f" {med(src, 'wall') / med(ref, 'wall'):.3f} | {med(src, 'cpu') / med(ref, 'cpu'):.3f} |")
    for src in args.src[1:]:
        ratios = [a["wall"] / b["wall"] for a, b in zip(got[src], got[ref])]
        print(f"\nper-round wall ratios {src} / {ref}: {', '.join(f'{x:.3f}' for x in ratios)}"
              f" (median {statistics.median(ratios):.3f})")


if __name__ == "__main__":
    main()
