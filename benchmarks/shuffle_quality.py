"""Shuffle quality of the computed order's window orders against a true random permutation.

Usage: python benchmarks/shuffle_quality.py [--windows 10007] [--keys 1000] [--block 64]

Orders compared, each over n windows and many keys (seeds 0..keys-1, epoch 0):
``random`` (NumPy's ``Generator.permutation``, the reference), ``flat`` (the keyed Feistel
permutation) and ``block`` (blocks of B consecutive windows permuted, then the windows inside).

Measures, averaged over the keys:

* ``lag-1 corr``: Pearson correlation of p(i) and p(i+1) (0 for a random order).
* ``mean |step|/n``: mean |p(i+1) - p(i)| / n (1/3 for a random order).
* ``file neighbours``: share of steps with |p(i+1) - p(i)| = 1 (2/n for a random order).
* ``epoch corr``: |correlation| between the orders of epoch 0 and epoch 1 of the same seed.
* ``chi2/df``, ``z``: where each window lands, in 10 position bins over all keys; the chi-square
  statistic over n x 10 cells divided by its degrees of freedom n x 9 (1 when uniform), and
  ``z = (chi2 - df) / sqrt(2 df)`` (|z| < 3 is what a uniform order gives 99.7 % of the time).
  The z assumes windows land independently; in block mode the B windows of a block land
  together, which inflates its spread about B-fold, so ``z/block`` repeats the test on one
  window per block (windows 0, B, 2B, ...).
* ``blocks/mb``: distinct blocks of B windows (window // B) a micro-batch of consecutive
  positions reads, for micro-batches of 8 and 32 windows (lower is more local).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tokenload.index.window_order import WindowOrder

BINS = 10


def orders(kind: str, n: int, keys: int, block: int, epoch: int = 0) -> np.ndarray:
    """``(keys, n)`` int64: one order per key."""
    out = np.empty((keys, n), dtype=np.int64)
    for key in range(keys):
        if kind == "random":
            out[key] = np.random.default_rng([key, epoch]).permutation(n)
        else:
            order = WindowOrder(n, key, block_size=block if kind == "block" else None)
            out[key] = order.epoch_windows(np.arange(n), epoch)
    return out


def lag1_corr(p: np.ndarray) -> float:
    a, b = p[:, :-1].astype(np.float64), p[:, 1:].astype(np.float64)
    a -= a.mean(axis=1, keepdims=True)
    b -= b.mean(axis=1, keepdims=True)
    return float(np.mean((a * b).sum(axis=1) / np.sqrt((a * a).sum(axis=1) * (b * b).sum(axis=1))))


def epoch_corr(p0: np.ndarray, p1: np.ndarray) -> float:
    return float(np.mean([abs(np.corrcoef(x, y)[0, 1]) for x, y in zip(p0, p1)]))


def chi_square(p: np.ndarray, stride: int = 1) -> tuple[float, float]:
    """chi2/df and z of the (window, position bin) counts over all keys, for windows
    ``0, stride, 2*stride, ...`` (stride B: one window per block, which move independently)."""
    keys, n = p.shape
    bins = (np.arange(n) * BINS) // n  # the bin of each position
    cells = np.zeros((n, BINS), dtype=np.int64)
    np.add.at(cells, (p.ravel(), np.tile(bins, keys)), 1)
    expected = keys * np.bincount(bins, minlength=BINS) / n
    chi2 = float((((cells[::stride] - expected) ** 2) / expected).sum())
    df = cells[::stride].shape[0] * (BINS - 1)
    return chi2 / df, (chi2 - df) / np.sqrt(2 * df)


def blocks_per_micro_batch(p: np.ndarray, block: int, micro: int) -> float:
    keys, n = p.shape
    usable = (n // micro) * micro
    groups = (p[:, :usable] // block).reshape(keys, -1, micro)
    s = np.sort(groups, axis=2)
    return float(np.mean(1 + np.count_nonzero(np.diff(s, axis=2), axis=2)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=10007, help="n, windows per epoch (default a prime)")
    parser.add_argument("--keys", type=int, default=1000, help="seeds averaged over")
    parser.add_argument("--block", type=int, default=64, help="B, windows per block in block mode")
    args = parser.parse_args()
    n, keys, block = args.windows, args.keys, args.block
    if n < 100 or keys < 10 or not 1 <= block < n:
        parser.error("use --windows >= 100, --keys >= 10 and 1 <= --block < windows")
    print(f"n = {n} windows, {keys} keys, block mode B = {block}, {BINS} position bins")
    header = f"{'order':<8}{'lag-1 corr':>12}{'mean |step|/n':>15}{'file neighbours':>17}{'epoch corr':>12}"
    header += f"{'chi2/df':>9}{'z':>7}{'z/block':>9}{'blocks/mb 8':>13}{'blocks/mb 32':>14}{'s/epoch':>10}"
    print(header)
    for kind in ("random", "flat", "block"):
        start = time.perf_counter()
        p = orders(kind, n, keys, block)
        per_epoch = (time.perf_counter() - start) / keys
        steps = np.abs(np.diff(p, axis=1))
        second = orders(kind, n, min(keys, 200), block, epoch=1)
        ratio, z = chi_square(p)
        row = f"{kind:<8}{lag1_corr(p):>12.4f}{steps.mean() / n:>15.4f}{np.mean(steps == 1):>17.5f}"
        z_block = chi_square(p, block)[1]
        row += f"{epoch_corr(p[: second.shape[0]], second):>12.4f}{ratio:>9.3f}{z:>7.2f}{z_block:>9.2f}"
        local8, local32 = blocks_per_micro_batch(p, block, 8), blocks_per_micro_batch(p, block, 32)
        row += f"{local8:>13.2f}{local32:>14.2f}{per_epoch:>10.5f}"
        print(row)
    print(f"reference for a random order: lag-1 corr 0, mean |step|/n 1/3, file neighbours {2 / n:.5f}")


if __name__ == "__main__":
    main()
