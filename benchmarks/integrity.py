"""What the integrity checks of issue 25 cost at scale: the index cache's content hashes and the
check of a cache without a tokenload sidecar (Megatron's) against the token file's lengths.

Usage: python benchmarks/integrity.py [--docs 100000000] [--seq 2048] [--rounds 3]
                                      [--dir /tmp/tokenload-bench/integrity]

Arrays of a one-epoch GPT cache over ``--docs`` documents of mean 1,000 tokens (lengths uniform
in 1..1999, seed 0), shaped and typed as tokenload's builder makes them (document_index int32,
sample_index int32 rows, shuffle_index uint32 or int64), with values a real build could hold
(documents in order, samples at every S tokens, a permutation); the values do not change the
cost. Each figure is the median of ``--rounds`` (min-max in brackets), measured in this process
with the page cache warm (the arrays were just written):

* ``write_cache`` with the xxh3-64 hashes (what a writer pays once), and the hashing alone;
* ``check_cache`` (what every rank pays at build time): arrays up to 256 MiB are hashed here;
* ``map_array`` of each array the first time a process maps it (a loader worker; larger arrays
  are verified there): the hash over the mapped bytes, page faults included;
* ``gpt_cache_mismatches``: the O(n) check of a sidecar-less cache, run once on its first use.

The per-batch pointer check of token files is measured by benchmarks/loader.py (first pass,
``--baseline-src`` a worktree with the checks off); see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tokenload.caches import files as cache_io  # noqa: E402
from tokenload.caches.names import GPT_ARRAYS, CacheFiles  # noqa: E402
from tokenload.datasets.megatron.cache_match import gpt_cache_mismatches  # noqa: E402


def arrays_for(docs: int, seq: int, extra: int = 1) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 2000, size=docs, dtype=np.int32)
    cum = np.zeros(docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=cum[1:])
    samples = int((cum[-1] - extra) // seq)
    stream = np.arange(samples + 1, dtype=np.int64) * seq
    pos = np.searchsorted(cum, stream + extra - 1, side="right") - 1
    pos[0] = 0
    sample_index = np.empty((samples + 1, 2), dtype=np.int32)
    sample_index[:, 0] = pos
    sample_index[:, 1] = stream - cum[pos]
    del cum, stream, pos
    shuffle = rng.permutation(samples).astype(np.uint32 if samples < 2**32 else np.int64)
    arrays = {"document_index": np.arange(docs, dtype=np.int32), "sample_index": sample_index,
              "shuffle_index": shuffle}
    return arrays, lengths


def timed(fn) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def show(name: str, values: list[float]) -> str:
    return f"| {name} | {statistics.median(values):.3f} | {min(values):.3f}-{max(values):.3f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=100_000_000)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/tokenload-bench/integrity")
    args = ap.parse_args()
    folder = Path(args.dir)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    made = time.perf_counter()
    arrays, lengths = arrays_for(args.docs, args.seq)
    sizes = {k: v.nbytes for k, v in arrays.items()}
    listed = ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in sizes.items())
    print(f"{args.docs:,} documents, {len(arrays['shuffle_index']):,} samples of S={args.seq};"
          f" array bytes: {listed}"
          f" (made in {time.perf_counter() - made:.1f} s); nproc {os.cpu_count()}, load average"
          f" {os.getloadavg()[0]:.1f}")
    files = CacheFiles(directory=str(folder), hash="0" * 32, class_name="GPTDataset", split="train",
                       arrays=GPT_ARRAYS)
    results: dict[str, list[float]] = {}

    def check() -> list[str]:
        return gpt_cache_mismatches(arrays, lengths, 0, args.docs, sequence_length=args.seq,
                                    extra=1)

    def add(name: str, seconds: float) -> None:
        results.setdefault(name, []).append(seconds)

    for _ in range(args.rounds):
        add("xxh3-64 of the three arrays (in memory)",
            timed(lambda: [cache_io._digest(a) for a in arrays.values()]))
        add("write_cache (np.save + fsync + hashes)", timed(
            lambda: cache_io.write_cache(files, description="{}", arrays=arrays)))
        cache_io._VERIFIED.clear()  # as a process that did not write them
        add("check_cache (headers; hashes of arrays <= 256 MiB)", timed(
            lambda: cache_io.check_cache(files, description="{}")))
        cache_io._VERIFIED.clear()
        for name in GPT_ARRAYS:  # a fresh mapping each time, verified on first map
            add(f"map_array {name}, verified on first map",
                timed(lambda n=name: cache_io.map_array(files.array(n))))
        add(f"map_array {GPT_ARRAYS[-1]}, already verified in this process",
            timed(lambda: cache_io.map_array(files.array(GPT_ARRAYS[-1]))))
        add("gpt_cache_mismatches (a sidecar-less cache, first use)", timed(lambda: check()))
    assert not check()
    print("\n| step | median s | min-max s |\n|---|---|---|")
    for name, values in results.items():
        print(show(name, values))
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
