"""Packed rows of whole documents in the Megatron order (``packing="best-fit"``).

The documents come in Megatron's own document order: the epochs Megatron's plan gives for the
request (``index.epochs``) and its shuffled document index (``index.document``, the same
``RandomState`` draws as ``GPTDataset``). Consecutive blocks of ``PACK_BLOCK`` entries of that
index are packed by ``index.packing.pack_block`` (best-fit decreasing; a document of at most
S + extra tokens is never cut), and each block's rows are laid out in a random order drawn from
the same generator, continued (``RandomState.permutation``, block after block). Sample k is row
k: the rows are served in the order the plan lays them out, so a micro-batch of consecutive
samples reads one run of each plan array. The document index is shuffled over the whole split,
so each block's documents are a uniform draw of them and its rows as mixed as a global shuffle
of rows would make them; what stays together is a cut document's pieces, served among its
block's rows (at S = 2,048 about 300,000 rows for a web-text mix), as in the computed order.
When Megatron's plan has a separate final epoch (the request takes less than 80% of the last
epoch), that epoch's documents are packed into blocks and rows of their own, served last, as
Megatron serves its samples (with two epochs: every piece once before any repeats). When
packing leaves fewer rows than the request (rows hold whole documents, so a few more tokens per
row go unused than with concatenation), one more epoch is planned, by the same 80% rule on the
rows the epochs gave, and everything is built again: the plan depends on the data, the seed, S
and the request only, never on ranks, micro-batches or workers.

The plan is an index cache like Megatron's (``PackedGPTDataset`` caches, beside them under the
same folder rules, never read by Megatron), 6 bytes per piece (layout ``PLAN_LAYOUT``):

* ``row_index``: rows + 1 offsets (int32, int64 past 2^31 - 1 pieces): row r holds pieces
  ``row_index[r]..row_index[r + 1]``;
* ``piece_index``: int32 per piece, its sequence s;
* ``piece_part``: uint16 per piece (uint32 when a sequence of the split has 2^16 windows of S
  tokens or more), its number k in s: it starts at token k * S (0 for a whole document; a cut
  document's full windows are k = 0..m - 1 and its rest k = m, m = (L - extra) // S). Its length
  follows from the sequence's length L: ``min(W, L - k * S)`` with W = S + extra (a full window
  has W tokens or more from its start on; a last piece, whole or a rest, fewer).

A read of consecutive samples slices the plan's arrays and looks the pieces' sequences up once
in the token file's lengths, which the check that each piece lies within its sequence needs
anyway. The earlier layout (4 bytes per piece, rows in packing order with a ``shuffle_index``)
named a cut document's full windows through a table of their own, made every start from the
length and gathered every row at random: the loader's first pass cost ~13 us more per
micro-batch of 16 rows (benchmarks/README.md).

It is built, written, loaded, checked and listed in the build manifest by the same build
policies as the concatenated order's caches, so ``tokenload prepare-cache --packing best-fit``
prepares it and ``build_policy="none"`` loads it. Every value is range-checked as batches use
it. The build holds the plan and one block's packing at its peak: each plan array is sized first
and filled in place, the document index is drawn in the end of ``piece_index``'s buffer and read
from there as the pieces fill it from its start (``_pack``), and the split's document ids are an
array only while the document index is drawn.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ...arrays import from_end, sample_indices
from ...caches import describe, description_hash, gpt_identifiers
from ...contract import Allocator
from ...errors import CacheError
from ...index import split_range
from ...index.document import build_document_index, tokens_per_epoch
from ...index.epochs import SEPARATE_THRESHOLD, plan_epochs
from ...index.gpt import seeded_random_state
from ...index.packing import pack_block
from ...index.plan import MidLevelPlan
from ...index.splits import SplitMatrix
from ..contract_parts import OneSourceContract
from ..items import ItemConfig, finish_windows, upto
from ..packed_rows import read_rows
from ..sources import FactsGuard
from .built import built_member, default_folder, placeless
from .gpt_dataset import IndexArrays

__all__ = ["PACK_BLOCK", "PackedGPTDataset", "build_packed_indices", "packed_member"]

PACK_BLOCK = 1 << 20
"""Entries of the document index packed together: a block of 2^20 documents packs in about a
second on this machine, with ~0.001% padding at S = 2,048 on a web-text mix."""

PLAN_LAYOUT = "sequence+part, rows served in order, shuffled per block"
"""The plan's arrays as the module docstring lays them out (in the cache's identity: a plan of
another layout, such as the earlier ``last-piece+windows`` with a ``shuffle_index``, is never
read as this)."""

EPOCH_RULE = "final-epoch-apart"
"""How the plan treats Megatron's separate final epoch (in the cache's identity): its documents
packed into rows of their own and served last. Plans made before this rule mixed
the final epoch's rows with the others (a piece could repeat before every piece was served) and
are never read as plans of this rule."""

PLAN_IDENTITY = (PLAN_LAYOUT, EPOCH_RULE, PACK_BLOCK)
"""What of the plan's making the code decides (in the build manifest's key too: a manifest of a
plan made another way is never found for this one)."""

_MIN, _MAX, _ALL = np.minimum.reduce, np.maximum.reduce, np.logical_and.reduce
_INT32_MAX = int(np.iinfo(np.int32).max)
_ROW_AND_NEXT = np.array([0, 1], dtype=np.int64)


def build_packed_indices(
    sequence_lengths: np.ndarray,
    documents: npt.ArrayLike | range,
    *,
    num_samples: int | None,
    sequence_length: int,
    extra: int,
    seed: int,
    max_documents: int | None = None,
    block: int = PACK_BLOCK,
) -> dict[str, np.ndarray]:
    """The packed plan of one split (module docstring): ``row_index``, ``piece_index`` and
    ``piece_part``, its rows in the order they are served. ``documents``: the split's sequence
    ids, an array or a ``range`` (made into an array only while the document index is drawn,
    then dropped: at 100M documents, 400 MB the packing does not hold)."""
    lengths = np.asarray(sequence_lengths)
    ids: np.ndarray | range
    if isinstance(documents, range) and documents.step == 1:
        ids = documents
    else:
        ids = np.asarray(documents)
    if isinstance(ids, range):  # one run of ids: summed in place
        tokens = int(np.sum(lengths[ids.start : ids.stop], dtype=np.int64))
    else:
        tokens = tokens_per_epoch(lengths, ids)
    epochs = plan_epochs(
        tokens_per_epoch=tokens,
        num_samples=num_samples,
        sequence_length=sequence_length,
        extra=extra if tokens or num_samples else 0,  # an empty split asked for no row: none
    )
    num_epochs, separate = epochs.num_epochs, epochs.separate_final_epoch
    window = sequence_length + extra
    while True:
        rng = seeded_random_state(seed)
        entries = num_epochs * len(ids)
        total, empty, longest = _piece_totals(lengths, ids, num_epochs, window, extra, block)
        # the pieces' buffer holds the document index at its end while the pieces fill it from
        # its start (``_pack``): no more than its pieces plus its empty documents' entries
        buffer = np.empty(total + empty, dtype=np.int32)
        docs = np.arange(ids.start, ids.stop, dtype=np.int32) if isinstance(ids, range) else ids
        build_document_index(docs, num_epochs, rng, separate, out=buffer[buffer.size - entries :])
        del docs
        # a separate final epoch is packed apart: no row mixes its documents with earlier ones
        final = (num_epochs - 1) * len(ids) if separate and num_epochs > 1 else entries
        parts = np.uint16 if (longest - extra) // sequence_length < 1 << 16 else np.uint32
        plan = _pack(
            lengths, buffer, entries, total, window, extra, max_documents, block, final, parts, rng
        )
        del buffer  # the plan's piece_index now (the document index is done with)
        rows = plan["row_index"].size - 1
        if num_samples is None or rows >= num_samples:
            break
        del plan
        # Megatron's 80% rule on the rows this many epochs gave: the epoch added is separate
        # when the request takes less than 80% of an epoch's rows from it
        per_epoch = rows // num_epochs
        num_epochs += 1
        separate = num_samples - rows < int(SEPARATE_THRESHOLD * per_epoch)
    return plan


def _piece_totals(
    lengths: np.ndarray,
    documents: np.ndarray | range,
    epochs: int,
    window: int,
    extra: int,
    block: int,
) -> tuple[int, int, int]:
    """Pieces of ``epochs`` epochs of ``documents`` (each document's pieces follow from its
    length: ``_piece_count``), their entries of empty documents (no piece), and the longest
    document's tokens."""
    total = empty = longest = 0
    for lo in range(0, len(documents), block):
        if isinstance(documents, range):  # one run of ids: a slice, no gather
            ids = documents[lo : lo + block]
            some = lengths[ids.start : ids.stop]
        else:
            some = lengths[documents[lo : lo + block]]
        total += epochs * _piece_count(some, window, extra)
        empty += epochs * (some.size - int(np.count_nonzero(some)))
        longest = max(longest, int(some.max()))
    return total, empty, longest


