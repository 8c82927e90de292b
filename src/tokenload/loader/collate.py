"""Batches as tensors: a dict of stacked NumPy arrays becomes a dict of int64/float tensors with
no per-sample Python work. Datasets with ``__getitems__`` already return the stacked dict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..contract import PIECE_FIRST, PIECE_LENGTH, ROW_COUNTS, Allocator, LoaderDataset, row_counts

_INT64 = np.dtype(np.int64)

PACKING_COUNTS = "_tokenload_packing_counts"
"""A field that packed micro-batches carry from where they are made (a worker) to the loader,
which takes it out before handing the batch over (``accounting.PackingCounts``): int64
``(B, 2)``, each row's documents (pieces beginning among its S inputs) and its padding label
slots (``contract.row_counts``). Counted from the read's own ``row_tokens`` and pieces, so the
training process does not search the finished fields for them; out of a worker's ring slot it
comes as a copy of its bytes, not as a tensor (``ConsumerRing``'s raw fields: nothing to make,
nothing of the slot held)."""


def fetch(
    dataset: LoaderDataset,
    indices: Sequence[int],
    alloc: Allocator | None = None,
    *,
    packed: bool = False,
) -> Any:
    """One micro-batch of ``dataset``: its ``__getitems__`` (as torch's DataLoader calls it).
    A dataset that reads in two stages (``reads_in_groups``, like tokenload's) is read, then
    finished by ``finish``, when ``alloc`` is given (its fields made in arrays from it) or its
    rows are ``packed`` (``describe_sources``: their counts made with them)."""
    if dataset.reads_in_groups and (alloc is not None or packed):
        return finish(dataset, dataset.read_batch(indices), alloc)
    return dataset.__getitems__(indices)


def finish(dataset: LoaderDataset, read: Any, alloc: Allocator | None = None) -> Any:
    """``dataset.finish_batch`` of a ``read_batch`` result; packed rows (a read with
    ``row_tokens``) also get their ``PACKING_COUNTS``: the read's own (``ROW_COUNTS``, made once
    for all the micro-batches of a read), else worked out from its pieces."""
    out = dataset.finish_batch(read, alloc)
    row_tokens = read.get("row_tokens") if isinstance(read, dict) else None
    if row_tokens is not None and isinstance(out, dict) and "tokens" in out:
        counts = read.get(ROW_COUNTS)
        if counts is None:
            seq = int(out["tokens"].shape[1])
            counts = packing_counts(read[PIECE_FIRST], read[PIECE_LENGTH], row_tokens, seq)
        if alloc is not None:  # made in the worker's ring slot, as the fields are: no copy later
            counts, made = alloc(counts.shape, _INT64), counts
            np.copyto(counts, made)
        out[PACKING_COUNTS] = counts
    return out


def packing_counts(
    first: np.ndarray, length: np.ndarray, row_tokens: np.ndarray, seq: int
) -> np.ndarray:
    """``PACKING_COUNTS`` of packed rows (``packed_rows.row_counts``: int64 ``(rows, 2)``, each
    row's documents among its inputs and its padding label slots), worked out from their pieces:
    S inputs each, ``row_tokens`` tokens in their window and their pieces flat (``first``: each
    row's first piece; ``length``: every piece's tokens)."""
    documents = np.zeros(row_tokens.shape[0], dtype=np.int64)
    if documents.size:  # a row's pieces, less its last when that begins at slot S (the label slot)
        np.subtract(first[1:], first[:-1], out=documents[:-1])
        documents[-1] = length.size - first[-1]
        documents -= (row_tokens - length[first + documents - 1]) >= seq
    return row_counts(documents, row_tokens, seq)


def to_tensors(batch: Any) -> Any:
    """Convert a ``__getitems__`` result (dict of arrays) or a list of per-sample dicts to
    tensors."""
    import torch

    if isinstance(batch, dict):
        return {
            k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
            for k, v in batch.items()
        }
    if isinstance(batch, list) and batch and isinstance(batch[0], dict):
        return to_tensors({k: np.stack([np.asarray(s[k]) for s in batch]) for k in batch[0]})
    from torch.utils.data import default_collate

    return default_collate(batch)
