"""Megatron's blended dataset: item k is item ``dataset_sample_index[k]`` of member
``dataset_index[k]``, with ``dataset_id`` added. A batch is read with one vectorized call per
member that appears in it, then scattered back into batch order."""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np

from .gpt import IndexArrays


class BlendedDataset:
    """A weighted mixture of datasets in Megatron's blending order."""

    def __init__(self, datasets: Sequence[Any], indices: IndexArrays, *, identity: str) -> None:
        self.datasets = list(datasets)
        self.indices = indices
        self.identity = identity

    def __len__(self) -> int:
        return int(self.indices["dataset_index"].shape[0])

    @property
    def dataset_index(self) -> np.ndarray:
        return self.indices["dataset_index"]

    @property
    def dataset_sample_index(self) -> np.ndarray:
        return self.indices["dataset_sample_index"]

    @property
    def fingerprint(self) -> str:
        members = "|".join(d.fingerprint for d in self.datasets)
        return hashlib.sha256(f"{self.identity}|{members}".encode()).hexdigest()[:16]

    def __getitems__(self, indices) -> dict[str, np.ndarray]:
        idx = np.asarray(indices, dtype=np.int64).ravel()
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= len(self)):
            raise IndexError(f"sample indices must lie in [0, {len(self)})")
        which = np.asarray(self.dataset_index[idx], dtype=np.int64)
        within = np.asarray(self.dataset_sample_index[idx], dtype=np.int64)
        out: dict[str, np.ndarray] = {}
        for d in np.unique(which).tolist():
            rows = np.flatnonzero(which == d)
            part = self.datasets[d].__getitems__(within[rows])
            for key, value in part.items():
                if key not in out:
                    out[key] = np.empty((idx.size, *value.shape[1:]), dtype=value.dtype)
                out[key][rows] = value
        out["dataset_id"] = which
        return out

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}