def _pack(
    lengths: np.ndarray,
    buffer: np.ndarray,
    entries: int,
    total: int,
    window: int,
    extra: int,
    max_documents: int | None,
    block: int,
    final: int,
    parts: type[np.unsignedinteger[Any]] = np.uint16,
    rng: np.random.RandomState | None = None,
) -> dict[str, np.ndarray]:
    """``row_index``, ``piece_index`` and ``piece_part`` (of dtype ``parts``) of the document
    index held in the last ``entries`` places of ``buffer`` (int32, ``total`` pieces plus the
    index's empty documents), packed block by block (module docstring; no block spans ``final``,
    a separate final epoch's first entry), each block's rows laid out in an order drawn from
    ``rng`` (``RandomState.permutation``; None: as they were opened).

    The pieces are written over ``buffer`` from its start, the document index being read from
    its end: a block's entries are copied before its pieces are written, and the pieces written
    never reach an entry not yet read (every entry of a non-empty document gives a piece at
    least, and the buffer has a place more per empty one). So the document index costs no
    memory of its own, and each array is sized first and filled in place: the plan exists once
    at the peak, never as parts plus their concatenation."""
    numbers = np.empty(total, dtype=parts)
    stride = window - extra
    # rows <= pieces: sized for every piece in its own row; the pages past the last row are
    # never written (never resident), then cut off in place
    offsets = np.empty(total + 1, dtype=np.int32 if total <= _INT32_MAX else np.int64)
    offsets[0] = 0
    head = buffer.size - entries  # where the document index begins in the buffer
    base = rows = 0
    order = None if rng is None else rng.permutation
    spans = [(lo, min(lo + block, final)) for lo in range(0, final, block)]
    spans += [(lo, min(lo + block, entries)) for lo in range(final, entries, block)]
    for lo, hi in spans:
        sequences = buffer[head + lo : head + hi].copy()  # read before pieces overwrite them
        sizes = lengths[sequences].astype(np.int64)
        plan = pack_block(sizes, window, extra, max_documents, row_order=order)
        count = plan.piece_doc.size
        assert base + count <= head + hi  # never past the entries still to read
        np.take(sequences, plan.piece_doc, out=buffer[base : base + count])
        np.floor_divide(
            plan.piece_start, stride, out=numbers[base : base + count], casting="unsafe"
        )
        offsets[rows + 1 : rows + 1 + plan.num_rows] = plan.row_offsets[1:] + base
        rows += plan.num_rows
        base += count
        del plan, sizes, sequences
    assert base == total  # split_documents' count, and _piece_count's
    if buffer.size > total:  # empty documents' places: cut off in place (no view of it is left)
        buffer.resize(total, refcheck=False)
    offsets.resize(rows + 1, refcheck=False)  # in place: nothing else refers to it
    return {"row_index": offsets, "piece_index": buffer, "piece_part": numbers}


