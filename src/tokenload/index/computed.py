"""The window order of the computed order: a keyed permutation per epoch, computed on demand.

Position k of epoch e holds window ``p_e(k)``. Two modes, both O(1) memory and O(1) expected
work per position, vectorized over a batch of positions (nothing of size n is built):

* **flat**: ``p_e`` is ``permutation.KeyedPermutation(n, seed, e)`` (a 6-round Feistel network
  with cycle-walking), the order of the flat nanoGPT files.
* **block**: the n windows form ``nb = n // B`` full blocks of B consecutive windows and, when B
  does not divide n, one partial block of ``r = n % B`` windows (the last ones). The full blocks
  are permuted by ``KeyedPermutation(nb, seed, e)``; the partial block is placed at a keyed slot
  ``s`` in ``[0, nb]`` of that block order (positions ``[s*B, s*B + r)``); the windows inside
  every block are permuted by a Feistel network keyed by (seed, e, block). Consecutive positions
  then read from at most ``ceil(m / B) + 1`` blocks per m positions, i.e. from object storage
  a few contiguous ranges of B windows, at the cost of neighbours that are B-local in the file.

A bijection in both modes: block slots and inner positions are bijections, and the partial
block's slot shifts the full blocks after it by exactly r positions. Over many epochs,
``global_windows(k)`` maps a global sample k to ``(epoch k // n, position k % n)``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..errors import ConfigError
from .permutation import _GOLDEN, _ROUNDS, KeyedPermutation, _mix, round_keys

__all__ = ["WindowOrder", "source_seed"]

_U64 = 0xFFFFFFFFFFFFFFFF
_SLOT_SALT = np.uint64(0xD6E8FEB86659FD93)


def source_seed(seed: int, identity: str) -> int:
    """A 64-bit seed for one source of a blend: its own orders, independent of the others'."""
    digest = hashlib.blake2b(f"{seed & _U64}|{identity}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _block_keys(base: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """``(rounds, m)`` uint64 round keys, one column per element's block."""
    with np.errstate(over="ignore"):
        salt = _mix((blocks.astype(np.uint64) + np.uint64(1)) * _GOLDEN)
    return _mix(base[:, None] ^ salt[None, :])


def _feistel_walk(x: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """A keyed bijection of ``[0, n)`` applied to x (uint64), with a key column per element.

    The Feistel network and cycle-walking of ``permutation.KeyedPermutation``, generalized to
    per-element keys so that every block gets its own inner order in one vectorized call.
    """
    half = np.uint64(max(1, (max(n - 1, 1).bit_length() + 1) // 2))
    mask = np.uint64((1 << int(half)) - 1)

    def rounds(v: np.ndarray, k: np.ndarray) -> np.ndarray:
        left, right = v >> half, v & mask
        with np.errstate(over="ignore"):
            for r in range(_ROUNDS):
                left, right = right, left ^ (_mix(right ^ k[r]) & mask)
        return (left << half) | right

    out = rounds(x, keys)
    walk = np.flatnonzero(out >= np.uint64(n))
    while walk.size:
        out[walk] = rounds(out[walk], keys[:, walk])
        walk = walk[out[walk] >= np.uint64(n)]
    return out


class WindowOrder:
    """The order of the n windows of one source, epoch after epoch, keyed by ``seed``.

    ``block_size=None`` is the flat mode, an integer B >= 1 the block mode (B = 1 is the flat
    mode's permutation of blocks of one window each, with a different key schedule).
    """

    def __init__(self, num_windows: int, seed: int, *, block_size: int | None = None) -> None:
        if num_windows < 1:
            raise ConfigError(
                f"the source has {num_windows} windows; expected at least one",
                hint="use a shorter sequence length or more data in this split",
            )
        if block_size is not None and block_size < 1:
            raise ConfigError(f"block_size is {block_size}; expected >= 1 or None (flat order)")
        self.num_windows = int(num_windows)
        self.seed = int(seed)
        self.block_size = None if block_size is None else int(block_size)

    def __repr__(self) -> str:
        return f"WindowOrder({self.num_windows}, seed={self.seed}, block_size={self.block_size})"

    def epoch_windows(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        """int64 windows at ``positions`` (each in ``[0, n)``) of one epoch's order."""
        k = np.asarray(positions, dtype=np.int64)
        if k.size and (int(k.min()) < 0 or int(k.max()) >= self.num_windows):
            raise IndexError(f"positions must lie in [0, {self.num_windows})")
        if self.block_size is None:
            return KeyedPermutation(self.num_windows, self.seed, epoch)(k)
        return self._blocked(k.ravel(), epoch).reshape(k.shape)

    def _blocked(self, k: np.ndarray, epoch: int) -> np.ndarray:
        size, n = self.block_size, self.num_windows
        full, rest = divmod(n, size)
        base = round_keys(self.seed, epoch)
        slot = int(_mix(np.array([base[0] ^ _SLOT_SALT]))[0]) % (full + 1)  # partial block's slot
        gap = slot * size
        in_partial = (k >= gap) & (k < gap + rest)
        shifted = np.where(k >= gap + rest, k - rest, k)
        block = np.where(in_partial, full, 0)
        inner = np.where(in_partial, k - gap, shifted % size)
        fulls = np.flatnonzero(~in_partial)
        if fulls.size:
            block[fulls] = KeyedPermutation(full, self.seed, epoch)(shifted[fulls] // size)
        out = inner.astype(np.uint64)
        for domain, sel in ((size, fulls), (rest, np.flatnonzero(in_partial))):
            if sel.size:
                out[sel] = _feistel_walk(out[sel], domain, _block_keys(base, block[sel]))
        return block * size + out.astype(np.int64)

    def global_windows(self, samples: np.ndarray) -> np.ndarray:
        """int64 windows of global samples k >= 0 (epoch ``k // n``, position ``k % n``)."""
        k = np.asarray(samples, dtype=np.int64)
        if k.size and int(k.min()) < 0:
            raise IndexError("global samples must be >= 0")
        epochs, within = np.divmod(k, self.num_windows)
        out = np.empty_like(within)
        first, last = (int(epochs.min()), int(epochs.max())) if k.size else (0, -1)
        if first == last:
            return self.epoch_windows(within, first)
        for epoch in np.unique(epochs).tolist():
            sel = epochs == epoch
            out[sel] = self.epoch_windows(within[sel], epoch)
        return out
