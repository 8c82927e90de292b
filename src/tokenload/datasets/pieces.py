"""What rows hold, for ``tokenload.provenance`` (``contract.PieceSource``): every order's pieces
cut to the S input tokens of a row, and a blend's rows assembled from its members'."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..contract import RowPieces
from ..errors import ConfigError

__all__ = ["blend_pieces", "input_pieces", "no_pieces", "not_answered", "token_windows"]


def not_answered(member: Any) -> ConfigError:
    """The error of ``where`` on a member that cannot invert its order (packed rows)."""
    return ConfigError(
        f"where cannot find a document's samples in a {type(member).__name__} (packed rows are"
        " not inverted yet); explain answers for it",
        hint="ask where on the same data built without packing='best-fit', or scan the steps"
        " with explain",
    )


def no_pieces(rows: int) -> RowPieces:
    empty = np.zeros(0, dtype=np.int64)
    return RowPieces(np.zeros(rows + 1, dtype=np.int64), empty, empty, empty, empty)


def input_pieces(
    sequences: np.ndarray,
    first: np.ndarray,
    lengths: np.ndarray,
    first_offsets: np.ndarray | None,
    width: int,
    *,
    starts: np.ndarray | None = None,
) -> RowPieces:
    """Pieces in the shape ``GPTDataset._pieces`` and ``windows.window_pieces`` give them (per
    row: its first piece's flat index, the pieces' lengths, the first piece's offset in its
    sequence, the others from 0; or every piece's ``starts``: packed rows) cut to each row's
    first ``width`` tokens (its ``tokens`` field: the extra label token is not one), empty
    pieces dropped; source 0."""
    rows = int(first.size)
    lengths = np.asarray(lengths, dtype=np.int64)
    if not lengths.size:
        return no_pieces(rows)
    counts = np.diff(np.append(first, lengths.size))
    row = np.repeat(np.arange(rows, dtype=np.int64), counts)
    if starts is None:
        start = np.zeros(lengths.size, dtype=np.int64)
        start[first] = np.asarray(first_offsets)
    else:
        start = np.asarray(starts, dtype=np.int64)
    ends = np.cumsum(lengths)
    before = ends - lengths - (ends[first] - lengths[first])[row]  # the row's tokens before it
    take = np.minimum(lengths, width - before)
    keep = take > 0
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(row[keep], minlength=rows), out=offsets[1:])
    documents = np.asarray(sequences, dtype=np.int64)[keep]
    return RowPieces(
        offsets, np.zeros(documents.size, np.int64), documents, start[keep], (start + take)[keep]
    )


def blend_pieces(
    which: np.ndarray, members: Sequence[int], pieces_of: Callable[[int, np.ndarray], RowPieces]
) -> RowPieces:
    """A blend's rows from its members' (``which``: the member of each row; ``pieces_of(d,
    rows)``: member d's pieces of the rows ``rows`` select), numbered by member."""
    n = int(which.size)
    parts = {d: (np.flatnonzero(which == d), pieces_of(d, which == d)) for d in members}
    counts = np.zeros(n, dtype=np.int64)
    for rows, part in parts.values():
        counts[rows] = np.diff(part.offsets)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    out = RowPieces(offsets, *(np.empty(total, dtype=np.int64) for _ in range(4)))
    for d, (rows, part) in parts.items():
        per_row = np.diff(part.offsets)
        of = np.repeat(np.arange(rows.size), per_row)
        dest = offsets[rows][of] + np.arange(of.size) - part.offsets[:-1][of]
        out.source[dest] = d
        out.document[dest] = part.document
        out.start[dest] = part.start
        out.stop[dest] = part.stop
    return out


def token_windows(start: int, stop: int, width: int, windows: int) -> np.ndarray:
    """int64 windows ``w < windows`` whose input tokens ``[w * width, w * width + width)``
    meet stream tokens ``[start, stop)`` (the computed order's grid)."""
    if stop <= start:
        return np.zeros(0, dtype=np.int64)
    return np.arange(max(start // width, 0), min((stop - 1) // width + 1, windows), dtype=np.int64)
