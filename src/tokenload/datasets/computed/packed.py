"""Packed rows of whole documents in the computed order (``packing="best-fit"``).

A source's split holds the documents (the token file's sequences) ``[begin, end)``. Epoch e puts
them in a keyed order (``WindowOrder`` over documents, keyed by the source and ``"packed"``),
cuts that order into blocks of ``block_documents`` documents, and packs each block by
``index.packing.pack_block`` (best-fit decreasing; a document of at most S + extra tokens is
never cut, a longer one is cut into full windows and a rest). The rows of a block are served in
a keyed order of their own; the source's rows are the blocks' rows, block after block, epoch
after epoch. So row c of the source depends on the data, the seed and S only: never on ranks,
micro-batch sizes or workers, and a state resumes anywhere as in the unpacked order.

**Startup is O(1).** Nothing is packed when the dataset is built. A block is packed when a row
of it is first read, in the process that reads it (~20 ms per block of 131,072 documents);
each process keeps the row counts of the blocks it has packed (one int each) and the plans of
the last few. Finding row c needs the row counts of every block before it: a resume at row c
packs the blocks before c once (their counts), which is the price of a plan made as rows are
read (about 2-4 s per million documents on this machine).

**Epoch sizes** vary a little between epochs (each epoch packs another order). The loader's
accounting uses an estimate of rows per epoch (``ceil(tokens / window)``) until a process has
packed a whole epoch; the rows served are exact either way.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ...arrays import from_end, sample_indices
from ...contract import Allocator
from ...index.packing import pack_block
from ...index.permutation import KeyedPermutation
from ...index.window_order import WindowOrder, source_seed
from ..contract_parts import OneSourceContract
from ..items import ItemConfig, finish_windows
from ..packed_rows import PackedRead, PieceLayout, piece_layout, read_rows
from .computed_blend import _Items
from .extents import Extent, OnExtent
from .shared_plans import PlanArrays, SharedPlans

__all__ = ["DEFAULT_BLOCK_DOCUMENTS", "ComputedPackedDataset", "PackedRows", "PlanPieces"]

DEFAULT_BLOCK_DOCUMENTS = 1 << 17
"""Documents packed together. Packing a block costs a fixed part of NumPy calls (a few per
token count of at most half a row) plus O(documents): at S = 2,048 on a web-text mix, ~20 ms for
131,072 documents (0.33 us per row; 0.67 with blocks of 65,536 before best-fit's later
speedups), with less padding (benchmarks/README.md, "Packing")."""

_ALL = np.logical_and.reduce
_KEPT_BLOCKS = 2
"""Packed blocks a process keeps per source: the one being read and the one before (a batch may
straddle them). A block of 131,072 web-text documents keeps ~3 MB (int32 pieces and their 2-byte
layout), so a blend of 100 sources keeps ~0.6 GB per process at most."""


@dataclass(frozen=True)
class PlanPieces:
    """The document pieces of some rows, flat, row after row."""

    first: np.ndarray
    """int64 index of each row's first piece (every row has one)."""
    sequence: np.ndarray
    """int64 sequence (document) of the token file per piece."""
    start: np.ndarray
    """int64 first token of the piece within its sequence."""
    length: np.ndarray
    """int64 tokens of the piece."""
    layout: PieceLayout | None = None
    """The pieces' places in their rows (``packed_rows.piece_layout``), as the block made them."""


