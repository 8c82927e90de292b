"""Megatron's GPT dataset: sample k reads the tokens its document, sample and shuffle indices
point at, from a token file (or the mock source), a whole micro-batch in one vectorized read.

Sample j spans document-index positions ``b..e`` (rows j and j+1 of the sample index): from
offset ``bo`` of position b, whole sequences in between, up to offset ``eo`` (inclusive of the
``extra`` overlap token) of position e. ``__getitems__`` turns a batch of samples into one flat
list of (sequence, offset, length) pieces with ``repeat``/``cumsum`` arithmetic, reads them with
one call, scatters them into a padded ``(B, S + extra)`` matrix, and builds the item fields
(``items.build_items``). The work is split in two: ``read_batch`` (index lookups and reads, in
the file's compact dtype) and ``finish_batch`` (the item fields, into arrays from an allocator, so
a loader worker builds them straight in shared memory). Index arrays may be in memory or
memory-mapped cache files that are opened on first use in each process (deferred mmap), so
pickling a dataset is cheap.

Index values are range-checked as a batch uses them, so a damaged cache raises a ``CacheError``
naming its file instead of wrapping around (NumPy reads a negative index from the end) or
failing with a bare ``IndexError``. The checks ride on lookups the read does anyway: NumPy's own
bounds check on unsigned views (a negative int32 becomes a huge uint32), one reduction over the
pieces per sample and one over the piece lengths (instead of the clip to zero it replaces); a
short sample, rare, gets the full check of its rows. Checking the arrays when they are loaded
would read every byte of them on every rank.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ...arrays import distinct, sample_indices
from ...byte_source import gather_index
from ...caches import DAMAGED_HINT, map_array
from ...contract import Allocator, RowPieces
from ...errors import CacheError
from ...format import TokenFile
from ..contract_parts import OneSourceContract
from ..items import ItemConfig, document_bounds, finish_windows
from ..pieces import input_pieces, no_pieces
from ..sources import FactsGuard, TokenSource

_ROW_AND_NEXT = np.array([0, 1], dtype=np.int64)
_MIN, _MAX = np.minimum.reduce, np.maximum.reduce  # the ufuncs: less dispatch than .min()/.max()
_INT64 = np.dtype(np.int64)  # padded windows are read as int64
_INT32, _UINT32 = np.dtype(np.int32), np.dtype(np.uint32)  # `is` is cheaper than ==


class IndexArrays:
    """document/sample/shuffle index arrays, held in memory or loaded lazily from ``.npy`` paths."""

    def __init__(
        self,
        arrays: dict[str, np.ndarray] | None = None,
        paths: dict[str, str] | None = None,
        shapes: dict[str, tuple[int, ...]] | None = None,
        digests: dict[str, str] | None = None,
        remedy: Callable[[], str] | None = None,
    ) -> None:
        if (arrays is None) == (paths is None):
            raise ValueError("give either arrays or paths")
        self._arrays = arrays
        self.paths = paths
        self.shapes = shapes
        """Shapes the mapped files must have (a build manifest's), checked as they are mapped."""
        self.digests = digests
        """The xxh3-64 each mapped file's data must have (a build manifest's), checked as it is
        first mapped in a process; without them, the cache's sidecar's (``map_array``)."""
        self.remedy = remedy
        """Makes the command that prepares these caches again, for the hint of a damaged or
        unreadable array (a load under ``build_policy="none"`` from a build manifest, which
        probes no file, so deleting the damaged files would not make it name the command); made
        only then (it looks at the cache folder: no system call at startup). None: the hint of
        any policy (``caches.DAMAGED_HINT``)."""
        self._pid = os.getpid()

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays()[name]

    def arrays(self) -> dict[str, np.ndarray]:
        """All arrays by name, mapped in this process on first use."""
        # In-memory arrays travel with the object (pickled, or inherited by a fork) and stay valid
        # in every process; mapped ones are mapped again in each process that uses them.
        if self.paths is not None and (self._arrays is None or self._pid != os.getpid()):
            digests = self.digests or {}
            try:
                arrays = {k: map_array(p, digests.get(k)) for k, p in self.paths.items()}
            except CacheError as exc:  # damaged or unreadable: what to do under this policy
                if self.remedy is None:
                    raise
                raise CacheError(exc.message, path=exc.path, hint=self._hint()) from None
            for name, shape in (self.shapes or {}).items():
                if arrays[name].shape != tuple(shape):
                    raise self.corrupt(
                        name,
                        f"shape {arrays[name].shape}",
                        f"shape {tuple(shape)} (the build manifest's)",
                    )
            self._arrays = arrays
            self._pid = os.getpid()
        assert self._arrays is not None  # given, or mapped just above
        return self._arrays

    def corrupt(self, name: str, found: str, expected: str) -> CacheError:
        """The error for values of array ``name`` that no valid index holds, naming its file."""
        path = None if self.paths is None else self.paths[name]
        where = "" if path is not None else " (built in memory)"
        return CacheError(
            f"{name}{where} holds {found}; expected {expected}: the index cache is damaged",
            path=path,
            hint=self._hint(),
        )

    def _hint(self) -> str:
        if self.remedy is None:
            return DAMAGED_HINT
        return (
            "delete the cache files of this hash (same name up to '-{array}.npy') and prepare them"
            f" again with: {self.remedy()}"
        )

    def __getstate__(self) -> dict[str, Any]:
        # Cached arrays travel as paths (each process maps them itself); built ones travel as data.
        state = dict(self.__dict__)
        if self.paths is not None:
            state["_arrays"] = None
        return state


class GPTDataset(OneSourceContract):
    """Items of one split of one token file (or of the mock source) in Megatron's order."""

    def __init__(
        self,
        source: TokenSource,
        indices: IndexArrays,
        item: ItemConfig,
        *,
        identity: str,
        length: int | None = None,
        samples_per_epoch: int | None = None,
        file_facts: dict[str, Any] | None = None,
        startup_phases: dict[str, float] | None = None,
    ) -> None:
        self.source = source
        self.indices = indices
        self.item = item
        self.identity = identity
        self._length = length
        self.samples_per_epoch = samples_per_epoch
        """Megatron's ``num_samples_per_epoch``: ``(tokens of the split - extra) // S``."""
        self.file_facts = file_facts
        """The token file's content facts recorded by the build (a manifest load): compared
        where the file opens, on first use in each process; None when checked at build time."""
        self.startup_phases = startup_phases or {}
        """Seconds per phase of the ``build_datasets`` call that made it (loader metrics)."""
        self._facts = FactsGuard(source, file_facts)
        self._width, self._extra = item.window, item.extra  # read per batch

    def __len__(self) -> int:
        if self._length is None:
            self._length = int(self.indices["sample_index"].shape[0]) - 1
        return self._length

    def _arrays(self) -> dict[str, np.ndarray]:
        """The index arrays, after the token file's recorded facts are checked in this process."""
        self._facts.check()
        return self.indices.arrays()

    @property
    def fingerprint(self) -> str:
        """Identity of data, order and item layout: what a resume state must match."""
        return hashlib.sha256(f"{self.identity}|{self.item!r}".encode()).hexdigest()[:16]

    @property
    def document_index(self) -> np.ndarray:
        return self._arrays()["document_index"]

    @property
    def sample_index(self) -> np.ndarray:
        return self._arrays()["sample_index"]

    @property
    def shuffle_index(self) -> np.ndarray:
        return self._arrays()["shuffle_index"]

    def windows(self, indices: npt.ArrayLike) -> np.ndarray:
        """int64 ``(B, S + extra)`` token windows of dataset indices, padded with ``pad_id``."""
        windows: np.ndarray = self.read_batch(indices)["windows"]
        return windows.astype(np.int64, copy=False)

    def read_batch(self, indices: npt.ArrayLike) -> dict[str, Any]:
        """The raw part of ``__getitems__``: token windows, in the file's dtype when no sample is
        short, else int64 padded with ``pad_id``; with ``inter_document_masking``, each sample's
        document boundaries from its pieces (``doc_bounds``, ``items.document_bounds``)."""
        idx = sample_indices(indices)
        arrays = self._arrays()
        try:  # one entry per sample: NumPy's own bounds check (negative indices count from the end)
            samples = arrays["shuffle_index"][idx]
        except IndexError:
            raise IndexError(f"sample indices must lie in [-{len(self)}, {len(self)})") from None
        width = self._width
        seqs, first, lengths, first_offsets, index_rows = self._pieces(arrays, samples)
        per_sample = np.add.reduceat(lengths, first)
        full = not np.count_nonzero(per_sample - width)  # no padding: keep the file dtype
        if not full and (_MIN(index_rows, axis=None) < 0 or _MAX(per_sample) > width):
            raise self.indices.corrupt(
                "sample_index",
                "a negative entry or a sample longer than its window",
                f"non-negative rows spanning at most {width} tokens",
            )
        source = self.source
        if isinstance(source, TokenFile):  # spans of the .bin
            starts = source.token_starts(seqs)
            starts[first] += first_offsets
            flat = source.read_spans(starts, lengths, None if full else _INT64)
        else:
            offsets = np.zeros_like(lengths)
            offsets[first] = first_offsets
            flat = source.read_pieces(seqs, offsets, lengths, None if full else np.int64)
        if full:
            batch = {"windows": flat.reshape(idx.size, width), "padded": False}
        else:
            out = np.full((idx.size, width), self.item.pad_id, dtype=np.int64)
            rows = np.repeat(np.arange(idx.size, dtype=np.int64), per_sample)
            cols = gather_index(np.zeros(idx.size, np.int64), per_sample)
            out[rows, cols] = flat
            batch = {"windows": out, "padded": True}
        if self.item.inter_document_masking:  # megatron-core's boundaries: the pieces' lengths
            item = self.item
            batch["doc_bounds"] = document_bounds(lengths, first, item.sequence_length, item.extra)
        return batch

    def finish_batch(
        self, batch: dict[str, Any], alloc: Allocator | None = None
    ) -> dict[str, np.ndarray]:
        """The item fields of a ``read_batch`` result, in arrays made by ``alloc``
        (``np.empty``)."""
        return finish_windows(batch, self.item, alloc)

    def _pieces(
        self, arrays: dict[str, np.ndarray], samples: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every sample's pieces (Megatron's last micro-batch of a rank may have no sample): their
        sequences, the flat index of each sample's first piece, the pieces' lengths, the offset of
        each first piece in its sequence (other pieces start at 0), and the sample-index rows.
        ``CacheError`` for index values out of range, except the end offsets of a short sample
        (``read_batch`` checks those)."""
        indices = self.indices
        sample_index, document_index = arrays["sample_index"], arrays["document_index"]
        if samples.dtype.kind == "i" and samples.size and _MIN(samples) < 0:  # uint32 needs none
            raise indices.corrupt("shuffle_index", "negative sample numbers", "0 or more")
        try:  # (B, 2, 2) in one lookup; int64 first: uint64 + int64 would promote to float64
            rows = sample_index[samples.astype(np.int64, copy=False)[:, None] + _ROW_AND_NEXT]
        except IndexError:
            raise indices.corrupt(
                "shuffle_index",
                "sample numbers past the sample index",
                f"numbers below {len(self)}",
            ) from None
        # int32 rows viewed as uint32: a negative start position or offset becomes huge and fails
        # the checks below (n_pieces < 1, a negative length); int64 rows are checked directly.
        if rows.dtype is _INT32:
            begin = rows[:, 0].view(_UINT32)
        elif rows.size and _MIN(rows, axis=None) < 0:
            raise self._bad_rows()
        else:
            begin = rows[:, 0]
        end = rows[:, 1]
        b = begin[:, 0].astype(np.int64)
        n_pieces = end[:, 0] - b + 1
        if n_pieces.size and _MIN(n_pieces) < 1:
            raise self._bad_rows()
        ends = n_pieces.cumsum()  # methods, not np.cumsum/np.repeat: less dispatch per call
        first = ends - n_pieces
        total = int(ends[-1]) if ends.size else 0
        # Many pieces per sample happen only with empty sequences, or with a damaged end position
        # that would make the arange below huge: bound the positions before allocating.
        if total > samples.size * (self._width + 1) and int(_MAX(end[:, 0])) >= len(document_index):
            raise self._past_document_index(document_index)
        pos = np.arange(total, dtype=np.int64) + (b - first).repeat(n_pieces)
        try:
            seqs = document_index[pos]
        except IndexError:
            raise self._past_document_index(document_index) from None
        # fancy indexing, never .take: the .idx arrays are unaligned (34-byte header) and
        # ndarray.take copies a whole unaligned array first (measured 275 us instead of 0.5)
        sequence_lengths = self.source.sequence_lengths
        try:
            lengths = sequence_lengths[_unwrapped(seqs)].astype(np.int64)
        except IndexError:
            raise indices.corrupt(
                "document_index",
                "sequence ids outside the token file",
                f"ids 0..{len(sequence_lengths) - 1} (the file's sequences)",
            ) from None
        # Last pieces end at eo (+ the overlap token), clipped to their sequence (the last sample
        # of a partial final epoch may point past its sequence's end); first pieces start at bo.
        last = ends - 1
        lengths[last] = np.minimum(end[:, 1] + self._extra, lengths[last])
        lengths[first] -= begin[:, 1]
        if lengths.size and _MIN(lengths) < 0:  # never for a valid index
            raise indices.corrupt(
                "sample_index",
                "a token offset past the end of its sequence",
                "offsets within the sequence",
            )
        return seqs, first, lengths, begin[:, 1], rows

    # -- provenance (contract.PieceSource) ------------------------------------------------------
    def sample_pieces(self, indices: npt.ArrayLike) -> RowPieces:
        """The document pieces of each sample's ``tokens`` (documents: the .idx sequence ids
        of ``document_index``, megatron-core's "document")."""
        idx = sample_indices(indices)
        arrays = self._arrays()
        return self._sample_pieces(arrays, arrays["shuffle_index"][idx])

    def _sample_pieces(self, arrays: dict[str, np.ndarray], samples: np.ndarray) -> RowPieces:
        if not samples.size:
            return no_pieces(0)
        seqs, first, lengths, offsets, _ = self._pieces(arrays, np.asarray(samples))
        return input_pieces(_unwrapped(seqs), first, lengths, offsets, self.item.sequence_length)

    def samples_of(self, source: int, document: int) -> np.ndarray:
        """The dataset indices whose ``tokens`` hold a token of ``document`` (``source`` 0),
        from the index arrays: the document's positions in ``document_index`` (one pass), the
        samples whose ``sample_index`` rows span them (a binary search), their pieces checked,
        then their places in ``shuffle_index`` (one pass)."""
        arrays = self._arrays()
        if source != 0:
            return np.zeros(0, dtype=np.int64)
        positions = np.flatnonzero(arrays["document_index"] == document)
        starts = np.asarray(arrays["sample_index"][:, 0], dtype=np.int64)
        # sample s spans positions starts[s]..starts[s + 1]
        lo = np.maximum(np.searchsorted(starts, positions, side="left") - 1, 0)
        hi = np.minimum(np.searchsorted(starts, positions, side="right") - 1, len(starts) - 2)
        spans = np.maximum(hi - lo + 1, 0)
        if not spans.sum():
            return np.zeros(0, dtype=np.int64)
        candidates = distinct(
            np.repeat(lo, spans) + gather_index(np.zeros(spans.size, np.int64), spans)
        )
        pieces = self._sample_pieces(arrays, candidates)
        row = np.repeat(np.arange(candidates.size), np.diff(pieces.offsets))
        held = candidates[distinct(row[pieces.document == document])]
        shuffle = arrays["shuffle_index"][: len(self)]
        return np.flatnonzero(np.isin(shuffle, held))

    def _bad_rows(self) -> CacheError:
        return self.indices.corrupt(
            "sample_index",
            "a negative entry or a sample that ends before it starts",
            "non-negative rows, each sample ending at or after its start",
        )

    def _past_document_index(self, document_index: np.ndarray) -> CacheError:
        return self.indices.corrupt(
            "sample_index",
            "positions past the document index",
            f"positions below {len(document_index)} (the document index's length)",
        )

    def __getitems__(self, indices: npt.ArrayLike) -> dict[str, np.ndarray]:
        return self.finish_batch(self.read_batch(indices))

    def __getitem__(self, index: int | None) -> dict[str, np.ndarray]:
        if index is None:  # Megatron's batch padding: sample 0 with no loss
            item = {k: v[0] for k, v in self.__getitems__([0]).items()}
            item["loss_mask"] = np.zeros_like(item["loss_mask"])
            return item
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    # -- the loader's contract (contract.LoaderDataset) ------------------------------------------
    # reads_in_groups, describe_sources, sample_bytes, blend_index, mixture_cursors: from
    # OneSourceContract
    def epoch_sizes(self) -> list[int]:
        """Megatron's samples per epoch, as the build recorded it, else from the index."""
        told = self.samples_per_epoch
        if isinstance(told, int) and told > 0:
            return [told]
        return [self.samples_per_epoch_from_index() or len(self)]

    def samples_per_epoch_from_index(self) -> int | None:
        """Megatron's ``num_samples_per_epoch`` from the document index (every epoch holds each
        document of the split once, and the split is a contiguous range) and the file's sequence
        lengths. Reads the whole document index once: O(documents x epochs)."""
        documents = self.document_index
        if not len(documents):
            return None
        low, high = int(documents.min()), int(documents.max())
        tokens = int(np.sum(self.source.sequence_lengths[low : high + 1], dtype=np.int64))
        return max((tokens - self.item.extra) // self.item.sequence_length, 1)


def _unwrapped(ids: np.ndarray) -> np.ndarray:
    """``ids`` as an index NumPy does not wrap around: a negative int32 viewed as uint32 is past
    any array, so the lookup's own bounds check refuses it (a view instead of a reduction); other
    signed ids with a negative value become ids past any array."""
    if ids.dtype is _INT32:
        return ids.view(_UINT32)
    if ids.dtype.kind == "i" and ids.size and _MIN(ids) < 0:
        return np.full(ids.shape, np.iinfo(np.int64).max)
    return ids
