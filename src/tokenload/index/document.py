"""The document index: every epoch's sequence ids, shuffled by Megatron's ``RandomState``.

Megatron tiles the split's sequence ids ``E`` times through ``numpy.mgrid`` (a 2 x E x n int64
temporary), casts to int32 and calls ``RandomState.shuffle`` once on all of it, or, when the
final epoch is separate, once on the first ``E - 1`` epochs and once on the last. A legacy
``RandomState`` shuffle of a 1-D array consumes the generator according to its length only
(not its dtype or memory layout), so this module writes the tiles straight into one int32 array
and shuffles views of it in place: identical output and generator state, one array of memory.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tokenload.errors import ConfigError

__all__ = ["as_sequence_ids", "build_document_index", "tokens_per_epoch"]

_INT32_MAX = int(np.iinfo(np.int32).max)  # Megatron's C++ indices are int32


def as_sequence_ids(documents: npt.ArrayLike, name: str = "documents") -> npt.NDArray[np.int32]:
    """Return ``documents`` as a 1-D int32 array, raising ``ConfigError`` if ids do not fit.

    Megatron keeps sequence ids in int32 (``indexed_indices`` and the document index); a file
    with more than 2**31 - 1 sequences cannot be indexed by it.
    """
    arr = np.asarray(documents)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ConfigError(
            f"{name} has shape {arr.shape} and dtype {arr.dtype}; "
            "expected a 1-D integer array of sequence ids"
        )
    if arr.dtype == np.int32:
        return arr
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > _INT32_MAX):
        raise ConfigError(
            f"{name} holds ids in [{int(arr.min())}, {int(arr.max())}]; expected 0..{_INT32_MAX} "
            "(Megatron's document index is int32)",
            hint="split the token file into files of fewer than 2**31 sequences",
        )
    return arr.astype(np.int32)


_RUN_CHECK = 1 << 20  # ids compared per pass when testing that documents are one run


def tokens_per_epoch(sequence_lengths: npt.ArrayLike, documents: npt.ArrayLike) -> int:
    """Total tokens of the sequences ``documents`` selects (int64 sum, as Megatron's).

    A split's documents are one run of ids (``arange(begin, end)``): their lengths are then
    summed in place instead of gathered into a copy first. At 100M documents that copy is a
    400 MB array whose fresh pages cost 1.0-3.5 s of CPU on a 2-core VM (the gather itself is
    sequential and cheap; ``benchmarks/README.md``, issue 27). Any other ``documents`` (or an
    id out of range, which raises) takes the gather."""
    lengths = np.asarray(sequence_lengths)
    docs = np.asarray(documents)
    if _one_run(docs, lengths.shape[0]):
        first = int(docs[0])
        return int(np.sum(lengths[first : first + docs.shape[0]], dtype=np.int64))
    return int(np.sum(lengths[docs], dtype=np.int64))


def _one_run(docs: np.ndarray, count: int) -> bool:
    """Whether ``docs`` is ``arange(first, first + n)`` with every id in ``[0, count)``: two
    ends checked first, then every id, a bounded block at a time (no array of ``n`` made)."""
    n = docs.shape[0] if docs.ndim == 1 else 0
    if n < _RUN_CHECK or not np.issubdtype(docs.dtype, np.integer):
        return False
    first, last = int(docs[0]), int(docs[-1])
    if first < 0 or last >= count or last - first != n - 1:
        return False
    step = np.arange(_RUN_CHECK, dtype=docs.dtype)
    for a in range(0, n, _RUN_CHECK):
        block = docs[a : a + _RUN_CHECK]
        if not np.array_equal(block, step[: block.shape[0]] + (first + a)):
            return False
    return True


def build_document_index(
    documents: npt.ArrayLike,
    num_epochs: int,
    rng: np.random.RandomState,
    separate_final_epoch: bool,
    out: npt.NDArray[np.int32] | None = None,
) -> npt.NDArray[np.int32]:
    """Return the shuffled document index (int32, length ``num_epochs * len(documents)``).

    Identical to Megatron's ``_build_document_index`` for the same ``rng`` state, and leaves
    ``rng`` in the same state: one shuffle of all epochs, or, when ``separate_final_epoch`` and
    ``num_epochs > 1``, a shuffle of the first ``num_epochs - 1`` epochs then one of the last.
    ``out``: an int32 array (or view) of that length to draw it in, returned.
    """
    docs = as_sequence_ids(documents)
    if num_epochs < 1:
        raise ConfigError(f"num_epochs is {num_epochs}; expected >= 1")
    n = docs.shape[0]
    if out is None:
        out = np.empty(num_epochs * n, dtype=np.int32)
    elif out.dtype != np.int32 or out.shape != (num_epochs * n,):
        raise ValueError(
            f"out must be int32 of shape ({num_epochs * n},); got {out.dtype} {out.shape}"
        )
    out.reshape(num_epochs, n)[...] = docs
    if separate_final_epoch and num_epochs > 1:
        cut = (num_epochs - 1) * n
        rng.shuffle(out[:cut])
        rng.shuffle(out[cut:])
    else:
        rng.shuffle(out)
    return out
