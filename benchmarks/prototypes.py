"""Read-path ideas of issue 15, prototyped outside ``src`` so they can be measured before anyone
changes the library: page-table population (``madvise``) of a batch's spans, in the reading
thread or from a loader worker's idle time, and larger read groups per worker.

``apply_variant`` patches ``tokenload.loader.worker_main`` in this process; loader workers made by
``fork`` (Linux's default) inherit the patch. Each variant names the ``src`` change it stands for
in ``VARIANTS``.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import functools
import mmap
from typing import Any

import numpy as np

MADV_WILLNEED = mmap.MADV_WILLNEED
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14; Python >= 3.12 names it
PAGE = mmap.PAGESIZE

VARIANTS = {
    "mmap": "today's default (read_mode='mmap', prefetch 4: groups of 2 per worker)",
    "pread": "read_mode='pread': one preadv per span into a fresh array, no mapping",
    "populate": "madvise(MADV_POPULATE_READ) of the batch's spans just before reading it (same thread)",
    "read-only": "in-process decomposition: read_batch alone (windows in the file dtype, no item fields)",
    "lean-fields": "fields as views: one int64 cast of the windows, tokens/labels its two offset views, "
    "position_ids and loss_mask broadcast (default config only: no EOD options, no padding)",
    "prefetch8": "prefetch_factor=8: groups of 4 micro-batches per worker read",
    "group8": "prefetch_factor=16 and _GROUP=8: groups of 8 per worker read",
    "ahead-populate": "worker: after sending a group, MADV_POPULATE_READ the spans of its next group",
    "ahead-willneed": "worker: after sending a group, MADV_WILLNEED the spans of its next group",
}
IN_PROCESS_VARIANTS = ("pread", "populate", "read-only", "lean-fields")
WORKER_VARIANTS = ("pread", "prefetch8", "group8", "ahead-populate", "ahead-willneed")


def batch_spans(ds: Any, indices) -> tuple[np.ndarray, np.ndarray]:
    """Page-aligned byte offsets and lengths of the ``.bin`` ranges a batch of dataset indices
    reads (what ``GPTDataset.read_batch`` reads, from the same index arrays)."""
    arrays = ds.indices.arrays()
    samples = arrays["shuffle_index"][np.asarray(indices, dtype=np.int64)]
    seqs, first, lengths, first_offsets = ds._pieces(arrays, samples)[:4]  # newer src returns more
    starts = ds.source.token_starts(seqs)
    starts[first] += first_offsets
    itemsize = ds.source.dtype.itemsize
    begin = starts * itemsize
    aligned = begin - begin % PAGE
    return aligned, begin + lengths * itemsize - aligned


def advise(ds: Any, indices, advice: int) -> None:
    """``madvise`` every span a batch of ``indices`` reads (mmap read mode only)."""
    mapping = ds.source._opened().bin._map
    if mapping is None:
        return
    starts, lengths = batch_spans(ds, indices)
    base = mapping.ctypes.data  # the .bin is a NumPy view of its mapping (format.descriptors)
    for start, length in zip(starts.tolist(), lengths.tolist()):
        if length > 0 and _LIBC.madvise(ctypes.c_void_p(base + start), ctypes.c_size_t(length),
                                        advice) != 0:
            raise OSError(ctypes.get_errno(), "madvise failed")


_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


class _Peek:
    """An iterator that can look ahead without consuming."""

    def __init__(self, it) -> None:
        self._it, self._ahead = it, collections.deque()

    def __iter__(self):
        return self

    def __next__(self):
        return self._ahead.popleft() if self._ahead else next(self._it)

    def peek(self, n: int) -> list:
        while len(self._ahead) < n:
            try:
                self._ahead.append(next(self._it))
            except StopIteration:
                break
        return list(self._ahead)[:n]


@functools.lru_cache(maxsize=4)
def _constants(seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Read-only ``arange(seq)`` (int64) and ``ones(seq)`` (float32), shared by every batch."""
    pos, ones = np.arange(seq, dtype=np.int64), np.ones(seq, dtype=np.float32)
    pos.flags.writeable = ones.flags.writeable = False
    return pos, ones


def lean_items(ds: Any, indices) -> dict[str, np.ndarray]:
    """``__getitems__`` with the fields as views where the default config allows it: one int64
    conversion of the ``(B, S + 1)`` windows, tokens and labels its two offset views, position_ids
    and loss_mask stride-0 broadcasts (what 3 of the 4 fields cost: 640 of 896 KiB written per
    batch of 16 at S = 2048)."""
    raw = ds.read_batch(indices)
    item = ds.item
    if raw["padded"] or item.eod_mask_loss or item.reset_position_ids or not item.add_extra_token or item.pad_id >= 0:
        return ds.finish_batch(raw)
    wide = raw["windows"].astype(np.int64)
    batch, seq = wide.shape[0], wide.shape[1] - 1
    pos, ones = _constants(seq)
    return {"tokens": wide[:, :-1], "labels": wide[:, 1:], "loss_mask": np.broadcast_to(ones, (batch, seq)),
            "position_ids": np.broadcast_to(pos, (batch, seq))}


def _ahead_worker(base: type, advice: int) -> type:
    """A loader worker class that, right after sending a group (the consumer then has work and
    the worker would wait for credits), advises the spans of its next group."""

    class AheadWorker(base):
        def handle(self, message: Any) -> None:
            from tokenload.loader.messages import Start

            super().handle(message)
            if isinstance(message, Start) and self.work is not None:
                self.work = _Peek(self.work)

        def make(self, count: int) -> None:
            super().make(count)
            if isinstance(self.work, _Peek):
                steps = self.work.peek(max(self.target, count))
                if steps:
                    advise(self.dataset, [i for _, idx in steps for i in idx], advice)

    return AheadWorker


def apply_variant(variant: str) -> dict:
    """Patch this process for ``variant``; returns the keyword arguments it adds:
    ``read_mode`` for the dataset, ``loader`` for ``build_dataloader``, ``before_batch`` for
    in-process reads (called with the dataset and a batch's indices before the batch is read),
    ``read`` (None, or what reads a batch in-process instead of ``ds.__getitems__``)."""
    from tokenload.loader import worker_main as workers  # the workers' side of the loader

    out: dict = {"read_mode": "pread" if variant == "pread" else "mmap", "loader": {}, "before_batch": None,
                 "read": None}
    if variant == "read-only":
        out["read"] = lambda ds, idx: ds.read_batch(idx)
    elif variant == "lean-fields":
        out["read"] = lean_items
    elif variant == "populate":
        out["before_batch"] = lambda ds, idx: advise(ds, idx, MADV_POPULATE_READ)
    elif variant == "prefetch8":
        out["loader"] = {"prefetch_factor": 8}
    elif variant == "group8":
        workers._GROUP = 8
        out["loader"] = {"prefetch_factor": 16}
    elif variant.startswith("ahead-"):
        advice = MADV_POPULATE_READ if variant == "ahead-populate" else MADV_WILLNEED
        workers._Worker = _ahead_worker(workers._Worker, advice)
    elif variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}")
    return out
