"""Reading packed rows (``packing="best-fit"``), shared by the computed and Megatron orders: a
row's document pieces read in one vectorized call, laid back to back in a window of
``S + extra`` slots padded with ``pad_id``, with the row's document boundaries
(``items.finish_windows`` makes the item fields: position ids restart at each document, padding
has no loss)."""

from __future__ import annotations

import functools

import numpy as np

from .items import ItemConfig, document_bounds
from .sources import TokenSource

__all__ = ["read_rows"]


@functools.lru_cache(maxsize=8)
def _slots(width: int) -> np.ndarray:
    """``arange(width)``, made once per width (read-only: shared)."""
    out = np.arange(width, dtype=np.int64)
    out.flags.writeable = False
    return out


def read_rows(
    source: TokenSource,
    item: ItemConfig,
    first: np.ndarray,
    sequence: np.ndarray,
    start: np.ndarray,
    length: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """int64 ``(B, S + extra)`` windows and int32 ``(B, S + 1)`` boundaries of rows whose pieces
    are given flat (``first``: each row's first piece; every row has one).

    The boundaries are the ends of every piece but a row's last (its end, like the padding
    after it, is the row's end S), the layout of ``items.document_bounds`` without the extra
    token's rule: a packed row's last slot holds a label only, whichever document it belongs to.
    """
    batch = first.size
    flat = source.read_pieces(sequence, start, length, np.int64)
    out = np.full((batch, item.window), item.pad_id, dtype=np.int64)
    if batch:
        # each row's tokens are contiguous in flat and start its window: one masked copy, in
        # row-major order (an index pair per token cost more than a whole concatenated batch)
        tokens = np.add.reduceat(length, first)
        out[_slots(item.window)[None, :] < tokens[:, None]] = flat
    return out, document_bounds(length, first, item.sequence_length, 0)
