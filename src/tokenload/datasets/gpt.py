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
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from ..format.bin import gather_index
from .items import Allocator, ItemConfig, build_items

_ROW_AND_NEXT = np.array([0, 1], dtype=np.int64)


class IndexArrays:
    """document/sample/shuffle index arrays, held in memory or loaded lazily from ``.npy`` paths."""

    def __init__(self, arrays: dict[str, np.ndarray] | None = None, paths: dict[str, str] | None = None) -> None:
        if (arrays is None) == (paths is None):
            raise ValueError("give either arrays or paths")
        self._arrays = arrays
        self.paths = paths
        self._pid = os.getpid()

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays()[name]

    def arrays(self) -> dict[str, np.ndarray]:
        """All arrays by name, mapped in this process on first use."""
        # In-memory arrays travel with the object (pickled, or inherited by a fork) and stay valid
        # in every process; mapped ones are mapped again in each process that uses them.
        if self.paths is not None and (self._arrays is None or self._pid != os.getpid()):
            # Plain ndarray views of the mappings: np.memmap's subclass hooks cost more than the
            # lookups themselves on every fancy index.
            self._arrays = {
                k: np.asarray(np.load(p, mmap_mode="r", allow_pickle=False)) for k, p in self.paths.items()
            }
            self._pid = os.getpid()
        return self._arrays

    def __getstate__(self) -> dict:
        # Cached arrays travel as paths (each process maps them itself); built ones travel as data.
        state = dict(self.__dict__)
        if self.paths is not None:
            state["_arrays"] = None
        return state


class GPTDataset:
    """Items of one split of one token file (or of the mock source) in Megatron's order."""

    def __init__(
        self,
        source: Any,
        indices: IndexArrays,
        item: ItemConfig,
        *,
        identity: str,
    ) -> None:
        self.source = source
        self.indices = indices
        self.item = item
        self.identity = identity
        self._length: int | None = None
        self._width, self._extra = item.window, item.extra  # read per batch

    def __len__(self) -> int:
        if self._length is None:
            self._length = int(self.indices["sample_index"].shape[0]) - 1
        return self._length

    @property
    def fingerprint(self) -> str:
        """Identity of data, order and item layout: what a resume state must match."""
        return hashlib.sha256(f"{self.identity}|{self.item!r}".encode()).hexdigest()[:16]

    @property
    def document_index(self) -> np.ndarray:
        return self.indices["document_index"]

    @property
    def sample_index(self) -> np.ndarray:
        return self.indices["sample_index"]

    @property
    def shuffle_index(self) -> np.ndarray:
        return self.indices["shuffle_index"]

    def windows(self, indices) -> np.ndarray:
        """int64 ``(B, S + extra)`` token windows of dataset indices, padded with ``pad_id``."""
        batch = self.read_batch(indices)
        return batch["windows"].astype(np.int64, copy=False)

    def read_batch(self, indices) -> dict[str, Any]:
        """The raw part of ``__getitems__``: token windows, in the file's dtype when no sample is
        short, else int64 padded with ``pad_id``."""
        idx = np.asarray(indices, dtype=np.int64).ravel()
        arrays = self.indices.arrays()
        try:  # one entry per sample: NumPy's own bounds check (negative indices count from the end)
            samples = arrays["shuffle_index"][idx]
        except IndexError:
            raise IndexError(f"sample indices must lie in [-{len(self)}, {len(self)})") from None
        width = self._width
        seqs, first, lengths, first_offsets = self._pieces(arrays, samples)
        per_sample = np.add.reduceat(lengths, first)
        full = not np.count_nonzero(per_sample - width)  # no padding: keep the file dtype
        token_starts = getattr(self.source, "token_starts", None)
        if token_starts is not None:  # token files: spans of the .bin
            starts = token_starts(seqs)
            starts[first] += first_offsets
            flat = self.source.read_spans(starts, lengths, None if full else np.int64)
        else:
            offsets = np.zeros_like(lengths)
            offsets[first] = first_offsets
            flat = self.source.read_pieces(seqs, offsets, lengths, None if full else np.int64)
        if full:
            return {"windows": flat.reshape(idx.size, width), "padded": False}
        out = np.full((idx.size, width), self.item.pad_id, dtype=np.int64)
        counts = np.minimum(per_sample, width)
        rows = np.repeat(np.arange(idx.size, dtype=np.int64), counts)
        cols = gather_index(np.zeros(idx.size, np.int64), counts)
        out[rows, cols] = flat if flat.size == rows.size else _clip_rows(flat, per_sample, counts)
        return {"windows": out, "padded": True}

    def finish_batch(self, batch: dict[str, Any], alloc: Allocator | None = None) -> dict[str, np.ndarray]:
        """The item fields of a ``read_batch`` result, in arrays made by ``alloc`` (``np.empty``)."""
        return build_items(batch["windows"], self.item, padded=batch["padded"], alloc=alloc)

    def _pieces(self, arrays: dict[str, np.ndarray], samples: np.ndarray):
        """Every sample's pieces (Megatron's last micro-batch of a rank may have no sample): their sequences, the flat index of each
        sample's first piece, the pieces' lengths, and the offset of each first piece in its
        sequence (other pieces start at 0)."""
        # (B, 2, 2) in one lookup; int64 first: uint64 + int64 would promote to float64
        rows = arrays["sample_index"][samples.astype(np.int64, copy=False)[:, None] + _ROW_AND_NEXT]
        begin, end = rows[:, 0], rows[:, 1]
        b = begin[:, 0].astype(np.int64)
        n_pieces = end[:, 0] - b + 1
        ends = n_pieces.cumsum()  # methods, not np.cumsum/np.repeat: less dispatch per call
        first = ends - n_pieces
        pos = np.arange(int(ends[-1]) if ends.size else 0, dtype=np.int64) + (b - first).repeat(n_pieces)
        seqs = arrays["document_index"][pos]
        # fancy indexing, never .take: the .idx arrays are unaligned (34-byte header) and
        # ndarray.take copies a whole unaligned array first (measured 275 us instead of 0.5)
        lengths = self.source.sequence_lengths[seqs].astype(np.int64)
        # Last pieces end at eo (+ the overlap token), clipped to their sequence (the last sample
        # of a partial final epoch may point past its sequence's end); first pieces start at bo.
        last = ends - 1
        lengths[last] = np.minimum(end[:, 1] + self._extra, lengths[last])
        lengths[first] -= begin[:, 1]
        np.maximum(lengths, 0, out=lengths)
        return seqs, first, lengths, begin[:, 1]

    def __getitems__(self, indices) -> dict[str, np.ndarray]:
        return self.finish_batch(self.read_batch(indices))

    def __getitem__(self, index: int | None) -> dict[str, np.ndarray]:
        if index is None:  # Megatron's batch padding: sample 0 with no loss
            item = {k: v[0] for k, v in self.__getitems__([0]).items()}
            item["loss_mask"] = np.zeros_like(item["loss_mask"])
            return item
        return {k: v[0] for k, v in self.__getitems__([index]).items()}


def _clip_rows(flat: np.ndarray, per_sample: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Keep the first ``counts[i]`` of each sample's ``per_sample[i]`` tokens (never needed for
    well-formed indices; guards against a sample longer than its window)."""
    keep = gather_index(np.cumsum(per_sample) - per_sample, counts)
    return flat[keep]
