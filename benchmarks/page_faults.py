"""What a first touch of a memory-mapped token file costs on this machine (no peer: a kernel cost).

Usage: python benchmarks/page_faults.py [--data-dir /tmp/tokenload-bench] [--gb 1.0] [--touches 4000]

Maps the ``.bin`` of ``loader.py``'s data afresh for each measurement (page cache warm) and reads
one byte in each of ``--touches`` distinct random 64 KiB blocks: the first touch of a block is a
page fault that maps the block's pages around it (fault-around). Also: the same with
``MADV_RANDOM`` (one page per fault), the same touches again once mapped (no fault), and
``MADV_POPULATE_READ`` over the whole file (every page mapped in one call), and a positional read
of a piece's bytes instead of any mapping (``read_mode="pread"``). loader.py's cold pass
pays the first of these once per 64 KiB block per process, on every side alike.
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import add_data_arguments, docs_file, table  # noqa: E402


BLOCK = 64 << 10
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def touches(fd: int, offsets: list[int], advice: int | None = None, again: bool = False) -> tuple[float, float]:
    """(us per touch, faults per touch) of reading one byte at each offset of a fresh mapping."""
    m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        if advice is not None:
            m.madvise(advice)
        if again:
            for o in offsets:
                m[o]
        f, t = _faults(), time.perf_counter()
        for o in offsets:
            m[o]
        dt = time.perf_counter() - t
        return dt / len(offsets) * 1e6, (_faults() - f) / len(offsets)
    finally:
        m.close()


def preads(fd: int, offsets: list[int], length: int = 2400) -> tuple[float, float]:
    """(us per read, faults per read) of ``os.preadv`` of ``length`` bytes (a typical document
    piece) at each offset into one reused buffer: no mapping, one system call per piece."""
    buf = memoryview(bytearray(length))
    f, t = _faults(), time.perf_counter()
    for o in offsets:
        os.preadv(fd, [buf], o)
    dt = time.perf_counter() - t
    return dt / len(offsets) * 1e6, (_faults() - f) / len(offsets)


def populate(fd: int, size: int) -> tuple[float, float]:
    """(ms, faults) of mapping every page of the file in one madvise call."""
    m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        f, t = _faults(), time.perf_counter()
        m.madvise(MADV_POPULATE_READ, 0, size)
        return (time.perf_counter() - t) * 1e3, _faults() - f
    finally:
        m.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_arguments(ap)
    ap.add_argument("--touches", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    prefix = docs_file(args)
    path = prefix + ".bin"
    size = os.stat(path).st_size
    blocks = size // BLOCK - 1
    if blocks < 1:
        sys.exit(f"{path} is {size} bytes: use --gb large enough for a few 64 KiB blocks")
    rng = np.random.default_rng(0)
    rows = []
    with open(path, "rb") as f:
        fd = f.fileno()
        cases = [
            ("first touch of a 64 KiB block (fault-around)", None, False),
            ("first touch, MADV_RANDOM (one page per fault)", mmap.MADV_RANDOM, False),
            ("touch of a page already mapped", None, True),
        ]
        for name, advice, again in cases:
            best = None
            for _ in range(args.repeats):
                offsets = (rng.choice(blocks, min(args.touches, blocks), replace=False) * BLOCK + 1000).tolist()
                got = touches(fd, offsets, advice, again)
                best = got if best is None or got[0] < best[0] else best
            rows.append([name, f"{best[0]:.2f}", f"{best[1]:.2f}"])
        best = None
        for _ in range(args.repeats):
            offsets = (rng.choice(blocks, min(args.touches, blocks), replace=False) * BLOCK + 1000).tolist()
            got = preads(fd, offsets)
            best = got if best is None or got[0] < best[0] else best
        rows.append(["pread of 2,400 bytes into a reused buffer (no mapping)", f"{best[0]:.2f}", f"{best[1]:.2f}"])
        try:
            ms, faults = min(populate(fd, size) for _ in range(args.repeats))
        except OSError as exc:  # MADV_POPULATE_READ needs Linux >= 5.14
            ms, faults = None, str(exc)
    print(f"file: {path} ({size / 2**30:.2f} GiB), {args.touches} touches per case, best of {args.repeats}; "
          f"nproc {os.cpu_count()}\n")
    print(table(rows, ["read of one byte", "us per touch", "faults per touch"]))
    if ms is None:
        print(f"\nMADV_POPULATE_READ not available here ({faults})")
    else:
        print(f"\nMADV_POPULATE_READ of the whole file: {ms:.1f} ms ({ms * 1e3 / (size / 4096):.3f} us per 4 KiB "
              f"page, {faults} faults)")


if __name__ == "__main__":
    main()
