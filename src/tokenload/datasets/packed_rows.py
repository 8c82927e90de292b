"""Reading packed rows (``packing="best-fit"``), shared by the computed and Megatron orders: a
row's document pieces read in one vectorized call, in the file's compact dtype, laid back to back
in a window of ``S + extra`` slots, with the row's token count and document boundaries
(``items.finish_windows`` makes the item fields: position ids restart at each document, the slots
past a row's tokens are padding, with no loss).

Best-fit leaves well under 1% of the slots empty, so nearly every micro-batch is made of full
rows: its pieces, read back to back, are already its windows (a reshape, no copy). A micro-batch
with a short row copies each row into a zeroed window; the empty slots are told apart by the
row's token count (``row_tokens``), not by a pad value, so the windows keep the file's dtype."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from .items import NO_START, ItemConfig, starts_matrix
from .sources import TokenSource

__all__ = [
    "PackedRead",
    "merge_packed",
    "merge_starts",
    "piece_starts",
    "read_rows",
]


class PackedRead(NamedTuple):
    """What a read of packed rows gives (``read_batch``'s fields)."""

    windows: np.ndarray
    """``(B, S + extra)`` tokens, in the source's dtype; the slots past a row's tokens hold 0."""
    row_tokens: np.ndarray
    """int64 tokens each row holds (its window's slots from there on are padding)."""
    documents: np.ndarray
    """Where each row's pieces begin (``items.starts_matrix``): its document boundaries."""

    def batch(self) -> dict[str, Any]:
        """The ``read_batch`` result that ``items.finish_windows`` takes."""
        return {
            "windows": self.windows,
            "padded": bool(self.row_tokens.size)
            and int(self.row_tokens.min()) < self.windows.shape[1],
            "row_tokens": self.row_tokens,
            "doc_starts": self.documents,
        }


def read_rows(
    source: TokenSource,
    item: ItemConfig,
    first: np.ndarray,
    sequence: np.ndarray,
    start: np.ndarray,
    length: np.ndarray,
) -> PackedRead:
    """The windows, token counts and document starts of rows whose pieces are given flat
    (``first``: each row's first piece; every row has one, and no row holds more than
    ``S + extra`` tokens).

    The boundaries the starts give (``items.starts_bounds``) are the ends of every piece but a
    row's last (its end, like the padding after it, is the row's end S): the layout of
    ``items.document_bounds`` without the extra token's rule, since a packed row's last slot
    holds a label only, whichever document it belongs to.
    """
    batch, width = first.size, item.window
    flat = source.read_pieces(sequence, start, length)
    if not batch:
        empty = np.zeros(0, dtype=np.int64)
        return PackedRead(flat.reshape(0, width), empty, np.zeros((0, 1), dtype=np.int32))
    tokens = _ADD_AT(np.asarray(length, dtype=np.int64), first)
    if flat.size == batch * width:  # every row full: its pieces back to back are the windows
        windows = flat.reshape(batch, width)
    else:
        windows = np.zeros((batch, width), dtype=flat.dtype)
        begin = 0
        for row, n in enumerate(tokens.tolist()):
            windows[row, :n] = flat[begin : begin + n]
            begin += n
    return PackedRead(windows, tokens, piece_starts(length, first))


_ADD_AT = np.add.reduceat


@functools.lru_cache(maxsize=4)
def _count(n: int) -> np.ndarray:
    """``arange(n)`` (read-only: shared), grown in powers of two."""
    out = np.arange(n, dtype=np.int64)
    out.flags.writeable = False
    return out


def _upto(n: int) -> np.ndarray:
    return _count(max(1024, 1 << (n - 1).bit_length()))[:n]


def piece_starts(length: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Each row's pieces' first slots (``items.starts_matrix``), from the pieces' lengths flat
    (``first``: each row's first piece; every row has one)."""
    batch, total = first.size, length.size
    length = np.asarray(length, dtype=np.int64)
    count = np.empty(batch, dtype=np.int64)  # pieces per row
    count[:-1] = first[1:]
    count[-1] = total
    count -= first
    row = np.repeat(_upto(batch), count)
    base = first[row]
    slot = np.cumsum(length)
    slot -= length  # each piece's first token among all the rows'
    slot -= slot[base]
    return starts_matrix(row, slot, _upto(total) - base, batch)


def merge_packed(
    reads: list[tuple[np.ndarray, PackedRead]], batch: int, item: ItemConfig
) -> PackedRead:
    """One ``PackedRead`` of ``batch`` rows from several sources' reads, each with the boolean
    mask of the rows it fills (a blend's micro-batch); the windows in the sources' common dtype."""
    if len(reads) == 1 and bool(reads[0][0].all()):
        return reads[0][1]
    dtype = np.result_type(*[r.windows.dtype for _, r in reads]) if reads else np.int64
    windows = np.empty((batch, item.window), dtype=dtype)
    tokens = np.empty(batch, dtype=np.int64)
    for rows, read in reads:
        windows[rows], tokens[rows] = read.windows, read.row_tokens
    return PackedRead(windows, tokens, merge_starts([(rows, r.documents) for rows, r in reads]))


def merge_starts(parts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The ``doc_starts`` matrix of a micro-batch whose rows come from several parts, each with
    the boolean mask of the rows it fills (the widest part's width)."""
    batch = parts[0][0].size if parts else 0
    width = max((d.shape[1] for _, d in parts), default=1)
    out = np.empty((batch, width), dtype=np.int32)
    out.fill(NO_START)
    for rows, d in parts:
        out[rows, : d.shape[1]] = d
    return out
