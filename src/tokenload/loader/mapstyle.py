"""The one edge where the loader takes a dataset that is not a ``contract.LoaderDataset``.

``build_dataloader`` also serves a plain map-style dataset, as torch's DataLoader does:
``__len__`` with a vectorized ``__getitems__`` (the batch as one dict of arrays) or per-sample
``__getitem__`` (a list of items, collated by ``collate.to_tensors``). ``loader_dataset`` wraps
such a dataset in ``MapStyleDataset``, which implements the contract from what the dataset has:
one source named after its type, one pass over it per epoch, its ``fingerprint`` and
``startup_phases`` when it has them. Optional capabilities are looked up here once, so the rest of
the loader sees the contract only. A dataset with ``read_batch`` and ``finish_batch`` (a wrapper
of a tokenload dataset, say) keeps its two-stage reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

import numpy as np

from ..contract import (
    Allocator,
    Batch,
    BatchSource,
    LoaderDataset,
    MixtureCursors,
    SourceInfo,
    Sources,
)

__all__ = [
    "AnyDataset",
    "BatchMapDataset",
    "GroupReader",
    "MapDataset",
    "MapStyleDataset",
    "loader_dataset",
]


class MapDataset(Protocol):
    """A plain map-style dataset: its length and its items."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class BatchMapDataset(Protocol):
    """A map-style dataset that reads a batch in one call (as torch's DataLoader calls it)."""

    def __len__(self) -> int: ...

    def __getitems__(self, indices: Sequence[int]) -> Any: ...


class GroupReader(Protocol):
    """A dataset that reads a micro-batch in two stages, as a contract dataset does (a wrapper of
    a tokenload dataset, say)."""

    def read_batch(self, indices: Sequence[int] | np.ndarray) -> Batch: ...

    def finish_batch(self, batch: Batch, alloc: Allocator | None = None) -> Batch: ...


AnyDataset = LoaderDataset | BatchMapDataset | MapDataset
"""What ``build_dataloader`` takes."""


def loader_dataset(dataset: AnyDataset) -> LoaderDataset:
    """``dataset`` itself when it implements the contract, else it wrapped in
    ``MapStyleDataset``."""
    if isinstance(dataset, BatchSource):  # methods only: no property is evaluated
        return cast(LoaderDataset, dataset)  # its properties: checked by type checkers
    return MapStyleDataset(dataset)


class MapStyleDataset:
    """A map-style dataset behind the loader's contract (module docstring)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._vectorized = hasattr(dataset, "__getitems__")
        self.reads_in_groups = hasattr(dataset, "read_batch") and hasattr(dataset, "finish_batch")
        """A dataset with ``read_batch``/``finish_batch``: workers read micro-batches in groups."""
        self._groups: GroupReader | None = dataset if self.reads_in_groups else None

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def fingerprint(self) -> str:
        """The dataset's own (read when asked: it may read a file), else its type and length."""
        own = getattr(self.dataset, "fingerprint", None)
        if own is not None:
            return str(own)
        return f"{type(self.dataset).__qualname__}:{len(self.dataset)}"

    @property
    def startup_phases(self) -> Mapping[str, float]:
        phases = getattr(self.dataset, "startup_phases", None)
        return dict(phases) if isinstance(phases, dict) else {}

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> Any:
        """Its ``__getitems__`` (as torch's DataLoader calls it), else a list of its items."""
        if self._vectorized:
            return self.dataset.__getitems__(indices)
        return [self.dataset[i] for i in indices]

    def read_batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        if self._groups is not None:
            return self._groups.read_batch(indices)
        # a vectorized dataset's dict of arrays; else the list of items that collate.to_tensors
        # turns into one (the contract's one read type names the dict)
        batch: Batch = self.__getitems__(indices)
        return batch

    def finish_batch(self, batch: Batch, alloc: Allocator | None = None) -> Batch:
        if self._groups is not None:
            return self._groups.finish_batch(batch, alloc)
        return batch

    def describe_sources(self) -> Sources:
        name = type(self.dataset).__name__
        return Sources(members=(SourceInfo(name=name, key=name),))

    def epoch_sizes(self) -> list[int]:
        return [len(self.dataset)]

    def sample_bytes(self) -> list[int | None]:
        return [None]

    def blend_index(self) -> np.ndarray | None:
        return None

    def mixture_cursors(self) -> MixtureCursors | None:
        return None
