"""The check of an index cache without a tokenload sidecar (Megatron wrote it) at scale: seconds
and peak NumPy memory of ``gpt_cache_mismatches`` on one-epoch GPT arrays of ``--docs``
documents, this tree's against a baseline copy of ``cache_match.py`` (issue 36, point 16).

Usage: python benchmarks/cache_match_scale.py [--docs 100000000] [--seq 2048] [--rounds 3]
           [--baseline OLD/cache_match.py] [--ordered]

The arrays are benchmarks/integrity.py's, those of a Megatron build of one epoch: documents of
mean 1,000 tokens (lengths uniform in 1..1999, seed 0), sample k at stream position k x S with
Megatron's convention at document ends, the shuffle a permutation of the samples; the document
index a permutation of the documents, as Megatron's is (``--ordered``: in file order, as
integrity.py has it); both sides must find them consistent. Sides alternate within each round
in one process, on the same arrays in memory (no page cache or disk in the figure). Peak memory
is tracemalloc's (NumPy reports its buffers to it): the temporaries the check allocates, the
arrays themselves excluded.

A baseline is a copy of the module from another commit, e.g.
``git show 71d25ed:src/tokenload/datasets/megatron/cache_match.py > /tmp/cache_match_old.py``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from types import ModuleType

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import integrity

from tokenload.datasets.megatron import cache_match


def arrays_for(docs: int, seq: int, *, ordered: bool):
    """integrity.py's arrays (document index in file order); unless ``ordered``, the documents
    renumbered by a random permutation, which shuffles the document index as Megatron's is and
    keeps the token stream, and so the sample index, as it was."""
    arrays, lengths = integrity.arrays_for(docs, seq)
    if ordered:
        return arrays, lengths
    ids = np.random.default_rng(1).permutation(docs).astype(np.int32)
    renumbered = np.empty_like(lengths)
    renumbered[ids] = lengths  # file id ids[j] holds the j-th document of the stream
    return {**arrays, "document_index": ids}, renumbered


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("cache_match_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(check) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak MiB of traced allocations of one call (which must find
    no mismatch). On a shared machine the CPU seconds are the figure to compare: the wall clock
    also counts the time other processes held the cores."""
    gc.collect()
    tracemalloc.start()
    start, cpu = time.perf_counter(), time.process_time()
    reasons = check()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    assert reasons == [], reasons
    return seconds, cpu, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=100_000_000)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", help="another commit's cache_match.py, timed beside this one")
    ap.add_argument("--ordered", action="store_true", help="document index in file order")
    args = ap.parse_args()
    made = time.perf_counter()
    arrays, lengths = arrays_for(args.docs, args.seq, ordered=args.ordered)
    mib = sum(a.nbytes for a in arrays.values()) / 2**20
    print(
        f"{args.docs:,} documents ({'ordered' if args.ordered else 'shuffled'} document index),"
        f" {arrays['shuffle_index'].size:,} samples of S={args.seq}, arrays {mib:,.0f} MiB +"
        f" lengths {lengths.nbytes / 2**20:,.0f} MiB (made in {time.perf_counter() - made:.0f}"
        f" s); nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    sides = {"this tree": cache_match}
    if args.baseline:
        sides["baseline"] = load(args.baseline)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        for name, module in sides.items() if r % 2 == 0 else reversed(sides.items()):
            got = measure(
                lambda m=module: m.gpt_cache_mismatches(
                    arrays, lengths, 0, args.docs, sequence_length=args.seq, extra=1
                )
            )
            results[name].append(got)
            print(
                f"  round {r + 1} {name}: {got[0]:.2f} s, CPU {got[1]:.2f} s, peak"
                f" {got[2]:,.0f} MiB (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    print(
        "\n| side | wall s, median (min-max) | CPU s, median (min-max) | CPU ns per document |"
        " peak MiB of temporaries |\n|---|---|---|---|---|"
    )
    for name, values in results.items():
        wall, cpu = [v[0] for v in values], [v[1] for v in values]
        print(
            f"| {name} | {statistics.median(wall):.2f} ({min(wall):.2f}-{max(wall):.2f}) |"
            f" {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f}) |"
            f" {statistics.median(cpu) / args.docs * 1e9:.0f} | {max(v[2] for v in values):,.0f} |"
        )


if __name__ == "__main__":
    main()
