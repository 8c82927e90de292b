"""A keyed permutation of ``[0, n)`` computed on demand: position k -> element p(k), O(1) memory.

A balanced Feistel network over ``2 * half`` bits (the smallest even bit width whose domain
``4**half >= n``) is a bijection of ``[0, 4**half)``; cycle-walking (re-applying it while the value
is ``>= n``) restricts it to a bijection of ``[0, n)``. The domain is at most 4n, so each walk
leaves the range with probability < 3/4 and the expected number of applications is below 4.

Round function: a splitmix64-style mix of (right half, key, round) in uint64 arithmetic. Six
rounds; keys come from (seed, epoch) so every epoch gets an independent order. Everything is
vectorized over arrays of positions: no table of size n is ever built, which is what lets a
16 GB flat token file (billions of windows) be shuffled without materializing a permutation.
"""

from __future__ import annotations

import numpy as np

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def round_keys(seed: int, epoch: int = 0) -> np.ndarray:
    """The per-round uint64 keys of the permutation for (seed, epoch)."""
    base = _mix(np.array([(seed * 0x100000001B3 + epoch) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        return _mix(base + _GOLDEN * np.arange(1, _ROUNDS + 1, dtype=np.uint64))


class KeyedPermutation:
    """A bijection of ``[0, n)`` selected by ``(seed, epoch)``; ``self(k)`` maps positions to
    elements."""

    def __init__(self, n: int, seed: int, epoch: int = 0) -> None:
        if n < 0:
            raise ValueError(f"permutation size must be >= 0, got {n}")
        self.n = int(n)
        half = max(1, (max(self.n - 1, 1).bit_length() + 1) // 2)
        self._half = np.uint64(half)
        self._mask = np.uint64((1 << half) - 1)
        self._keys = round_keys(seed, epoch)

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        with np.errstate(over="ignore"):
            for key in self._keys:
                left, right = right, left ^ (_mix(right ^ key) & self._mask)
        joined: np.ndarray = (left << self._half) | right
        return joined

    def __call__(self, positions: np.ndarray | int) -> np.ndarray:
        """Elements at ``positions`` (any shape, each in ``[0, n)``), as int64."""
        k = np.asarray(positions, dtype=np.int64)
        if k.size and (int(k.min()) < 0 or int(k.max()) >= self.n):
            raise IndexError(f"positions must lie in [0, {self.n})")
        x = self._feistel(k.astype(np.uint64).ravel())
        out_of_range = np.flatnonzero(x >= np.uint64(self.n))
        while out_of_range.size:  # cycle-walk only the values that left [0, n)
            x[out_of_range] = self._feistel(x[out_of_range])
            out_of_range = out_of_range[x[out_of_range] >= np.uint64(self.n)]
        return x.astype(np.int64).reshape(k.shape)
