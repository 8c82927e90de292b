"""Packed rows of whole documents: best-fit decreasing over a block of documents, NumPy only.

A *row* is one sample's window of ``W = S + extra`` token slots (read as one window: the inputs
are its first S tokens, the labels the window shifted by one, as for a concatenated sample). A
row holds whole documents back to back, then padding. A document of at most W tokens is never
cut. A longer one is cut into full windows that overlap by ``extra`` tokens, as Megatron's
consecutive samples do (piece p holds tokens ``[p*S, p*S + W)``, so every token but the
document's first is a label exactly once), and the rest after the last full window
(``[m*S, L)``, kept when it holds more than ``extra`` tokens: else every one of its tokens was a
label already) is packed like a short document. Empty documents hold nothing and make no piece.

**The rule: best-fit decreasing (BFD).** Items (documents and rests) are taken by size,
largest first (ties in block order); each goes into the open row with the least room that still
fits it (ties: the row opened first), else into a new row. With ``max_docs``, a row that holds
that many pieces takes no more.

**How it runs.** One item at a time in Python would cost ~1 us per document (100 s for 100M).
Items of one size are placed together instead: the open rows that fit size s, in order of room
(then age), are exactly the rows BFD visits one after the other, and each takes
``min(room // s, max_docs - pieces)`` items before the next one is the best fit (its room left
is below s, or it is full). So a size class is a cumulative sum over the fitting rows and a
search for where its items run out; the rows it opens take ``min(W // s, max_docs)`` items each.
The classes of more than half a row come first and fit no open row (each holds an item at least
as large), so their items open a row each, all at once (about half the classes of a web-text block:
its BFD went from 15 to 11 ms for 131,072 documents at S = 2,048).
Rows are kept sorted by the key ``room << 32 | row``, updated by merging the few rows a class
touched. Cost per block: O(distinct sizes) NumPy calls plus O(items) work, the same placement as
the item-by-item rule (tests/unit/test_packing.py checks it against a direct implementation).
"""

from __future__ import annotations

import array
import bisect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["PackPlan", "best_fit_decreasing", "pack_block", "split_documents"]


@dataclass(frozen=True)
class Pieces:
    """The items of a block: a document whole, a full window of a long one, or its rest."""

    doc: np.ndarray
    """int64 index of each piece's document in the block."""
    start: np.ndarray
    """int64 first token of the piece within its document."""
    length: np.ndarray
    """int64 tokens of the piece."""


@dataclass(frozen=True)
class PackPlan:
    """Rows of one block: CSR offsets into its pieces, in row order, each row's pieces in the
    order they were placed (largest first)."""

    window: int
    """Token slots per row (``S + extra``)."""
    row_offsets: np.ndarray
    """int64 ``(num_rows + 1,)``: row r holds pieces ``[row_offsets[r], row_offsets[r + 1])``."""
    piece_doc: np.ndarray
    """int64 per piece: the document's index in the block."""
    piece_start: np.ndarray
    """int64 per piece: its first token within the document."""
    piece_length: np.ndarray
    """int64 per piece: its tokens."""
    cut_documents: int
    """Documents of the block longer than the window (each cut into pieces)."""

    @property
    def num_rows(self) -> int:
        return len(self.row_offsets) - 1

    @property
    def padding(self) -> int:
        """Token slots no piece fills."""
        return self.num_rows * self.window - int(self.piece_length.sum())

    def row_tokens(self) -> np.ndarray:
        """int64 tokens each row holds."""
        if not self.num_rows:
            return np.zeros(0, dtype=np.int64)
        return np.add.reduceat(self.piece_length, self.row_offsets[:-1])


