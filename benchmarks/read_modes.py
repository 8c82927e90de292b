"""Random document reads per second for each read mode, tokenload vs megatron-core, same file.

Usage: python benchmarks/read_modes.py [--data-dir /tmp/tokenload-bench] [--gb 1.0] [--reads 200000]

Generates a ~1 GB uint16 token file (lognormal document lengths, mean 600 tokens) once, then
times ``reads`` random whole-document reads (page cache warm) through tokenload's mmap, pread and
memory modes and, in megatron-core's scratch venv on the same file and the same document ids,
through IndexedDataset with mmap=True and mmap=False. Also times ``import tokenload``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import add_data_arguments, best_of, docs_file, run_peer, table  # noqa: E402

from tokenload.format import ReadMode, TokenFile  # noqa: E402

PEER = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np
from megatron.core.datasets.indexed_dataset import IndexedDataset
a = json.loads(sys.argv[1])
ids = np.random.default_rng(a["seed"]).integers(0, a["docs"], size=a["reads"]).tolist()
out = {}
for mmap in (True, False):
    ds = IndexedDataset(a["prefix"], mmap=mmap)
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        for i in ids:
            ds[i]
        best = min(best, time.perf_counter() - t)
    out["mmap" if mmap else "no-mmap"] = a["reads"] / best
print(json.dumps(out))
"""


def import_time(repeats: int = 15) -> float:
    """Median extra seconds that `import tokenload` adds to a bare interpreter start."""

    def run(code: str) -> float:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - t

    base = statistics.median(run("pass") for _ in range(repeats))
    with_import = statistics.median(run("import tokenload") for _ in range(repeats))
    return with_import - base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_arguments(ap)
    ap.add_argument("--reads", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    prefix = docs_file(args)
    docs = TokenFile(prefix).num_sequences
    ids = np.random.default_rng(args.seed).integers(0, docs, size=args.reads).tolist()
    ours = {}
    for mode in ReadMode:
        tf = TokenFile(prefix, mode=mode)
        tf[0]

        def loop():
            for i in ids:
                tf[i]

        ours[mode.value] = args.reads / best_of(loop)
    peer = run_peer(PEER, {"prefix": prefix, "docs": docs, "reads": args.reads, "seed": args.seed})
    rows = []
    for mode, peer_mode in (("mmap", "mmap"), ("pread", "no-mmap"), ("memory", None)):
        p = peer.get(peer_mode) if peer and peer_mode else None
        rows.append([mode, f"{ours[mode]:,.0f}", f"{p:,.0f}" if p else "-", f"{ours[mode] / p:.2f}x" if p else "-"])
    size = (Path(prefix + ".bin").stat().st_size) / 2**30
    print(f"file: {prefix} ({size:.2f} GiB .bin, {docs:,} documents), {args.reads:,} random document reads, warm page cache\n")
    print(table(rows, ["tokenload mode", "tokenload reads/s", "megatron-core reads/s (mmap / no-mmap)", "ratio"]))
    print(f"\nimport tokenload: {import_time() * 1000:.1f} ms over a bare interpreter start (median of 15)")


if __name__ == "__main__":
    main()
