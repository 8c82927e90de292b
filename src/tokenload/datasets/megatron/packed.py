"""Packed rows of whole documents in the Megatron order (``packing="best-fit"``).

The documents come in Megatron's own document order: the epochs Megatron's plan gives for the
request (``index.epochs``) and its shuffled document index (``index.document``, the same
``RandomState`` draws as ``GPTDataset``). Consecutive blocks of ``PACK_BLOCK`` entries of that
index are packed by ``index.packing.pack_block`` (best-fit decreasing; a document of at most
S + extra tokens is never cut), and the rows are shuffled by Megatron's shuffle rule with the
same generator, continued. When Megatron's plan has a separate final epoch (the request takes
less than 80% of the last epoch), that epoch's documents are packed into rows of their own,
shuffled apart and served last, as Megatron serves its samples (with two epochs: every piece once
before any repeats). When packing leaves fewer rows than the request (rows hold whole documents,
so a few more tokens per row go unused than with concatenation), one more epoch is planned, by
the same 80% rule on the rows the epochs gave, and everything is built again: the plan depends
on the data, the seed, S and the request only, never on ranks, micro-batches or workers.

The plan is an index cache like Megatron's (``PackedGPTDataset`` caches, beside them under the
same folder rules, never read by Megatron), 4 bytes per piece (layout ``PLAN_LAYOUT``):

* ``row_index``: rows + 1 offsets (int32, int64 past 2^31 - 1 pieces): row r holds pieces
  ``row_index[r]..row_index[r + 1]``;
* ``piece_index``: int32 per piece. An entry ``s >= 0`` is the last piece of sequence s, whose
  start and length follow from the sequence's length L: all of it when L <= W = S + extra, else
  the rest ``[m * S, L)`` after its m = (L - extra) // S full windows. An entry ``-1 - j`` is the
  full window ``(s, e) = window_index[j]``: tokens ``[e - W, e)`` of sequence s;
* ``window_index``: uint32 (windows, 2), the full windows of cut documents (one row each) by
  sequence and end (the end where the last-piece rule then gives the window: see ``_pieces``);
* ``shuffle_index``: Megatron's dtype rule.

It is built, written, loaded, checked and listed in the build manifest by the same build
policies as the concatenated order's caches, so ``tokenload prepare-cache --packing best-fit``
prepares it and ``build_policy="none"`` loads it. Every value is range-checked as batches use
it. The build holds the document index, the plan and one block's packing at its peak: each
plan array is sized first and filled in place (``_pack``), and the split's document ids are an
array only while the document index is drawn.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ...arrays import sample_indices
from ...caches import describe, description_hash, gpt_identifiers
from ...contract import Allocator
from ...errors import CacheError, ConfigError
from ...index import split_range
from ...index.document import build_document_index, tokens_per_epoch
from ...index.epochs import SEPARATE_THRESHOLD, plan_epochs
from ...index.gpt import seeded_random_state
from ...index.packing import pack_block
from ...index.plan import MidLevelPlan
from ...index.shuffle import build_shuffle_index
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

PLAN_LAYOUT = "last-piece+windows"
"""The plan's arrays as the module docstring lays them out (in the cache's identity: a plan of
another layout, such as the earlier ``(sequence, start, length)`` rows, is never read as this)."""

EPOCH_RULE = "final-epoch-apart"
"""How the plan treats Megatron's separate final epoch (in the cache's identity): its documents
packed into rows of their own, shuffled apart and served last. Plans made before this rule mixed
the final epoch's rows with the others (a piece could repeat before every piece was served) and
are never read as plans of this rule."""

_MIN, _MAX = np.minimum.reduce, np.maximum.reduce
_INT32_MAX = int(np.iinfo(np.int32).max)
_WINDOWS_MAX = 1 << 31
"""Full windows a plan can number: ``piece_index`` names window j by ``-1 - j`` (int32)."""
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
    """The packed plan of one split (module docstring): ``row_index``, ``piece_index``,
    ``window_index``, ``shuffle_index``. ``documents``: the split's sequence ids, an array or a
    ``range`` (made into an array only while the document index is drawn, then dropped: at 100M
    documents, 400 MB the packing does not hold)."""
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
        docs = np.arange(ids.start, ids.stop, dtype=np.int32) if isinstance(ids, range) else ids
        order = build_document_index(docs, num_epochs, rng, separate)
        del docs
        # a separate final epoch is packed apart: no row mixes its documents with earlier ones
        final = (num_epochs - 1) * len(ids) if separate and num_epochs > 1 else order.size
        plan, sans_final = _pack(lengths, order, window, extra, max_documents, block, ids, final)
        del order  # the plan's pieces name the sequences: the document index is done with
        rows = plan["row_index"].size - 1
        if num_samples is None or rows >= num_samples:
            break
        del plan
        # Megatron's 80% rule on the rows this many epochs gave: the epoch added is separate
        # when the request takes less than 80% of an epoch's rows from it
        per_epoch = rows // num_epochs
        num_epochs += 1
        separate = num_samples - rows < int(SEPARATE_THRESHOLD * per_epoch)
    # Megatron's shuffle rule: a separate final epoch's rows are shuffled apart and served last
    plan["shuffle_index"] = build_shuffle_index(sans_final if separate else rows, rows, rng)
    return plan


def _pack(
    lengths: np.ndarray,
    order: np.ndarray,
    window: int,
    extra: int,
    max_documents: int | None,
    block: int,
    documents: np.ndarray | range | None = None,
    final: int | None = None,
) -> tuple[dict[str, np.ndarray], int]:
    """``row_index``, ``piece_index`` and ``window_index`` of the documents of ``order``, packed
    block by block (module docstring), and the rows of its entries before ``final`` (a separate
    final epoch's first entry: no block spans it). Each array is sized first (each document's
    pieces and full windows follow from its length) and filled in place: the plan exists once at
    the peak, never as parts plus their concatenation."""
    final = order.size if final is None else final
    total = windows = 0
    if documents is not None and len(documents) and order.size % len(documents) == 0:
        # the document index holds each document once per epoch: its pieces, counted once
        epochs = order.size // len(documents)
        for lo in range(0, len(documents), block):
            if isinstance(documents, range):  # one run of ids: a slice, no gather
                ids = documents[lo : lo + block]
                some = lengths[ids.start : ids.stop]
            else:
                some = lengths[documents[lo : lo + block]]
            p, w = _piece_count(some, window, extra)
            total, windows = total + epochs * p, windows + epochs * w
    else:
        for lo in range(0, order.size, block):
            p, w = _piece_count(lengths[order[lo : lo + block]], window, extra)
            total, windows = total + p, windows + w
    if windows > _WINDOWS_MAX:
        raise ConfigError(
            f"the packed plan holds {windows:,} full windows of cut documents; expected at most "
            f"{_WINDOWS_MAX:,} (piece_index names them by negative int32 numbers)",
            hint="use fewer epochs or a longer sequence_length, or split the token file",
        )
    pieces = np.empty(total, dtype=np.int32)
    cut = np.empty((windows, 2), dtype=np.uint32)
    # rows <= pieces: sized for every piece in its own row; the pages past the last row are
    # never written (never resident), then cut off in place
    offsets = np.empty(total + 1, dtype=np.int32 if total <= _INT32_MAX else np.int64)
    offsets[0] = 0
    base = rows = w = sans_final = 0
    spans = [(lo, min(lo + block, final)) for lo in range(0, final, block)]
    spans += [(lo, min(lo + block, order.size)) for lo in range(final, order.size, block)]
    for lo, hi in spans:
        if lo == final:
            sans_final = rows
        sequences = order[lo:hi]
        sizes = lengths[sequences].astype(np.int64)
        plan = pack_block(sizes, window, extra, max_documents)
        part = pieces[base : base + plan.piece_doc.size]
        np.take(sequences, plan.piece_doc, out=part)
        # the full windows of cut documents (a whole document of exactly W tokens is not one)
        at = np.flatnonzero(plan.piece_length == window)
        at = at[sizes[plan.piece_doc[at]] > window]
        if at.size:
            cut[w : w + at.size, 0] = part[at]
            cut[w : w + at.size, 1] = plan.piece_start[at] + window  # its end
            part[at] = -1 - np.arange(w, w + at.size, dtype=np.int64)
            w += at.size
        offsets[rows + 1 : rows + 1 + plan.num_rows] = plan.row_offsets[1:] + base
        rows += plan.num_rows
        base += plan.piece_doc.size
        del plan, part, sizes
    assert base == total and w == windows  # split_documents' counts, and _piece_count's
    offsets.resize(rows + 1, refcheck=False)  # in place: nothing else refers to it
    if final == order.size:
        sans_final = rows
    return {"row_index": offsets, "piece_index": pieces, "window_index": cut}, sans_final


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
    per_epoch = _piece_count(lengths, window, extra)[0]
    if rows and pieces and per_epoch:
        return max(1, rows // max(1, pieces // per_epoch))
    tokens = int(np.sum(lengths, dtype=np.int64))
    return max(1, -(-tokens // window))


def _piece_count(lengths: np.ndarray, window: int, extra: int) -> tuple[int, int]:
    """Pieces, and of them full windows, of documents of these lengths
    (``index.packing.split_documents``' rule): full windows and a rest for each longer than
    the window, one for each other non-empty one."""
    stride = window - extra
    n = lengths[lengths > window].astype(np.int64)  # the long ones (a few): pieces apart
    full = (n - extra) // stride
    keep = n - full * stride > extra
    fulls = int(full.sum())
    return int(np.count_nonzero(lengths)) - n.size + fulls + int(np.count_nonzero(keep)), fulls


def _last_piece_start(n: np.ndarray, extra: int, stride: int) -> np.ndarray:
    """Where the last piece of a sequence of ``n`` tokens (or of a full window ending at ``n``)
    starts: at the last multiple of S below ``n - extra`` (0 at least). All of it when n <= W,
    else the rest after the (n - extra) // S full windows (a rest is kept only when it holds more
    than ``extra`` tokens, so n - extra is then never a multiple of S); a window ends at
    k * S + W, so it starts at k * S and holds W tokens."""
    start: np.ndarray = np.maximum(n, extra + 1)
    start -= extra + 1
    start //= stride
    start *= stride
    return start


class _Rows(NamedTuple):
    """Rows decoded from the plan (``PackedGPTDataset._rows``), their pieces flat, row after row
    (int64, but ``sequence``: the plan's int32 when no piece is a full window)."""

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
    """Packed rows of one split of one token file in the Megatron order: sample k is row
    ``shuffle_index[k]`` of the plan (module docstring)."""

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
        ``piece_index`` and ``window_index``), every value checked (a damaged plan is a
        ``CacheError`` naming its file)."""
        rows = self._rows(indices)
        return rows.first, np.array((rows.sequence, rows.start, rows.length), dtype=np.int64).T

    def _rows(self, indices: npt.ArrayLike) -> _Rows:
        """The pieces of the rows of samples ``indices``, decoded from the plan, every value
        checked (a damaged plan is a ``CacheError`` naming its array). It runs per read on a few
        dozen rows, so it makes as few NumPy calls as the checks allow (each costs about a
        microsecond here, whatever its size): out-of-range numbers fail the lookups themselves
        (a row past the plan, a window or a sequence past its array), and six reductions check
        the rest."""
        idx = sample_indices(indices)
        arrays = self._arrays()
        shuffle, offsets, table = (
            arrays["shuffle_index"],
            arrays["row_index"],
            arrays["piece_index"],
        )
        try:
            rows = shuffle[idx]
        except IndexError:
            raise IndexError(f"sample indices must lie in [-{len(self)}, {len(self)})") from None
        if rows.dtype.kind == "i" and rows.size and _MIN(rows) < 0:
            raise self._bad_shuffle(offsets)
        try:  # (B, 2) in one lookup: a row number past the plan fails it
            bounds = offsets[rows[:, None] + _ROW_AND_NEXT]
        except IndexError:
            raise self._bad_shuffle(offsets) from None
        lo = bounds[:, 0]
        counts = bounds[:, 1] - lo  # (the offsets' dtype, which damage may wrap; cumsum: int64)
        ends = counts.cumsum()
        total = int(ends[-1]) if ends.size else 0
        # a row holds at most W pieces (each of a token or more): bounded before the positions
        # of the pieces are allocated, so damaged offsets never make a huge array
        if rows.size and (_MIN(counts) < 1 or _MIN(lo) < 0 or total > rows.size * self.item.window):
            raise self._bad_offsets(table)
        first = ends - counts
        at = upto(total) + (lo - first).repeat(counts)
        try:  # offsets past the pieces fail it
            seq = table[at]
        except IndexError:
            raise self._bad_offsets(table) from None
        seq, start, n = self._pieces(seq, arrays["window_index"])
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

    def _bad_shuffle(self, offsets: np.ndarray) -> CacheError:
        return self.indices.corrupt(
            "shuffle_index", "row numbers out of range", f"0..{offsets.size - 2}"
        )

    def _pieces(self, entries: np.ndarray, cuts: np.ndarray) -> tuple[np.ndarray, ...]:
        """Sequence, start and length of ``piece_index`` entries (module docstring; ``entries``
        is the caller's own copy, made the sequences in place), each checked against the token
        file's sequences; start and length int64."""
        seq = entries
        win = (seq < 0).nonzero()[0]  # full windows (in most reads: 1 row in 6)
        if win.size:
            seq = seq.astype(np.int64)  # (a window's uint32 sequence, never negative)
            try:  # window j is entry -1 - j, that is ~j
                pair = cuts[~seq[win]]
            except IndexError:
                raise self._damaged("piece_index") from None
            seq[win] = pair[:, 0]
        try:  # every entry is a sequence number >= 0 now
            n = self.source.sequence_lengths[seq].astype(np.int64)
        except IndexError:
            lengths = self.source.sequence_lengths
            bad = win.size and _MAX(pair[:, 0]) >= len(lengths)  # a window's sequence
            raise self._damaged("window_index" if bad else "piece_index") from None
        if win.size:  # a window ends at its end, within its sequence
            ends = pair[:, 1]
            if _MIN(n[win] - ends) < 0:
                raise self._damaged("window_index")
            n[win] = ends
        start = _last_piece_start(n, self.item.extra, self.item.sequence_length)
        n -= start  # each piece's length
        if n.size and _MIN(n) < 1:
            raise self._damaged("piece_index")
        if win.size and _MIN(n[win]) < self.item.window:  # an end no full window has
            raise self._damaged("window_index")
        return seq, start, n

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
        pieces (the document itself, or its full windows' numbers in ``window_index``), their
        rows (a binary search of ``row_index``), those where it lies among the S inputs (the
        pieces ahead of it in its row decoded), then one pass over ``shuffle_index``."""
        if source != 0:
            return np.zeros(0, dtype=np.int64)
        arrays = self._arrays()
        table, offsets, cuts = arrays["piece_index"], arrays["row_index"], arrays["window_index"]
        windows = np.flatnonzero(np.asarray(cuts[:, 0]) == document)
        if windows.size:
            hits = np.flatnonzero(np.isin(table, [document, *(-1 - windows).tolist()]))
        else:
            hits = np.flatnonzero(np.asarray(table) == document)
        if not hits.size:
            return hits
        rows = np.searchsorted(offsets, hits, side="right") - 1
        ahead = hits - offsets[rows]  # pieces ahead of each hit in its row
        at = np.arange(int(ahead.sum()), dtype=np.int64) + np.repeat(hits - np.cumsum(ahead), ahead)
        tokens = np.concatenate(([0], np.cumsum(self._pieces(table[at], cuts)[2])))
        ends = np.cumsum(ahead)
        slot = tokens[ends] - tokens[ends - ahead]
        rows = rows[slot < self.item.sequence_length]
        shuffle = arrays["shuffle_index"][: len(self)]
        return np.flatnonzero(np.isin(shuffle, rows))

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
    rows = shapes["shuffle_index"][0] if shapes else 0
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
