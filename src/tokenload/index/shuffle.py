"""The shuffle index: the order in which a GPT dataset serves its samples.

``arange(total)`` permuted by the dataset's ``RandomState``: all at once, or, with a separated
final epoch, the first ``num_samples`` among themselves and the tail among itself (the tail is
served last). dtype is uint32, or int64 once ``total_size >= 2**32 - 2`` (Megatron's rule). The
two parts are shuffled as views of one array instead of concatenated copies; the generator sees
the same two shuffle lengths, so output and generator state are Megatron's.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tokenload.errors import ConfigError

__all__ = ["build_shuffle_index", "shuffle_index_dtype"]


def shuffle_index_dtype(total_size: int) -> np.dtype:
    """uint32, or int64 when ``total_size >= 2**32 - 2``."""
    return np.dtype(np.int64 if total_size >= np.iinfo(np.uint32).max - 1 else np.uint32)


def build_shuffle_index(
    num_samples: int, total_size: int, rng: np.random.RandomState
) -> npt.NDArray[np.uint32] | npt.NDArray[np.int64]:
    """Return ``[shuffle(arange(num_samples)), shuffle(arange(num_samples, total_size))]``.

    The second part (and its shuffle) exists only when ``num_samples < total_size``.
    Identical to Megatron's ``_build_shuffle_index`` for the same ``rng`` state.
    """
    if not 0 <= num_samples <= total_size:
        raise ConfigError(
            f"shuffle index split at {num_samples} of {total_size}; expected 0 <= split <= total"
        )
    out = np.arange(total_size, dtype=shuffle_index_dtype(total_size))
    rng.shuffle(out[:num_samples])
    if num_samples != total_size:
        rng.shuffle(out[num_samples:])
    return out
