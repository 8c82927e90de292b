"""Packed rows of whole documents in the Megatron order (``packing="best-fit"``).

The documents come in Megatron's own document order: the epochs Megatron's plan gives for the
request (``index.epochs``) and its shuffled document index (``index.document``, the same
``RandomState`` draws as ``GPTDataset``). Consecutive blocks of ``PACK_BLOCK`` entries of that
index are packed by ``index.packing.pack_block`` (best-fit decreasing; a document of at most
S + extra tokens is never cut), and the rows are shuffled by Megatron's shuffle rule with the
same generator, continued. When packing leaves fewer rows than the request (rows hold whole
documents, so a few more tokens per row go unused than with concatenation), one more epoch is
planned and everything is built again: the plan depends on the data, the seed, S and the request
only, never on ranks, micro-batches or workers.

The plan is an index cache like Megatron's (``PackedGPTDataset`` caches, beside them under the
same folder rules, never read by Megatron): ``row_index`` (int64, rows + 1: row r holds pieces
``row_index[r]..row_index[r + 1]``), ``piece_index`` (int32, pieces x 3: sequence, first
token, tokens) and ``shuffle_index`` (Megatron's dtype rule). It is built, written, loaded,
checked and listed in the build manifest by the same build policies as the concatenated
order's caches, so ``tokenload prepare-cache --packing best-fit`` prepares it and
``build_policy="none"`` loads it. Every value is range-checked as batches use it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np
import numpy.typing as npt

from ...caches import describe, description_hash, gpt_identifiers
from ...contract import Allocator
from ...index import split_range
from ...index.document import build_document_index, tokens_per_epoch
from ...index.epochs import plan_epochs
from ...index.gpt import seeded_random_state
from ...index.packing import pack_block
from ...index.plan import MidLevelPlan
from ...index.shuffle import build_shuffle_index
from ...index.splits import SplitMatrix
from ..contract_parts import OneSourceContract
from ..items import ItemConfig, finish_windows
from ..packed_rows import read_rows
from .built import built_member, default_folder, placeless
from .gpt_dataset import IndexArrays

__all__ = ["PACK_BLOCK", "PackedGPTDataset", "build_packed_indices", "packed_member"]

PACK_BLOCK = 1 << 20
"""Entries of the document index packed together: a block of 2^20 documents packs in about a
second on this machine, with ~0.001% padding at S = 2,048 on a web-text mix."""

_MIN, _MAX = np.minimum.reduce, np.maximum.reduce


def build_packed_indices(
    sequence_lengths: np.ndarray,
    documents: np.ndarray,
    *,
    num_samples: int | None,
    sequence_length: int,
    extra: int,
    seed: int,
    max_documents: int | None = None,
    block: int = PACK_BLOCK,
) -> dict[str, np.ndarray]:
    """The packed plan of one split (module docstring): ``row_index``, ``piece_index``,
    ``shuffle_index``."""
    lengths = np.asarray(sequence_lengths)
    docs = np.asarray(documents)
    tokens = tokens_per_epoch(lengths, documents)
    epochs = plan_epochs(
        tokens_per_epoch=tokens,
        num_samples=num_samples,
        sequence_length=sequence_length,
        extra=extra,
    )
    num_epochs, separate = epochs.num_epochs, epochs.separate_final_epoch
    window = sequence_length + extra
    while True:
        rng = seeded_random_state(seed)
        order = build_document_index(documents, num_epochs, rng, separate)
        offsets, pieces = _pack(lengths, order, window, extra, max_documents, block, docs)
        del order  # the plan's pieces name the sequences: the document index is done with
        rows = offsets.size - 1
        if num_samples is None or rows >= num_samples:
            break
        num_epochs, separate = num_epochs + 1, False
    return {
        "row_index": offsets,
        "piece_index": pieces,
        "shuffle_index": build_shuffle_index(rows, rows, rng),
    }


def _pack(
    lengths: np.ndarray,
    order: np.ndarray,
    window: int,
    extra: int,
    max_documents: int | None,
    block: int,
    documents: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Row offsets and pieces of the documents of ``order``, packed block by block. The pieces
    are written into one array sized first (each document's piece count follows from its
    length), so the plan's largest array exists once at the peak, not as parts plus their
    concatenation."""
    total = 0
    if documents is not None and documents.size and order.size % documents.size == 0:
        # the document index holds each document once per epoch: its pieces, counted once
        epochs = order.size // documents.size
        for lo in range(0, documents.size, block):
            total += epochs * _piece_count(lengths[documents[lo : lo + block]], window, extra)
    else:
        for lo in range(0, order.size, block):
            total += _piece_count(lengths[order[lo : lo + block]], window, extra)
    pieces = np.empty((total, 3), dtype=np.int32)
    # each block's pieces per row, as int32 (a row holds at most S + 1 pieces), made into the
    # int64 offsets at the end: half the memory of int64 offsets per block, then their join
    counts: list[np.ndarray] = []
    base = 0
    for lo in range(0, order.size, block):
        sequences = order[lo : lo + block]
        plan = pack_block(lengths[sequences].astype(np.int64), window, extra, max_documents)
        part = pieces[base : base + plan.piece_doc.size]
        part[:, 0] = sequences[plan.piece_doc]
        part[:, 1] = plan.piece_start
        part[:, 2] = plan.piece_length
        counts.append(np.diff(plan.row_offsets).astype(np.int32))
        base += plan.piece_doc.size
        del plan, part
    assert base == total  # split_documents' count, and _piece_count's
    offsets = np.zeros(sum(c.size for c in counts) + 1, dtype=np.int64)
    end = 1
    counts.reverse()
    while counts:  # each part freed once added: the parts shrink as the offsets fill
        c = counts.pop()
        np.cumsum(c, out=offsets[end : end + c.size])
        offsets[end : end + c.size] += offsets[end - 1]
        end += c.size
    return offsets, pieces


