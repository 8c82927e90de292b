"""NumPy helpers that every layer may use (this module imports nothing of tokenload).

``distinct`` is ``np.unique`` for the read path: on NumPy 2.x the first ``np.unique`` of a process
imports ``numpy.ma`` (measured 3 ms with a warm page cache, 16 ms cold), which landed in the first
micro-batch of every rank and spawned worker, in both orders.
"""

from __future__ import annotations

from typing import overload

import numpy as np

__all__ = ["distinct", "from_end", "sample_indices"]

_INT64_MAX = int(np.iinfo(np.int64).max)


@overload
def distinct(values: np.ndarray) -> np.ndarray: ...
@overload
def distinct(values: np.ndarray, *, first_index: bool) -> tuple[np.ndarray, np.ndarray]: ...


def distinct(
    values: np.ndarray, *, first_index: bool = False
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """The sorted distinct values of ``values`` (flattened), as ``np.unique`` gives them; with
    ``first_index``, also the index of each one's first occurrence (``return_index=True``)."""
    flat = np.asarray(values).ravel()
    if first_index:
        order = np.argsort(flat, kind="stable")
        ordered = flat[order]
    else:
        ordered = np.sort(flat)
    keep = np.empty(ordered.size, dtype=bool)
    if ordered.size:
        keep[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    if first_index:
        return ordered[keep], order[keep]
    return ordered[keep]


def sample_indices(indices: object) -> np.ndarray:
    """Sample indices as a flat int64 array; ``IndexError`` for any other kind of value (a float
    index was cast to an int, ``[1.5]`` serving sample 1, and booleans would be a mask in NumPy's
    indexing) or a uint64 one past int64 (cast, it wrapped to a negative index, served from the
    end): what a dataset's ``read_batch`` takes."""
    idx = np.asarray(indices)
    empty_list = not idx.size and idx.dtype.kind == "f"  # NumPy makes [] float64
    if idx.dtype.kind not in "iu" and not empty_list:
        shown = idx.ravel()[:3]
        raise IndexError(f"sample indices must be integers, got {idx.dtype} ({shown})")
    if idx.dtype == np.uint64 and idx.size and int(idx.max()) > _INT64_MAX:
        # (cast, 2**64 - 1 would be -1: the last sample)
        raise IndexError(f"sample indices must be integers below 2**63, got {int(idx.max())}")
    return idx.astype(np.int64, copy=False).ravel()


def from_end(idx: np.ndarray, n: int) -> tuple[np.ndarray, tuple[int, int] | None]:
    """Sample indices of a dataset of ``n`` samples with negative ones counted from the end
    (NumPy's and megatron-core's rule: -1 is the last), and their (lowest, highest), None when
    there is none; ``IndexError`` when one lies outside ``[-n, n)``."""
    if not idx.size:
        return idx, None
    low, high = int(np.minimum.reduce(idx)), int(np.maximum.reduce(idx))
    if low < -n or high >= n:
        raise IndexError(f"sample indices must lie in [-{n}, {n})")
    if low < 0:
        idx = np.where(idx < 0, idx + n, idx)
        low, high = int(np.minimum.reduce(idx)), int(np.maximum.reduce(idx))
    return idx, (low, high)
