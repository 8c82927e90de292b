"""The window order of the computed order: a keyed permutation per epoch, computed on demand.

Position k of epoch e holds window ``p_e(k)``. Two modes, both O(1) memory and O(1) expected
work per position, vectorized over a batch of positions (nothing of size n is built):

* **flat**: ``p_e`` is a keyed bijection of ``[0, n)`` (below), keyed by (seed, e).
* **block**: the n windows form ``nb = n // B`` full blocks of B consecutive windows and, when B
  does not divide n, one partial block of ``r = n % B`` windows (the last ones). The full blocks
  are permuted by the keyed bijection of ``[0, nb)``; the partial block is placed at a keyed
  slot ``s`` in ``[0, nb]`` of that block order (positions ``[s*B, s*B + r)``); the windows
  inside every block are permuted by a bijection keyed by (seed, e, block). Consecutive
  positions then read from at most ``ceil(m / B) + 1`` blocks per m positions, i.e. from object
  storage a few contiguous ranges of B windows, at the cost of neighbours that are B-local in
  the file.

A bijection in both modes: block slots and inner positions are bijections, and the partial
block's slot shifts the full blocks after it by exactly r positions. Over many epochs,
``global_windows(k)`` maps a global sample k to ``(epoch k // n, position k % n)``.

**The keyed bijection** is a Feistel network over ``Z_a x Z_b`` with modular addition (the
construction of format-preserving encryption): ``a = ceil(sqrt(n))``, ``b = ceil(n / a)``,
``x -> (x // b, x % b)``, six rounds of ``(L, R) -> (R, (L + F_r(R)) mod |L's ring|)`` (the
rings alternate, so after an even number of rounds the state is in ``Z_a x Z_b`` again), then
``L*b + R``. The domain ``a*b`` exceeds n by less than a (about sqrt(n)), so cycle-walking
(re-applying it to a value ``>= n``) is needed for a share below ``1/sqrt(n)`` of positions:
one pass of the network almost always, where the binary Feistel of ``permutation.py`` (domain
up to 4n) needs up to a dozen passes for the unluckiest of 32 positions. The round function is a
multiply-xorshift hash of (R, round key) whose high 32 bits are scaled into the ring. Every
parameter (domain, ring sizes, keys) may differ per element, so the draws of many sources and
epochs are one call: ``Mixture.draw`` costs the same NumPy calls for 1 source as for 100.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ..errors import ConfigError
from .permutation import _GOLDEN, _mix

__all__ = ["WindowOrder", "keyed_positions", "keyed_windows", "source_seed"]

_U64 = 0xFFFFFFFFFFFFFFFF
_ROUNDS = 6
_SLOT_SALT = np.uint64(0xD6E8FEB86659FD93)
_EPOCH_MUL = np.uint64(0x100000001B3)
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S29, _S32 = np.uint64(29), np.uint64(32)
_MIN, _MAX = np.minimum.reduce, np.maximum.reduce
_ROUND_STEPS = (_GOLDEN * np.arange(1, _ROUNDS + 1, dtype=np.uint64))[:, None]


def source_seed(seed: int, identity: str) -> int:
    """A 64-bit seed for one source of a blend: its own orders, independent of the others'."""
    digest = hashlib.blake2b(f"{seed & _U64}|{identity}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _rings(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint64 ``(a, b)`` per domain size n >= 1: ``a = ceil(sqrt(n))``, ``b = ceil(n / a)``."""
    n = np.asarray(n, dtype=np.uint64)
    a = np.ceil(np.sqrt(n.astype(np.float64))).astype(np.uint64)
    a = np.where(a * a < n, a + np.uint64(1), a)  # the float square root may be one off
    a = np.maximum(
        np.where((a - np.uint64(1)) * (a - np.uint64(1)) >= n, a - np.uint64(1), a), np.uint64(1)
    )
    return a, (n + a - np.uint64(1)) // a


def _keys(seeds: np.ndarray, epochs: np.ndarray) -> np.ndarray:
    """``(rounds, m)`` uint64 round keys of (seed, epoch) per element (or ``(rounds, 1)``)."""
    base = _mix(seeds * _EPOCH_MUL + epochs.astype(np.uint64))
    return _mix(base[None, :] + _ROUND_STEPS)


def _pick(param: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """The entries of a per-element parameter at ``sel`` (a shared one, size 1, as it is)."""
    return param if param.shape[-1] == 1 else param[..., sel]


def _round(right: np.ndarray, key: np.ndarray, ring: np.ndarray) -> np.ndarray:
    """The round function: a multiply-xorshift hash of (R, round key), its high 32 bits scaled
    into ``[0, ring)``."""
    f: np.ndarray = right ^ key
    f *= _M1
    f ^= f >> _S29
    f *= _M2
    f >>= _S32
    f *= ring
    f >>= _S32
    return f


def _network(x: np.ndarray, a: np.ndarray, b: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """One pass of the Feistel network over ``Z_a x Z_b`` (x < a*b, uint64)."""
    left, right = np.divmod(x, b)
    ring_left, ring_right = a, b
    for r in range(_ROUNDS):
        f = _round(right, keys[r], ring_left)
        f += left
        f %= ring_left
        left, right = right, f
        ring_left, ring_right = ring_right, ring_left
    joined: np.ndarray = left * b + right
    return joined


def keyed_bijection(
    x: np.ndarray,
    n: np.ndarray,
    keys: np.ndarray,
    rings: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """uint64 images of positions ``x < n`` under the keyed bijection of ``[0, n)``.

    ``n`` (uint64), ``keys`` (``(rounds, m)``) and ``rings`` (``_rings(n)``, computed when not
    given) hold one entry per element of x, or one for all (size 1 on the last axis)."""
    return _cycle_walk(_network, x, n, keys, rings)


def _cycle_walk(
    network: Any,
    x: np.ndarray,
    n: np.ndarray,
    keys: np.ndarray,
    rings: tuple[np.ndarray, np.ndarray] | None,
) -> np.ndarray:
    """``network`` (or its inverse) restricted to ``[0, n)``: applied again to the rare values
    that left it."""
    a, b = _rings(n) if rings is None else rings
    out: np.ndarray = network(x, a, b, keys)
    walk = np.flatnonzero(out >= n)
    while walk.size:
        out[walk] = network(out[walk], _pick(a, walk), _pick(b, walk), _pick(keys, walk))
        walk = walk[out[walk] >= _pick(n, walk)]
    return out


def _network_inverse(y: np.ndarray, a: np.ndarray, b: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The inverse of ``_network``: its rounds undone in reverse order (round r added
    ``F_r(R)`` to L modulo L's ring, a for even r, b for odd; R is the next L)."""
    left, right = np.divmod(y, b)
    for r in reversed(range(_ROUNDS)):
        ring = a if r % 2 == 0 else b
        left, right = (right + ring - _round(left, keys[r], ring)) % ring, left
    joined: np.ndarray = left * b + right
    return joined


def keyed_inverse(
    y: np.ndarray,
    n: np.ndarray,
    keys: np.ndarray,
    rings: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """uint64 positions of elements ``y < n``: the inverse of ``keyed_bijection`` (the network
    undone, cycle-walking back while the value is ``>= n``), same parameters."""
    return _cycle_walk(_network_inverse, np.asarray(y, dtype=np.uint64), n, keys, rings)


def keyed_positions(
    windows: np.ndarray,
    epochs: np.ndarray,
    num_windows: np.ndarray,
    seeds: np.ndarray,
    block_size: int | None,
) -> np.ndarray:
    """int64 position of each window in its epoch's order: the inverse of ``keyed_windows``
    (``keyed_windows(keyed_positions(w, e, ...), e, ...) == w``), vectorized the same way."""
    w = np.asarray(windows, dtype=np.int64).astype(np.uint64)
    n = np.atleast_1d(np.asarray(num_windows, dtype=np.uint64))
    keys = _keys(
        np.atleast_1d(np.asarray(seeds, dtype=np.uint64)), np.atleast_1d(np.asarray(epochs))
    )
    if block_size is None:
        return keyed_inverse(w, n, keys).astype(np.int64)
    size = np.uint64(block_size)
    full, rest = n // size, n % size
    slot = _mix(keys[0] ^ _SLOT_SALT) % (full + np.uint64(1))
    gap = slot * size
    block, inner_window = np.divmod(w, size)
    in_partial = block >= full
    with np.errstate(over="ignore"):
        salt = _mix((block + np.uint64(1)) * _GOLDEN)
    domain = np.where(in_partial, rest, size)
    inner = keyed_inverse(inner_window, domain, _mix(keys ^ salt[None, :]))
    k = gap + inner  # the partial block's positions (the full blocks' below)
    fulls = np.flatnonzero(~in_partial)
    if fulls.size:
        order = keyed_inverse(block[fulls], _pick(full, fulls), _pick(keys, fulls))
        shifted = order * size + inner[fulls]
        g, r = _pick(gap, fulls), _pick(rest, fulls)
        k[fulls] = np.where(shifted >= g, shifted + r, shifted)
    keyed: np.ndarray = k.astype(np.int64)
    return keyed


def keyed_windows(
    positions: np.ndarray,
    epochs: np.ndarray | None,
    num_windows: np.ndarray,
    seeds: np.ndarray,
    block_size: int | None,
    *,
    keys: np.ndarray | None = None,
    rings: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """int64 window at each position (``< num_windows``) of each epoch's order, vectorized.

    ``num_windows`` and ``seeds`` (uint64) hold one entry per position, or one for all: the
    positions of many sources, each with its own order, are one call. ``keys`` (the round keys
    of (seed, epoch), ``_keys``) and ``rings`` (``_rings(num_windows)``) may be passed when the
    caller keeps them (they cost a third of a small batch's work).
    """
    k = np.asarray(positions, dtype=np.int64).astype(np.uint64)
    n = np.atleast_1d(np.asarray(num_windows, dtype=np.uint64))
    if keys is None:
        keys = _keys(
            np.atleast_1d(np.asarray(seeds, dtype=np.uint64)), np.atleast_1d(np.asarray(epochs))
        )
    if block_size is None:
        return keyed_bijection(k, n, keys, rings).astype(np.int64)
    return _blocked(k, n, keys, np.uint64(block_size)).astype(np.int64)


def _blocked(k: np.ndarray, n: np.ndarray, base: np.ndarray, size: np.uint64) -> np.ndarray:
    """The block mode (module docstring) with per-element domains and keys."""
    full, rest = n // size, n % size
    slot = _mix(base[0] ^ _SLOT_SALT) % (full + np.uint64(1))  # the partial block's slot
    gap = slot * size
    in_partial = (k >= gap) & (k < gap + rest)
    shifted = np.where(k >= gap + rest, k - rest, k)
    block = np.broadcast_to(full, k.shape).copy()  # the partial block's number is nb
    inner = np.where(in_partial, k - gap, shifted % size)
    fulls = np.flatnonzero(~in_partial)
    if fulls.size:
        block[fulls] = keyed_bijection(
            shifted[fulls] // size, _pick(full, fulls), _pick(base, fulls)
        )
    with np.errstate(over="ignore"):
        salt = _mix((block + np.uint64(1)) * _GOLDEN)
    domain = np.where(in_partial, rest, size)
    keyed: np.ndarray = block * size + keyed_bijection(inner, domain, _mix(base ^ salt[None, :]))
    return keyed


class WindowOrder:
    """The order of the n windows of one source, epoch after epoch, keyed by ``seed``.

    ``block_size=None`` is the flat mode, an integer B >= 1 the block mode (B = 1 permutes
    blocks of one window each: the flat order with a different key schedule).
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
        self.seed = int(seed) & _U64
        self.block_size = None if block_size is None else int(block_size)
        self._n = np.array([self.num_windows], dtype=np.uint64)
        self._seed = np.array([self.seed], dtype=np.uint64)
        self._rings = _rings(self._n) if self.block_size is None else None
        self._epoch_keys: dict[int, np.ndarray] = {}

    def __repr__(self) -> str:
        return f"WindowOrder({self.num_windows}, seed={self.seed}, block_size={self.block_size})"

    def keys(self, epoch: int) -> np.ndarray:
        """``(rounds, 1)`` round keys of one epoch (the last few kept)."""
        keys = self._epoch_keys.get(epoch)
        if keys is None:
            if len(self._epoch_keys) >= 4:
                self._epoch_keys.clear()
            keys = self._epoch_keys[epoch] = _keys(self._seed, np.array([epoch], dtype=np.int64))
        return keys

    def epoch_windows(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        """int64 windows at ``positions`` (each in ``[0, n)``) of one epoch's order."""
        k = np.asarray(positions, dtype=np.int64)
        if k.size and (int(k.min()) < 0 or int(k.max()) >= self.num_windows):
            raise IndexError(f"positions must lie in [0, {self.num_windows})")
        out = keyed_windows(
            k.ravel(),
            None,
            self._n,
            self._seed,
            self.block_size,
            keys=self.keys(int(epoch)),
            rings=self._rings,
        )
        return out.reshape(k.shape)

    def epoch_positions(self, windows: np.ndarray, epochs: np.ndarray) -> np.ndarray:
        """int64 position of each window (``< n``) in its epoch's order (``epochs``, one per
        window or one for all): the inverse of ``epoch_windows``, O(1) per window."""
        w = np.asarray(windows, dtype=np.int64).ravel()
        if w.size and (int(w.min()) < 0 or int(w.max()) >= self.num_windows):
            raise IndexError(f"windows must lie in [0, {self.num_windows})")
        e = np.broadcast_to(np.asarray(epochs, dtype=np.int64), w.shape)
        return keyed_positions(w, e, self._n, self._seed, self.block_size)

    def global_windows(
        self, samples: np.ndarray, bounds: tuple[int, int] | None = None
    ) -> np.ndarray:
        """int64 windows of global samples k >= 0 (epoch ``k // n``, position ``k % n``);
        ``bounds``: their minimum and maximum when the caller has them."""
        k = np.asarray(samples, dtype=np.int64).ravel()
        if not k.size:
            return np.empty(np.shape(samples), dtype=np.int64)
        low, high = (int(_MIN(k)), int(_MAX(k))) if bounds is None else bounds
        if low < 0:
            raise IndexError("global samples must be >= 0")
        n = self.num_windows
        if low // n == high // n:  # one epoch (nearly every batch): its keys are kept
            epoch = low // n
            out = keyed_windows(
                k - epoch * n,
                None,
                self._n,
                self._seed,
                self.block_size,
                keys=self.keys(epoch),
                rings=self._rings,
            )
        else:
            epochs, within = np.divmod(k, n)
            out = keyed_windows(
                within, epochs, self._n, self._seed, self.block_size, rings=self._rings
            )
        return out.reshape(np.shape(samples))