def split_documents(lengths: np.ndarray, window: int, extra: int) -> Pieces:
    """Every document's pieces, in document order (module docstring). ``window = S + extra``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if window < 1 or extra not in (0, 1) or window <= extra:
        raise ValueError(f"window {window} and extra {extra}: need window > extra >= 0")
    if lengths.size and int(lengths.min()) < 0:
        raise ValueError("document lengths must be >= 0")
    stride = window - extra
    # every non-empty document is one piece, whole, but the long ones (a few): those are laid
    # out apart and written over their places (a few passes over the block, not one per step)
    counts = (lengths > 0).view(np.int8).astype(np.int64)
    long = np.flatnonzero(lengths > window)
    n = lengths[long]
    full = (n - extra) // stride  # full windows of each long document
    rest = n - full * stride  # then the rest, kept when it holds an input
    parts = full + (rest > extra)
    counts[long] = parts
    doc = np.repeat(np.arange(lengths.size, dtype=np.int64), counts)
    del counts  # (a block's temporaries are dropped as soon as done with: they set its peak)
    start = np.zeros(doc.size, dtype=np.int64)
    length = lengths[doc]
    if long.size:
        at = np.repeat(np.searchsorted(doc, long), parts)  # each long document's first piece
        within = np.arange(at.size, dtype=np.int64) - np.repeat(np.cumsum(parts) - parts, parts)
        at += within
        is_full = within < np.repeat(full, parts)
        start[at] = np.where(is_full, within * stride, np.repeat(full * stride, parts))
        length[at] = np.where(is_full, window, np.repeat(rest, parts))
    return Pieces(doc=doc, start=start, length=length)


def best_fit_decreasing(
    sizes: np.ndarray, capacity: int, max_items: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing of ``sizes`` (each in ``[1, capacity]``) into rows of ``capacity``.

    Returns ``(row_of_item, placement)``: the int64 row of each item (rows numbered in the order
    they were opened), and the item indices in the order they were placed (largest first).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    n = sizes.size
    if n and (int(sizes.min()) < 1 or int(sizes.max()) > capacity):
        raise ValueError(f"item sizes must lie in [1, {capacity}]")
    if max_items is not None and max_items < 1:
        raise ValueError(f"max_items must be >= 1, got {max_items}")
    if not n:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    # largest first, ties in block order; room left as uint16 when it fits: NumPy's stable sort
    # of 16-bit integers is a radix sort (5-6x faster than int64's at 2^20 items)
    if capacity < 1 << 16:  # written as uint16 directly: no int64 copy beside the sort's own
        key = np.subtract(capacity, sizes, out=np.empty(n, dtype=np.uint16), casting="unsafe")
    else:
        key = capacity - sizes
    placement = np.argsort(key, kind="stable")
    del key
    sorted_sizes = sizes[placement]
    bounds = np.flatnonzero(np.diff(sorted_sizes)) + 1  # where each size class starts
    class_starts = np.concatenate(([0], bounds)).tolist()
    class_ends = np.concatenate((bounds, [n])).tolist()
    class_sizes = sorted_sizes[class_starts].tolist()
    del sorted_sizes, bounds
    rooms = _Rooms(capacity, smallest=class_sizes[-1], max_items=max_items, rows=n)
    # the classes of more than half a row come first, and no row has room for them (each row
    # opened so far holds one item of a class at least as large: its room is below s), so each
    # of their items opens a row alone: placed all at once, each class's rows filed by room
    big = bisect.bisect_left([-s for s in class_sizes], -(capacity // 2))
    alone = class_ends[big - 1] if big else 0
    rooms.open_alone(class_sizes[:big], class_starts[:big], alone)
    # each class's rows and counts, in placement order: laid out once at the end
    touched: list[np.ndarray] = [np.arange(alone, dtype=np.int64)]
    got: list[np.ndarray] = [np.ones(alone, dtype=np.int64)]
    for s, lo, hi in zip(class_sizes[big:], class_starts[big:], class_ends[big:], strict=True):
        if max_items is None:
            rooms.place(s, hi - lo)  # its rows and counts kept by rooms (``placed``)
        else:
            rows, counts = rooms._place_capped(s, hi - lo)
            touched.append(rows)
            got.append(counts)
    if max_items is None:
        rows, counts = rooms.placed()
        touched.append(rows)
        got.append(counts)
    del rooms
    in_order = np.repeat(np.concatenate(touched), np.concatenate(got))
    del touched, got
    row_of = np.empty(n, dtype=np.int64)
    row_of[placement] = in_order
    return row_of, placement


class _Rooms:
    """Open rows by room left: bucket r holds the rows with r slots free, as sorted chunks of row
    numbers (sorted into one array when a size class next reads the bucket). The rooms whose
    bucket holds rows are kept sorted (``open``), so a size class finds the next one by a binary
    search, not by scanning every room (O(W) per class: most of a block's time at S = 8,192)."""

    def __init__(self, capacity: int, *, smallest: int, max_items: int | None, rows: int) -> None:
        self.capacity = capacity
        self.smallest = smallest  # a row with less room can take nothing more
        self.cap = max_items
        self.buckets: list[list[np.ndarray]] = [[] for _ in range(capacity + 1)]
        self.sizes = [0] * (capacity + 1)  # rows per bucket
        self.open: list[int] = []  # the rooms of the buckets that hold rows, rising
        self.count = np.zeros(rows, dtype=np.int64) if max_items is not None else None
        self.opened = 0
        self.rows_out: list[np.ndarray] = []  # place's rows, then its runs (placed): the
        self.runs = array.array("q")  # rows of each run, then what each takes and the last

    def _take(self, r: int) -> np.ndarray:
        chunks = self.buckets[r]
        return chunks[0] if len(chunks) == 1 else np.sort(np.concatenate(chunks))

    def _put(self, rows: np.ndarray, room: int) -> None:
        """File sorted ``rows`` under ``room`` (dropped when nothing fits there any more)."""
        if rows.size and room >= self.smallest:
            self._add(rows, room)

    def _add(self, rows: np.ndarray, room: int) -> None:
        if not self.sizes[room]:
            bisect.insort(self.open, room)
        self.buckets[room].append(rows)
        self.sizes[room] += rows.size

    def _keep(self, room: int, rest: np.ndarray) -> None:
        """Bucket ``room`` holds only ``rest`` now."""
        self.buckets[room] = [rest] if rest.size else []
        if not rest.size and self.sizes[room]:
            del self.open[bisect.bisect_left(self.open, room)]
        self.sizes[room] = rest.size

    def _after(self, room: int) -> int | None:
        """The smallest room above ``room`` whose bucket holds rows."""
        i = bisect.bisect_right(self.open, room)
        return self.open[i] if i < len(self.open) else None

    def open_alone(self, sizes: list[int], starts: list[int], items: int) -> None:
        """Open one row per item of the first classes (``sizes``, their first items ``starts``
        in placement order, ``items`` in all), each class's rows filed under its room."""
        if not items:
            return
        fresh = np.arange(items, dtype=np.int64)
        self.opened = items
        ends = [*starts[1:], items]
        if self.count is not None:
            self.count[:items] = 1
            if self.cap is not None and self.cap <= 1:
                return  # every row is closed
        for s, lo, hi in zip(sizes, starts, ends, strict=True):
            self._put(fresh[lo:hi], self.capacity - s)

    def place(self, s: int, left: int) -> None:
        """Place ``left`` items of size ``s`` (no cap on items per row): the rows that take them,
        in the order BFD visits them, and how many each takes are kept for ``placed``, as runs
        of rows that take ``per`` items each but the run's last, which takes ``last``."""
        rows_out, runs = self.rows_out, self.runs
        # the buckets from room s up: rows are filed back only below the bucket being read, so
        # walking up from each bucket read visits those that held rows when the class began
        at = self._after(s - 1) if left else None
        while at is not None:
            r = at
            rows = self._take(r)
            per = r // s  # every row of the bucket takes this many, but maybe the last
            if per * rows.size >= left:
                need = -(-left // per)
                use, rest = rows[:need], rows[need:]
                last = left - per * (need - 1)
                left = 0
            else:
                use, rest, last = rows, rows[:0], per
                left -= per * rows.size
            self._keep(r, rest)
            rows_out.append(use)
            runs.extend((use.size, per, last))
            if last == per:
                self._put(use, r - per * s)
            else:
                self._put(use[:-1], r - per * s)
                self._put(use[-1:], r - last * s)
            if not left:
                break
            at = self._after(r)
        if left:  # new rows, each taking as many of the class as fit
            per = self.capacity // s
            new = -(-left // per)
            fresh = np.arange(self.opened, self.opened + new, dtype=np.int64)
            last = left - per * (new - 1)
            self.opened += new
            rows_out.append(fresh)
            runs.extend((new, per, last))
            if last == per:
                self._put(fresh, self.capacity - per * s)
            else:
                self._put(fresh[:-1], self.capacity - per * s)
                self._put(fresh[-1:], self.capacity - last * s)

    def placed(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows ``place`` gave items to, in order, and how many each took."""
        if not self.runs:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        n, per, last = np.frombuffer(self.runs, dtype=np.int64).reshape(-1, 3).T
        counts = np.repeat(per, n)
        counts[np.cumsum(n) - 1] = last
        return np.concatenate(self.rows_out), counts

    def _place_capped(self, s: int, left: int) -> tuple[np.ndarray, np.ndarray]:
        """``place`` with a cap on items per row (rows of one bucket may take different counts)."""
        assert self.count is not None and self.cap is not None
        rows_out: list[np.ndarray] = []
        got_out: list[np.ndarray] = []
        rooms_out: list[int] = []
        at = self._after(s - 1)  # rows are filed back after the loop
        while at is not None:
            r = at
            at = self._after(r)
            rows = self._take(r)
            q = np.minimum(r // s, self.cap - self.count[rows])
            cum = np.cumsum(q)
            if int(cum[-1]) >= left:
                k = int(np.searchsorted(cum, left))  # the row where the class runs out
                use, q = rows[: k + 1], q[: k + 1]
                q[k] = left - (int(cum[k - 1]) if k else 0)
                rest = rows[k + 1 :]
                left = 0
            else:
                use, rest = rows, rows[:0]
                left -= int(cum[-1])
            self._keep(r, rest)
            rows_out.append(use)
            got_out.append(q)
            rooms_out.append(r)
            if not left:
                break
        if left:  # new rows, each taking as many of the class as fit
            per_row = min(self.capacity // s, self.cap)
            new = -(-left // per_row)
            fresh = np.arange(self.opened, self.opened + new, dtype=np.int64)
            got = np.full(new, per_row, dtype=np.int64)
            got[-1] = left - per_row * (new - 1)
            self.opened += new
            rows_out.append(fresh)
            got_out.append(got)
            rooms_out.append(self.capacity)
        touched = np.concatenate(rows_out) if len(rows_out) > 1 else rows_out[0]
        got = np.concatenate(got_out) if len(got_out) > 1 else got_out[0]
        room = np.repeat(np.array(rooms_out, dtype=np.int64), [a.size for a in rows_out])
        room -= got * s
        self.count[touched] += got
        live = (room >= self.smallest) & (self.count[touched] < self.cap)
        back, back_room = touched[live], room[live]
        if back.size:
            order = np.argsort(back_room, kind="stable")
            back, back_room = back[order], back_room[order]
            cuts = np.flatnonzero(np.diff(back_room)) + 1
            starts = np.concatenate(([0], cuts)).tolist()
            ends = np.concatenate((cuts, [back.size])).tolist()
            for a, b in zip(starts, ends, strict=True):
                d = int(back_room[a])
                chunk = back[a:b]
                if chunk.size > 1:
                    chunk = np.sort(chunk)
                self._add(chunk, d)
        return touched, got


def pack_block(
    lengths: np.ndarray,
    window: int,
    extra: int = 1,
    max_docs: int | None = None,
    row_order: Callable[[int], np.ndarray] | None = None,
) -> PackPlan:
    """The rows of one block of documents (``lengths``, in block order): module docstring.
    ``row_order``: given the number of rows, the row laid out at each place (a permutation):
    the plan's rows are then in that order instead of the order they were opened."""
    pieces = split_documents(lengths, window, extra)
    doc, start, length = pieces.doc, pieces.start, pieces.length
    del pieces  # each array dropped once laid out in row order (they set the block's peak)
    row_of, placement = best_fit_decreasing(length, window, max_docs)
    if row_order is not None and row_of.size:
        order_of_rows = row_order(int(row_of.max()) + 1)
        place = np.empty_like(order_of_rows)
        place[order_of_rows] = np.arange(order_of_rows.size, dtype=place.dtype)
        row_of = place[row_of]  # each piece's row, numbered by its place
        del place, order_of_rows
    per_row = np.bincount(row_of, minlength=int(row_of.max()) + 1 if row_of.size else 0)
    # rows in the order they were opened; each row's pieces in placement order: one sort of
    # unique keys (row, rank in placement), so any sort gives the same order and NumPy's SIMD
    # sort serves (4x faster than a lexsort of the two at 2^20 pieces)
    n = placement.size
    if n < 1 << 31:
        key = row_of[placement]
        del row_of
        key *= n
        key += np.arange(n, dtype=np.int64)
        key.sort()
        np.remainder(key, n, out=key)
        order = placement[key]
        del key
    else:  # keys would overflow
        rank = np.empty(n, dtype=np.int64)
        rank[placement] = np.arange(n, dtype=np.int64)
        order = np.lexsort((rank, row_of))
        del rank, row_of
    del placement
    offsets = np.zeros(per_row.size + 1, dtype=np.int64)
    np.cumsum(per_row, out=offsets[1:])
    piece_doc = doc[order]
    del doc
    piece_start = start[order]
    del start
    piece_length = length[order]
    del length, order
    lengths = np.asarray(lengths, dtype=np.int64)
    return PackPlan(
        window=int(window),
        row_offsets=offsets,
        piece_doc=piece_doc,
        piece_start=piece_start,
        piece_length=piece_length,
        cut_documents=int(np.count_nonzero(lengths > window)),
    )