def _piece_count(lengths: np.ndarray, window: int, extra: int) -> int:
    """Pieces of documents of these lengths (``index.packing.split_documents``' rule): full
    windows and a rest for each longer than the window, one for each other non-empty one."""
    stride = window - extra
    n = lengths[lengths > window].astype(np.int64)  # the long ones (a few): pieces apart
    full = (n - extra) // stride
    keep = n - full * stride > extra
    return int(np.count_nonzero(lengths)) - n.size + int(full.sum()) + int(np.count_nonzero(keep))


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
    ) -> None:
        self.source = source
        self.indices = indices
        self.item = item
        self.identity = identity
        self._length = int(length)
        self.samples_per_epoch = int(samples_per_epoch)
        self.startup_phases: dict[str, float] = {}

    def __len__(self) -> int:
        return self._length

    @property
    def fingerprint(self) -> str:
        text = f"{self.identity}|{self.item!r}|packed"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def plan_pieces(self, indices: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's pieces: ``(first, pieces)``, the flat index of each sample's first
        piece and the ``(sequence, start, length)`` rows of ``piece_index``, every value
        checked (a damaged plan is a ``CacheError`` naming its file)."""
        idx = np.asarray(indices, dtype=np.int64).ravel()
        arrays = self.indices.arrays()
        shuffle, offsets, table = (
            arrays["shuffle_index"],
            arrays["row_index"],
            arrays["piece_index"],
        )
        try:
            rows = shuffle[idx].astype(np.int64)
        except IndexError:
            raise IndexError(f"sample indices must lie in [-{len(self)}, {len(self)})") from None
        if rows.size and (_MIN(rows) < 0 or _MAX(rows) >= offsets.size - 1):
            raise self.indices.corrupt(
                "shuffle_index", "row numbers out of range", f"0..{offsets.size - 2}"
            )
        lo, hi = offsets[rows], offsets[rows + 1]
        counts = hi - lo
        if rows.size and (_MIN(counts) < 1 or _MIN(lo) < 0 or _MAX(hi) > len(table)):
            raise self.indices.corrupt(
                "row_index",
                "a row without pieces or offsets past the pieces",
                f"increasing offsets within 0..{len(table)}",
            )
        first = np.cumsum(counts) - counts
        at = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(lo - first, counts)
        pieces = np.asarray(table[at], dtype=np.int64)
        self._check_pieces(pieces, first)
        return first, pieces

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
        inputs, then one pass over ``shuffle_index``."""
        if source != 0:
            return np.zeros(0, dtype=np.int64)
        arrays = self.indices.arrays()
        table, offsets = arrays["piece_index"], arrays["row_index"]
        hits = np.flatnonzero(np.asarray(table[:, 0]) == document)
        if not hits.size:
            return hits
        rows = np.searchsorted(offsets, hits, side="right") - 1
        lengths = np.asarray(table[:, 2], dtype=np.int64)
        before = np.cumsum(lengths) - lengths  # tokens ahead of each piece, all rows
        slot = before[hits] - before[np.asarray(offsets[rows], dtype=np.int64)]
        rows = rows[slot < self.item.sequence_length]
        shuffle = arrays["shuffle_index"][: len(self)]
        return np.flatnonzero(np.isin(shuffle, rows))

    def _check_pieces(self, pieces: np.ndarray, first: np.ndarray) -> None:
        if not pieces.size:
            return
        lengths = self.source.sequence_lengths
        seq, start, length = pieces[:, 0], pieces[:, 1], pieces[:, 2]
        bad = _MIN(seq) < 0 or _MAX(seq) >= len(lengths) or _MIN(start) < 0 or _MIN(length) < 1
        if not bad:
            ends = start + length
            bad = bool((ends > lengths[seq]).any())
            bad = bad or bool(_MAX(np.add.reduceat(length, first)) > self.item.window)
        if bad:
            raise self.indices.corrupt(
                "piece_index",
                "a piece outside its sequence or a row longer than its window",
                f"pieces within the token file's sequences, at most {self.item.window} tokens"
                " per row",
            )

    def read_batch(self, indices: npt.ArrayLike) -> dict[str, Any]:
        first, pieces = self.plan_pieces(indices)
        read = read_rows(self.source, self.item, first, pieces[:, 0], pieces[:, 1], pieces[:, 2])
        return read.batch()

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
        block=PACK_BLOCK,
        max_documents_per_row=c.max_documents_per_row,
        add_extra_token=c.add_extra_token,
    )
    documents = np.arange(beg, end, dtype=np.int32)
    extra = int(c.add_extra_token)

    made: list[dict[str, np.ndarray]] = []  # the arrays, when this process builds them

    def build() -> dict[str, np.ndarray]:
        made.append(
            build_packed_indices(
                lengths,
                documents,
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
    cached = builder._cache.indices(folder, uid, describe(uid), build, fields, {})
    identity = description_hash(describe(placeless(uid))) + repr(sorted(fields.items()))
    # a cache a loading rank misses is reported by the builder, after every split (no rows);
    # arrays this process built may not be in place yet (a group of caches is published last)
    shapes: dict[str, tuple[int, ...]] = {}
    if len(builder._cache.missing) == missing:
        arrays = made[-1] if made else cached.indices.arrays()
        shapes = {k: tuple(v.shape) for k, v in arrays.items()}
    rows = shapes["shuffle_index"][0] if shapes else 0
    tokens = int(np.sum(lengths[beg:end], dtype=np.int64))
    per_epoch = max(1, -(-tokens // (c.sequence_length + extra)))
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
    )
