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

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..contract import (
    PIECE_FIRST,
    PIECE_INPUTS,
    PIECE_LENGTH,
    PIECE_SLOT,
    ROW_COUNTS,
    ROW_POSITIONS,
    row_counts,
)
from .items import (
    ItemConfig,
    PieceLayout,
    laid_positions,
    piece_layout,
    piece_starts,
    window_positions,
)
from .sources import TokenSource

__all__ = [
    "PackedRead",
    "PieceLayout",
    "merge_packed",
    "merge_pieces",
    "piece_layout",
    "piece_starts",
    "read_rows",
]


class PackedRead(NamedTuple):
    """What a read of packed rows gives (``read_batch``'s fields)."""

    windows: np.ndarray
    """``(B, S + extra)`` tokens, in the source's dtype; the slots past a row's tokens hold 0."""
    row_tokens: np.ndarray
    """int64 tokens each row holds (its window's slots from there on are padding)."""
    first: np.ndarray
    """int64 index of each row's first piece in ``length`` (every row has one)."""
    length: np.ndarray
    """int64 tokens of every piece, flat, row after row: laid back to back from each row's slot
    0, they are its document boundaries."""
    layout: PieceLayout | None = None
    """The pieces' places in their rows when the plan made them (``piece_layout``)."""
    row_documents: np.ndarray | None = None
    """Without a layout, each row's documents among its inputs when the reader counted them."""

    @property
    def documents(self) -> np.ndarray:
        """Where each row's pieces begin (``items.starts_matrix``)."""
        return piece_starts(self.length, self.first)

    def batch(self, sequence_length: int) -> dict[str, Any]:
        """The ``read_batch`` result that ``items.finish_windows`` takes, for rows of
        ``sequence_length`` inputs; with the layout, each row's packing counts (``ROW_COUNTS``)
        made for the whole read (or with the reader's ``row_documents``)."""
        tokens = self.row_tokens
        padded = bool(tokens.size) and int(_MIN(tokens)) < self.windows.shape[1]
        out = {
            "windows": self.windows,
            "padded": padded,
            "row_tokens": tokens,
            PIECE_FIRST: self.first,
            PIECE_LENGTH: self.length,
        }
        # the position ids of every row of the read at once (a worker's read of several
        # micro-batches: a few NumPy calls per read, not per micro-batch)
        lay = self.layout
        if lay is not None:
            out[PIECE_SLOT], out[PIECE_INPUTS] = lay.slot, lay.inputs
            out[ROW_COUNTS] = row_counts(lay.documents, tokens, sequence_length)
            out[ROW_POSITIONS] = laid_positions(lay.slot, lay.inputs, sequence_length)
        elif self.row_documents is not None:
            out[ROW_COUNTS] = row_counts(self.row_documents, tokens, sequence_length)
            width = self.windows.shape[1]
            out[ROW_POSITIONS] = window_positions(self.first, self.length, tokens, width, padded)
        return out


def read_rows(
    source: TokenSource,
    item: ItemConfig,
    first: np.ndarray,
    sequence: np.ndarray,
    start: np.ndarray,
    length: np.ndarray,
    layout: PieceLayout | None = None,
    *,
    tokens: np.ndarray | None = None,
    documents: np.ndarray | None = None,
) -> PackedRead:
    """The windows, token counts and pieces of rows whose pieces are given flat (``first``: each
    row's first piece; every row has one, and no row holds more than ``S + extra`` tokens).

    The boundaries the pieces give (``items.starts_bounds`` of ``piece_starts``) are the ends of
    every piece but a row's last (its end, like the padding after it, is the row's end S): the
    layout of ``items.document_bounds`` without the extra token's rule, since a packed row's last
    slot holds a label only, whichever document it belongs to. ``tokens``: each row's tokens,
    when the caller has summed them; ``documents``: each row's documents among its inputs, when
    the caller has counted them (``PackedRead.row_documents``).
    """
    batch, width = first.size, item.window
    flat = source.read_pieces(sequence, start, length)
    length = np.asarray(length, dtype=np.int64)
    first = np.asarray(first, dtype=np.int64)
    if not batch:
        empty = np.zeros(0, dtype=np.int64)
        return PackedRead(flat.reshape(0, width), empty, empty, empty, layout, documents)
    if tokens is None:
        tokens = _ADD_AT(length, first)
    if flat.size == batch * width:  # every row full: its pieces back to back are the windows
        windows = flat.reshape(batch, width)
    else:  # a few short rows: the full ones between them are still back to back in ``flat``
        windows = np.empty((batch, width), dtype=flat.dtype)
        row = begin = 0
        for short in [*np.flatnonzero(tokens < width).tolist(), batch]:
            if short > row:
                end = begin + (short - row) * width
                windows[row:short] = flat[begin:end].reshape(short - row, width)
                begin = end
            if short < batch:
                n = int(tokens[short])
                windows[short, :n] = flat[begin : begin + n]
                windows[short, n:] = 0
                begin += n
            row = short + 1
    return PackedRead(windows, tokens, first, length, layout, documents)


_ADD_AT = np.add.reduceat
_MIN = np.minimum.reduce


def merge_pieces(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    batch: int,
    columns: Sequence[tuple[np.ndarray, ...]] | None = None,
) -> tuple[np.ndarray, ...]:
    """``(first, length)`` of a micro-batch of ``batch`` rows whose rows come from several parts,
    each ``(mask of the rows it fills, its rows' first pieces, its pieces' lengths)``; with
    ``columns`` (per part, more per-piece arrays), those merged too, after ``length``."""
    counts = np.zeros(batch, dtype=np.int64)
    for rows, first, length in parts:
        counts[rows] = np.diff(first, append=length.size)
    merged_first = np.zeros(batch, dtype=np.int64)
    np.cumsum(counts[:-1], out=merged_first[1:])
    total = int(counts.sum())
    merged = [np.empty(total, dtype=np.int64)]
    if columns:
        merged += [np.empty(total, dtype=c.dtype) for c in columns[0]]
    for i, (rows, first, length) in enumerate(parts):
        each = np.diff(first, append=length.size)
        to = np.arange(length.size, dtype=np.int64) + np.repeat(merged_first[rows] - first, each)
        for out, values in zip(merged, (length, *(columns[i] if columns else ())), strict=True):
            out[to] = values
    return (merged_first, *merged)


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
    parts = [(rows, r.first, r.length) for rows, r in reads]
    layouts = [r.layout for _, r in reads]
    if not reads:  # no row
        first, length = merge_pieces(parts, batch)
        empty = piece_layout(np.zeros(1, dtype=np.int64), length, item.sequence_length)
        return PackedRead(windows, tokens, first, length, empty)
    if any(lay is None for lay in layouts):
        first, length = merge_pieces(parts, batch)
        return PackedRead(windows, tokens, first, length)
    columns = [(lay.slot, lay.inputs) for lay in layouts if lay is not None]
    first, length, slot, inputs = merge_pieces(parts, batch, columns)
    documents = np.empty(batch, dtype=np.int32)
    for (rows, _), lay in zip(reads, layouts, strict=True):
        assert lay is not None
        documents[rows] = lay.documents
    return PackedRead(windows, tokens, first, length, PieceLayout(slot, inputs, documents))