@dataclass(frozen=True)
class _Block:
    offsets: np.ndarray  # CSR over the pieces, rows in serving order
    sequence: np.ndarray  # the pieces, as narrow as their values allow (_narrow)
    start: np.ndarray
    length: np.ndarray
    layout: PieceLayout  # made from offsets and length (not published: made again on reading)

    @classmethod
    def of(cls, arrays: PlanArrays, seq: int) -> _Block:
        return cls(*arrays, layout=piece_layout(arrays.offsets, arrays.length, seq))

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1

    def laid(self, at: slice | np.ndarray, rows: slice | np.ndarray) -> PieceLayout:
        """The layout of the pieces ``at``, which are those of the rows ``rows``."""
        lay = self.layout
        return PieceLayout(lay.slot[at], lay.inputs[at], lay.documents[rows])

    def columns(self, at: slice | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The sequence, start and length of the pieces ``at``, as int64."""
        return (
            self.sequence[at].astype(np.int64),
            self.start[at].astype(np.int64),
            self.length[at].astype(np.int64),
        )


class PackedRows:
    """Rows of one source's split, in the order the packed source serves them (module
    docstring). Pickles as its parameters: the plans are made again in each process."""

    def __init__(
        self,
        extent: Extent,
        lengths: Any,
        *,
        seed: int,
        sequence_length: int,
        extra: int,
        block_documents: int = DEFAULT_BLOCK_DOCUMENTS,
        max_documents: int | None = None,
    ) -> None:
        self.extent = extent
        self._lengths = lengths  # a callable: sequence ids -> their token counts
        self.seed = source_seed(int(seed), f"{extent.identity}|packed")
        self.sequence_length = int(sequence_length)
        self.extra = int(extra)
        self.window = self.sequence_length + self.extra
        self.block_documents = int(block_documents)
        self.max_documents = max_documents
        self.num_documents = extent.end - extent.begin
        self._reset()

    def _reset(self) -> None:
        self._ends: dict[int, list[int]] = {}  # epoch -> cumulative rows of its packed blocks
        self._blocks: OrderedDict[tuple[int, int], _Block] = OrderedDict()
        self._order: WindowOrder | None = None
        self._last: tuple[int, int, int, int] | None = None  # (first row, rows, epoch, block)
        self._shared: SharedPlans | None = None  # the loader's workers' (share)
        self._tag = ""  # this source's name among those sharing the folder (share)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_ends", "_blocks", "_order", "_last", "_shared", "_tag"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    @property
    def num_blocks(self) -> int:
        return -(-self.num_documents // self.block_documents)

    @property
    def estimated_rows(self) -> int:
        """Rows per epoch, estimated (packing leaves well under 1% of a row empty on average)."""
        return -(-self.extent.grid.num_tokens // self.window)  # 0 only for a split of 0 tokens

    def epoch_rows(self, epoch: int) -> int | None:
        """Rows of epoch ``epoch`` when this process has packed all of it, else None."""
        ends = self._ends.get(epoch, [])
        return ends[-1] if ends and len(ends) == self.num_blocks else None

    def _documents(self, epoch: int, block: int) -> np.ndarray:
        """Sequence ids of a block of epoch ``epoch``'s document order."""
        if self._order is None:
            self._order = WindowOrder(self.num_documents, self.seed)
        lo = block * self.block_documents
        hi = min(lo + self.block_documents, self.num_documents)
        positions = np.arange(lo, hi, dtype=np.int64)
        return self._order.epoch_windows(positions, epoch) + self.extent.begin

    def share(self, folder: str | None, tag: str = "") -> None:
        """Read and publish packed blocks in ``folder``, shared with the other processes given
        it (a loader's workers: ``shared_plans``); None: pack alone. ``tag`` names this source
        among the others that share the folder (a blend's member: its place in the blend)."""
        self._shared = None if folder is None else SharedPlans(folder)
        self._tag = tag

    def _plan_key(self, epoch: int, block: int) -> str:
        """What names a block among every plan a loader's workers may share: the source (its
        tag in the loader's dataset, and its seed, keyed by the split's identity: two files
        whose sampled identities agree still differ by their tags), the packing's parameters
        and the block."""
        return (
            f"{self._tag}|{self.seed}|{self.window}|{self.extra}|{self.block_documents}|"
            f"{self.max_documents}|{self.num_documents}|{epoch}|{block}"
        )

    def _note_rows(self, epoch: int, block: int, rows: int) -> None:
        ends = self._ends.setdefault(epoch, [])
        if block == len(ends):
            ends.append((ends[-1] if ends else 0) + rows)

    def _rows_of(self, epoch: int, block: int) -> int:
        """Rows of a block: from a block this process holds, else as published by another
        process, else packed here."""
        held = self._blocks.get((epoch, block))
        if held is not None:
            return held.rows
        if self._shared is not None:
            rows = self._shared.rows(self._plan_key(epoch, block))
            if rows is not None:
                self._note_rows(epoch, block, rows)
                return rows
        return self._block(epoch, block).rows

    def _block(self, epoch: int, block: int) -> _Block:
        key = (epoch, block)
        found = self._blocks.get(key)
        if found is not None:
            self._blocks.move_to_end(key)
            return found
        if self._shared is None:
            found = self._pack(epoch, block)
        else:
            found = self._shared_block(epoch, block)
        self._hold(epoch, block, found)
        return found

    def _hold(self, epoch: int, block: int, found: _Block) -> None:
        self._note_rows(epoch, block, found.rows)
        self._blocks[(epoch, block)] = found
        if len(self._blocks) > _KEPT_BLOCKS:
            self._blocks.popitem(last=False)

    def _shared_block(self, epoch: int, block: int) -> _Block:
        """A block from the plans the loader's workers share: as published, else packed here
        under its lock (waiting while another process packs it) and published."""
        shared = self._shared
        assert shared is not None
        name = self._plan_key(epoch, block)
        found = None
        loaded = shared.load(name)
        if loaded is None:
            lock = shared.claim(name)  # another worker may be packing it: wait for it
            try:
                loaded = shared.load(name)
                if loaded is None:
                    found = self._pack(epoch, block)
                    shared.store(
                        name, PlanArrays(found.offsets, found.sequence, found.start, found.length)
                    )
            finally:
                shared.release(lock)
        if loaded is not None:
            found = _Block.of(loaded, self.sequence_length)
        behind = epoch * self.num_blocks + block - 2  # blocks count on across epochs
        if behind >= 0:  # every worker has moved past it
            shared.drop(self._plan_key(*divmod(behind, self.num_blocks)))
        assert found is not None
        return found

    def _pack(self, epoch: int, block: int) -> _Block:
        sequences = self._documents(epoch, block)
        lengths = np.asarray(self._lengths(sequences), dtype=np.int64)
        key = epoch * self.num_blocks + block

        def keyed(rows: int) -> np.ndarray:  # the rows of the block in a keyed order of their own
            return KeyedPermutation(rows, self.seed, key)(np.arange(rows, dtype=np.int64))

        plan = pack_block(lengths, self.window, self.extra, self.max_documents, row_order=keyed)
        arrays = PlanArrays(
            offsets=_narrow(plan.row_offsets),
            sequence=_narrow(sequences[plan.piece_doc]),
            start=_narrow(plan.piece_start),
            length=_narrow(plan.piece_length),
        )
        return _Block.of(arrays, self.sequence_length)

    def locate(self, row: int) -> tuple[int, int, int]:
        """(epoch, block, row within the block) of the source's row ``row`` (all epochs): the
        blocks before it are packed once per process (their row counts are kept)."""
        if row < 0:
            raise IndexError("rows must be >= 0")
        if self.extent.grid.num_tokens == 0:  # no row in any epoch: nothing to search for
            raise IndexError("the split holds no token")
        epoch, left = 0, int(row)
        while True:
            ends = self._ends.setdefault(epoch, [])
            while (not ends or ends[-1] <= left) and len(ends) < self.num_blocks:
                self._rows_of(epoch, len(ends))  # counts the next block
            if ends[-1] > left:
                block = bisect.bisect_right(ends, left)
                return epoch, block, left - (ends[block - 1] if block else 0)
            left -= ends[-1]
            epoch += 1

    def document_rows(self, sequence: int, drawn: int) -> np.ndarray:
        """Sorted int64 rows of the source (below ``drawn``) whose inputs hold a token of
        ``sequence``: its place in each epoch's document order (the keyed order's inverse), the
        rows of that block holding it, the blocks before it counted once (``locate``)."""
        doc = int(sequence) - self.extent.begin
        if not 0 <= doc < self.num_documents or drawn <= 0:
            return np.zeros(0, dtype=np.int64)
        if self._order is None:
            self._order = WindowOrder(self.num_documents, self.seed)
        found: list[np.ndarray] = []
        epoch, base = 0, 0
        while base < drawn:
            position = int(self._order.epoch_positions(np.array([doc]), np.array([epoch]))[0])
            block = position // self.block_documents
            ends = self._ends.setdefault(epoch, [])
            while len(ends) <= block:
                self._rows_of(epoch, len(ends))
            b = self._block(epoch, block)
            hits = np.flatnonzero(b.sequence == int(sequence))
            rows = np.searchsorted(b.offsets, hits, side="right") - 1
            before = np.cumsum(b.length, dtype=np.int64) - b.length  # tokens ahead, all rows
            slot = before[hits] - before[b.offsets[rows]]
            rows = rows[slot < self.sequence_length]  # a token of it among the row's inputs
            found.append(base + (ends[block - 1] if block else 0) + rows)
            total = self.epoch_rows(epoch)
            if total is None:  # the epoch's end: only when the draws may reach past it
                if base + ends[-1] >= drawn:
                    break
                while len(ends) < self.num_blocks:
                    self._rows_of(epoch, len(ends))
                total = ends[-1]
            base += total
            epoch += 1
        out = np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
        return out[out < drawn]

    def pieces(self, rows: npt.ArrayLike) -> PlanPieces:
        """The pieces of the source's ``rows`` (any order, repeats allowed)."""
        wanted = np.asarray(rows, dtype=np.int64).ravel()
        if wanted.size:  # nearly every batch: its rows in one block, gathered at once
            low = int(wanted.min())
            last = self._last
            if last is not None and 0 <= low - last[0] < last[1]:  # the block read last
                first_row, _, epoch, block = last
            else:
                epoch, block, k = self.locate(low)
                first_row = low - k
            b = self._block(epoch, block)
            self._last = (first_row, b.rows, epoch, block)
            within = wanted - first_row
            top = int(within.max())
            n = within.size
            if (
                top < b.rows
                and top - int(within[0]) == n - 1
                and bool(_ALL(within[1:] > within[:-1]))
            ):
                # consecutive rows (a micro-batch of one source): their pieces are one slice
                lo, hi = int(b.offsets[top - n + 1]), int(b.offsets[top + 1])
                first = b.offsets[top - n + 1 : top + 1] - np.int64(lo)
                span = slice(lo, hi)
                rows_at = slice(top - n + 1, top + 1)
                return PlanPieces(first, *b.columns(span), layout=b.laid(span, rows_at))
            if top < b.rows:
                lows = b.offsets[within].astype(np.int64)
                counts = b.offsets[within + 1] - lows
                first = np.cumsum(counts) - counts
                at = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(lows - first, counts)
                return PlanPieces(first, *b.columns(at), layout=b.laid(at, within))
        # rows in rising order, so that each block is packed once however the rows are spread
        parts: list[tuple[np.ndarray, ...]] = [()] * wanted.size
        laid: list[PieceLayout] = [self._no_layout] * wanted.size
        counts = np.empty(wanted.size, dtype=np.int64)
        cache: dict[int, tuple[int, int, int]] = {}
        for i in np.argsort(wanted, kind="stable").tolist():
            r = int(wanted[i])
            where = cache.get(r)
            if where is None:
                where = cache[r] = self.locate(r)
            epoch, block, k = where
            b = self._block(epoch, block)
            lo, hi = int(b.offsets[k]), int(b.offsets[k + 1])
            parts[i] = b.columns(slice(lo, hi))
            laid[i] = b.laid(slice(lo, hi), slice(k, k + 1))
            counts[i] = hi - lo
        first = np.zeros(wanted.size, dtype=np.int64)
        if wanted.size:
            np.cumsum(counts[:-1], out=first[1:])
        if not parts:
            empty = np.empty(0, dtype=np.int64)
            return PlanPieces(first, empty, empty, empty, layout=self._no_layout)
        sequence, start, length = (np.concatenate(column) for column in zip(*parts))
        layout = PieceLayout(*(np.concatenate(column) for column in zip(*laid)))
        return PlanPieces(first, sequence, start, length, layout=layout)

    @property
    def _no_layout(self) -> PieceLayout:
        """The layout of no row."""
        return piece_layout(np.zeros(1, dtype=np.int64), np.zeros(0), self.sequence_length)