def _unchecked(arrays: dict[str, np.ndarray]) -> list[str]:
    """Why a packed plan found without its sidecar is never used: only tokenload writes these
    caches, always with a sidecar of digests, and the plan cannot be checked otherwise (a flipped
    bit in a row's pieces is still a valid-looking row); the cache is then stale."""
    return [
        f"a packed plan ({', '.join(sorted(arrays))}) is used only with the tokenload sidecar"
        " written with it, whose digests are the only check of its values"
    ]


def _rows_per_epoch(
    lengths: np.ndarray, rows: int, shapes: dict[str, tuple[int, ...]], seq: int, extra: int
) -> int:
    """Rows of one epoch of the split whose documents have ``lengths``: the plan's rows over its
    epochs (it holds every piece of an epoch once per epoch; exact for one epoch), else (no
    plan in this process yet) the tokens over a row's slots."""
    window = seq + extra
    pieces = shapes["piece_index"][0] if "piece_index" in shapes else 0
    # by blocks: a mask of a 100M-document split's lengths would cost 100 MB at the build's peak
    per_epoch = _piece_totals(lengths, range(lengths.size), 1, window, extra, PACK_BLOCK)[0]
    if rows and pieces and per_epoch:
        return max(1, rows // max(1, pieces // per_epoch))
    tokens = int(np.sum(lengths, dtype=np.int64))
    return max(1, -(-tokens // window))


def _piece_count(lengths: np.ndarray, window: int, extra: int) -> int:
    """Pieces of documents of these lengths (``index.packing.split_documents``' rule): full
    windows and a rest for each longer than the window, one for each other non-empty one."""
    stride = window - extra
    n = lengths[lengths > window].astype(np.int64)  # the long ones (a few): pieces apart
    full = (n - extra) // stride
    keep = n - full * stride > extra
    return int(np.count_nonzero(lengths)) - n.size + int(full.sum()) + int(np.count_nonzero(keep))


class _Rows(NamedTuple):
    """Rows decoded from the plan (``PackedGPTDataset._rows``), their pieces flat, row after row
    (int64, but ``sequence``: the plan's int32 viewed as uint32)."""

    first: np.ndarray
    """Each row's first piece."""
    counts: np.ndarray
    """Each row's pieces."""
    ends: np.ndarray
    """Each row's first piece past its own (``first + counts``)."""
    sequence: np.ndarray
    start: np.ndarray
    length: np.ndarray
    tokens: np.ndarray
    """Each row's tokens."""


class PackedGPTDataset(OneSourceContract):
    """Packed rows of one split of one token file in the Megatron order: sample k is row k of
    the plan (module docstring)."""

    packed = True

    def __init__(
        self,
        source: Any,
        indices: IndexArrays,
        item: ItemConfig,
        *,
        identity: str,
        length: int,
        samples_per_epoch: int,
        file_facts: dict[str, Any] | None = None,
    ) -> None:
        self.source = source
        self.indices = indices
        self.item = item
        self.identity = identity
        self._length = int(length)
        self.samples_per_epoch = int(samples_per_epoch)
        self.startup_phases: dict[str, float] = {}
        self._facts = FactsGuard(source, file_facts)  # a manifest load's: checked on first use

    def _arrays(self) -> dict[str, np.ndarray]:
        """The plan's arrays, after the token file's recorded facts are checked in this
        process (a plan made from other documents serves none of them right)."""
        self._facts.check()
        return self.indices.arrays()

    def __len__(self) -> int:
        return self._length

    @property
    def fingerprint(self) -> str:
        text = f"{self.identity}|{self.item!r}|packed"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def plan_pieces(self, indices: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's pieces: ``(first, pieces)``, the flat index of each sample's first
        piece and the ``(sequence, start, length)`` of each piece (int64, pieces x 3, from
        ``piece_index`` and ``piece_part``), every value checked (a damaged plan is a
        ``CacheError`` naming its file)."""
        rows = self._rows(indices)
        return rows.first, np.array((rows.sequence, rows.start, rows.length), dtype=np.int64).T

    def _rows(self, indices: npt.ArrayLike) -> _Rows:
        """The pieces of the rows of samples ``indices`` (sample k is row k), decoded from the
        plan, every value checked (a damaged plan is a ``CacheError`` naming its array). It runs
        per read on a few dozen rows, so it makes as few NumPy calls as the checks allow (each
        costs about a microsecond here, whatever its size): consecutive samples (a micro-batch)
        read one run of each array; other samples are gathered, and out-of-range numbers fail
        the lookups themselves (a row past the plan, a sequence past the file's)."""
        arrays = self._arrays()
        offsets, table = arrays["row_index"], arrays["piece_index"]
        run = _run(indices, len(self))
        if run is not None:
            bounds = offsets[run[0] : run[1] + 1]
            if bounds.size != run[1] - run[0] + 1:  # fewer offsets than the plan's rows
                raise self._bad_offsets(table)
            lo = int(bounds[0])
            within = np.subtract(bounds, lo, dtype=np.int64)  # each row's pieces from lo
            first, ends = within[:-1], within[1:]
            counts = ends - first
            total = int(ends[-1])
            at: slice | np.ndarray | None = slice(lo, lo + total)
        else:
            idx, _ = from_end(sample_indices(indices), len(self))
            try:  # (B, 2) in one lookup: a row past the offsets fails it
                both = offsets[idx[:, None] + _ROW_AND_NEXT]
            except IndexError:
                raise self._bad_offsets(table) from None
            lo = int(_MIN(both[:, 0])) if idx.size else 0
            counts = both[:, 1] - both[:, 0]  # (the offsets' dtype, which damage may wrap)
            ends = counts.cumsum()  # int64
            total = int(ends[-1]) if ends.size else 0
            first = ends - counts
            at = None  # made once the counts are checked
        # a row holds at most W pieces (each of a token or more): bounded before the positions
        # of the pieces are allocated, so damaged offsets never make a huge array; a slice
        # past the pieces would stop at their end: checked too
        if counts.size and (
            _MIN(counts) < 1
            or lo < 0
            or total > counts.size * self.item.window
            or (run is not None and lo + total > table.size)
        ):
            raise self._bad_offsets(table)
        if at is None:
            at = upto(total) + (both[:, 0] - first).repeat(counts)
        try:  # offsets past the pieces fail it
            seq = table[at].view(np.uint32)  # a negative sequence: past the file's, refused
        except IndexError:
            raise self._bad_offsets(table) from None
        start, n = self._pieces(seq, arrays["piece_part"][at])
        tokens = np.add.reduceat(n, first) if n.size else first
        if n.size and _MAX(tokens) > self.item.window:
            raise self._damaged("piece_index")
        return _Rows(first, counts, ends, seq, start, n, tokens)

    def _bad_offsets(self, table: np.ndarray) -> CacheError:
        return self.indices.corrupt(
            "row_index",
            "a row without pieces or offsets past the pieces",
            f"increasing offsets within 0..{len(table)}",
        )

    def _pieces(self, seq: np.ndarray, part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The int64 start and length of pieces ``part`` of sequences ``seq`` (module docstring:
        ``k * S`` and ``min(W, L - k * S)``), each checked to lie within its sequence (a part
        past its end, or an empty sequence, is a ``CacheError``; that a part is one the plan
        made is its digest's to vouch for, verified before first use)."""
        start = np.multiply(part, self.item.sequence_length, dtype=np.int64)
        try:
            n = self.source.sequence_lengths[seq] - start
        except IndexError:
            raise self._damaged("piece_index") from None
        np.minimum(n, self.item.window, out=n)
        if n.size and _MIN(n) < 1:
            at = int(np.argmin(n))
            empty = self.source.sequence_lengths[seq[at]] == 0
            raise self._damaged("piece_index" if empty else "piece_part")
        return start, n

    def _damaged(self, name: str) -> CacheError:
        return self.indices.corrupt(
            name,
            "a piece outside its sequence or a row longer than its window",
            f"pieces within the token file's sequences, at most {self.item.window} tokens per row",
        )

    def sample_pieces(self, indices: npt.ArrayLike) -> Any:
        """The pieces of each row's ``tokens`` (``contract.PieceSource``, for provenance)."""
        from ..pieces import input_pieces

        first, p = self.plan_pieces(indices)
        width = self.item.sequence_length
        return input_pieces(p[:, 0], first, p[:, 2], None, width, starts=p[:, 1])

    def samples_of(self, source: int, document: int) -> np.ndarray:
        """``contract.DocumentSamples``: the samples whose inputs hold a token of ``document``
        (a sequence id of the token file), from the plan: one pass over ``piece_index`` for its
        pieces, their rows (a binary search of ``row_index``), those where it lies among the S
        inputs (the pieces ahead of it in its row decoded): row k is sample k."""
        if source != 0:
            return np.zeros(0, dtype=np.int64)
        arrays = self._arrays()
        table, offsets, parts = arrays["piece_index"], arrays["row_index"], arrays["piece_part"]
        hits = np.flatnonzero(np.asarray(table) == document)
        if not hits.size:
            return hits
        rows = np.searchsorted(offsets, hits, side="right") - 1
        # each hit within its row, a row of at most W pieces (damaged offsets are a CacheError,
        # as for a read: unchecked, one wrapped offset made a 16 GiB allocation of ``at``)
        if _MIN(rows) < 0 or _MAX(rows) >= offsets.size - 1:
            raise self._bad_offsets(table)
        begin, end = (offsets[rows + k].astype(np.int64) for k in (0, 1))
        if not _ALL(
            (begin >= 0) & (begin <= hits) & (hits < end) & (end - begin <= self.item.window)
        ):
            raise self._bad_offsets(table)
        ahead = hits - begin  # pieces ahead of each hit in its row
        at = np.arange(int(ahead.sum()), dtype=np.int64) + np.repeat(hits - np.cumsum(ahead), ahead)
        tokens = np.concatenate(
            ([0], np.cumsum(self._pieces(table[at].view(np.uint32), parts[at])[1]))
        )
        ends = np.cumsum(ahead)
        slot = tokens[ends] - tokens[ends - ahead]
        rows = np.unique(rows[slot < self.item.sequence_length])
        return rows[rows < len(self)].astype(np.int64)

    def read_batch(self, indices: npt.ArrayLike) -> dict[str, Any]:
        """The rows' windows and pieces, with each row's packing counts made once for the whole
        read (a worker's read serves several micro-batches, cut by rows): its documents among its
        inputs (its pieces, less a last one that begins on the label-only slot S) and padding
        label slots (``ROW_COUNTS``). The position ids are laid from the pieces' lengths when
        each micro-batch is finished (``items._window_positions``), with no layout of the
        pieces in their rows (``items.piece_layout``: more steps per read)."""
        r = self._rows(indices)
        seq = self.item.sequence_length
        documents = r.counts - (r.tokens - r.length[r.ends - 1] >= seq)
        read = read_rows(
            self.source,
            self.item,
            r.first,
            r.sequence,
            r.start,
            r.length,
            tokens=r.tokens,
            documents=documents,
        )
        return read.batch(seq)

    def finish_batch(
        self, batch: dict[str, Any], alloc: Allocator | None = None
    ) -> dict[str, np.ndarray]:
        return finish_windows(batch, self.item, alloc)

    def __getitems__(self, indices: npt.ArrayLike) -> dict[str, np.ndarray]:
        return self.finish_batch(self.read_batch(indices))

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    def epoch_sizes(self) -> list[int]:
        return [self.samples_per_epoch]


def packed_member(
    builder: Any, name: str, mid: MidLevelPlan, split: str | None, matrix: SplitMatrix | None
) -> Any:
    """The packed dataset of one prefix's split, through ``builder``'s cache and policy (a
    ``MegatronBuilder``): a ``BuiltMember``."""
    c, options = builder.data, builder.options
    source = builder.source(mid.prefix)
    lengths = builder._lengths(mid.prefix)
    facts = builder._file_facts(mid.prefix)
    beg, end = split_range(mid.bookend, len(lengths))
    uid = gpt_identifiers(
        class_name="PackedGPTDataset",
        dataset_path=mid.prefix,
        num_samples=mid.num_samples,
        index_split=name,
        random_seed=c.random_seed,
        sequence_length=c.sequence_length,
        split=split,
        split_matrix=matrix,
        tokenizer=options.tokenizer,
    )
    uid["packing"] = OrderedDict(
        rule="best-fit",
        layout=PLAN_LAYOUT,
        epochs=EPOCH_RULE,
        block=PACK_BLOCK,
        max_documents_per_row=c.max_documents_per_row,
        add_extra_token=c.add_extra_token,
    )
    extra = int(c.add_extra_token)

    made: list[dict[str, np.ndarray]] = []  # the arrays, when this process builds them

    def build() -> dict[str, np.ndarray]:
        made.append(
            build_packed_indices(
                lengths,
                range(beg, end),  # an array only while the document index is drawn
                num_samples=mid.num_samples,
                sequence_length=c.sequence_length,
                extra=extra,
                seed=c.random_seed,
                max_documents=c.max_documents_per_row,
            )
        )
        return made[-1]

    fields = {"add_extra_token": c.add_extra_token, "token_file": facts}
    folder = default_folder(options.path_to_cache, mid.prefix)
    missing = len(builder._cache.missing)
    cached = builder._cache.indices(folder, uid, describe(uid), build, fields, {}, _unchecked)
    identity = description_hash(describe(placeless(uid))) + repr(sorted(fields.items()))
    # a cache a loading rank misses is reported by the builder, after every split (no rows);
    # arrays this process built may not be in place yet (a group of caches is published last)
    shapes: dict[str, tuple[int, ...]] = {}
    if len(builder._cache.missing) == missing:
        arrays = made[-1] if made else cached.indices.arrays()
        shapes = {k: tuple(v.shape) for k, v in arrays.items()}
    rows = shapes["row_index"][0] - 1 if shapes else 0
    per_epoch = _rows_per_epoch(lengths[beg:end], rows, shapes, c.sequence_length, extra)
    if not shapes:
        # the cache is missing here (reported by the builder after every split, a CacheError):
        # until then the split counts as the rows asked for (a plan holds at least those), or an
        # epoch's, so that no check of a blend's sizes fails first with a wrong cause
        rows = per_epoch if mid.num_samples is None else int(mid.num_samples)
    dataset = PackedGPTDataset(
        source,
        cached.indices,
        builder.item,
        identity=identity,
        length=rows,
        samples_per_epoch=per_epoch,
    )
    return built_member(
        dataset,
        cached.entry,
        uid,
        kind="packed",
        prefix=mid.prefix,
        length=rows,
        samples_per_epoch=per_epoch,
        identity=identity,
        token_file=facts,
        shapes={k: list(v) for k, v in shapes.items()},
    )


def packed_from_entry(builder: Any, entry: Any, indices: IndexArrays) -> PackedGPTDataset:
    """A packed dataset from its build-manifest entry (``build_policy="none"``)."""
    return PackedGPTDataset(
        builder.source(entry["prefix"]),
        indices,
        builder.item,
        identity=entry["identity"],
        length=entry["length"],
        samples_per_epoch=entry["samples_per_epoch"],
        file_facts=entry["token_file"] or None,
    )


def _run(indices: Any, n: int) -> tuple[int, int] | None:
    """``(a, b)`` when ``indices`` are the consecutive samples ``a..b - 1`` of ``n`` (a list of
    ints, as samplers give, a ``range`` or an integer array), else None: the read of a
    micro-batch, which slices the plan's arrays instead of gathering row by row."""
    if isinstance(indices, list):
        if not indices or type(indices[0]) is not int:
            return None
        a = indices[0]
        b = a + len(indices)
        if a < 0 or b > n or indices[-1] != b - 1 or indices != list(range(a, b)):
            return None
        # ints only (1.0 == 1 and True == 1 too): anything else is sample_indices' to refuse
        return (a, b) if len(set(map(type, indices))) == 1 else None
    if isinstance(indices, range):
        if indices.step == 1 and len(indices) and indices.start >= 0 and indices.stop <= n:
            return indices.start, indices.stop
        return None
    if isinstance(indices, np.ndarray) and indices.ndim == 1 and indices.size:
        if indices.dtype.kind not in "iu":
            return None
        a = int(indices[0])
        b = a + indices.size
        if a < 0 or b > n or int(indices[-1]) != b - 1:
            return None
        if indices.size > 2 and not _ALL(indices[1:] - indices[:-1] == 1):
            return None
        return a, b
    return None
