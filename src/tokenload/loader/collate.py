"""Batches as tensors: a dict of stacked NumPy arrays becomes a dict of int64/float tensors with
no per-sample Python work. Datasets with ``__getitems__`` already return the stacked dict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..contract import Allocator, LoaderDataset


def fetch(dataset: LoaderDataset, indices: Sequence[int], alloc: Allocator | None = None) -> Any:
    """One micro-batch of ``dataset``: its ``__getitems__`` (as torch's DataLoader calls it).
    With ``alloc``, a dataset that reads in two stages (``reads_in_groups``, like tokenload's)
    builds its fields in arrays from it."""
    if alloc is not None and dataset.reads_in_groups:
        return dataset.finish_batch(dataset.read_batch(indices), alloc)
    return dataset.__getitems__(indices)


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