def _narrow(values: np.ndarray) -> np.ndarray:
    """int32 when every value fits (nearly always: sequence ids, tokens within a document),
    else int64."""
    if not values.size or (int(values.max()) < 1 << 31 and int(values.min()) >= -(1 << 31)):
        return values.astype(np.int32)
    return values.astype(np.int64, copy=False)


def packed_fingerprint(base: str, rows: PackedRows) -> str:
    text = f"{base}|packed|best-fit|{rows.block_documents}|{rows.max_documents}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ComputedPackedDataset(OnExtent, _Items, OneSourceContract):
    """Packed rows of one split of one token file (or of the mock source) in the computed order:
    sample k is the source's row k (module docstring)."""

    packed = True

    def __init__(
        self,
        source: Any,
        extent: Extent,
        item: ItemConfig,
        *,
        seed: int,
        length: int | None,
        block_documents: int = DEFAULT_BLOCK_DOCUMENTS,
        max_documents: int | None = None,
        startup_phases: dict[str, float] | None = None,
    ) -> None:
        self.source = source
        self.extent = extent
        self.item = item
        self.seed = int(seed)
        self.rows = PackedRows(
            extent,
            _Lengths(source),
            seed=seed,
            sequence_length=item.sequence_length,
            extra=item.extra,
            block_documents=block_documents,
            max_documents=max_documents,
        )
        self._length = length
        self.startup_phases = startup_phases or {}

    @property
    def samples_per_epoch(self) -> int:
        """Rows of the first epoch when this process has packed it all, else the estimate."""
        return self.rows.epoch_rows(0) or self.rows.estimated_rows

    def __len__(self) -> int:
        if self._length is None and self.extent.grid.num_tokens == 0:
            self._length = 0  # no document, or only empty ones: no row
        if self._length is None:  # one epoch: every block of epoch 0 packed once
            self.rows.locate(0)
            while self.rows.epoch_rows(0) is None:
                done = self.rows._ends[0]
                self.rows.locate(done[-1])
            self._length = int(self.rows.epoch_rows(0) or 0)
        return self._length

    @property
    def fingerprint(self) -> str:
        base = f"computed|{self.identity}|{self.seed}|{self.item!r}"
        return packed_fingerprint(base, self.rows)

    def share_plans(self, folder: str | None, tag: str = "") -> None:
        """Share packed blocks with the other processes given ``folder`` (``shared_plans``: a
        loader's workers); None: pack alone. ``tag``: this source's name in a blend."""
        self.rows.share(folder, tag)

    def read_rows(self, rows: np.ndarray) -> PackedRead:
        """The windows, token counts and boundaries of the source's rows (a blend's cursors)."""
        p = self.rows.pieces(rows)
        return read_rows(self.source, self.item, p.first, p.sequence, p.start, p.length, p.layout)

    def read_batch(self, indices: npt.ArrayLike) -> dict[str, Any]:
        idx, _ = from_end(sample_indices(indices), len(self))
        return self.read_rows(idx).batch(self.item.sequence_length)

    def finish_batch(
        self, batch: dict[str, Any], alloc: Allocator | None = None
    ) -> dict[str, np.ndarray]:
        return finish_windows(batch, self.item, alloc)

    def plan_pieces(self, indices: npt.ArrayLike) -> PlanPieces:
        """The document pieces each sample's row holds, as the plan lays them (the last may
        reach into the extra label slot)."""
        return self.rows.pieces(sample_indices(indices))

    def sample_pieces(self, indices: npt.ArrayLike) -> Any:
        """The pieces of each row's ``tokens`` (``contract.PieceSource``, for provenance)."""
        from ..pieces import input_pieces

        p = self.plan_pieces(indices)
        width = self.item.sequence_length
        return input_pieces(p.sequence, p.first, p.length, None, width, starts=p.start)

    def samples_of(self, source: int, document: int) -> np.ndarray:
        """``contract.DocumentSamples``: the samples (rows) whose inputs hold a token of
        ``document`` (``PackedRows.document_rows``)."""
        if source != 0:
            return np.zeros(0, dtype=np.int64)
        return self.rows.document_rows(document, len(self))

    def epoch_sizes(self) -> list[int]:
        return [self.samples_per_epoch]


class _Lengths:
    """Token counts of sequences, read from the source when first needed (pickles as the
    source)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __call__(self, sequences: np.ndarray) -> np.ndarray:
        lengths: np.ndarray = np.asarray(self.source.sequence_lengths)[sequences]
        return lengths
