"""The parts of the loader's contract (``contract.LoaderDataset``) that several dataset kinds
answer alike: a dataset over one source, and a blend of member datasets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..contract import MixtureCursors, SourceInfo, Sources
from ..format import TokenFile
from .items import ItemConfig
from .sources import TokenSource


class OneSourceContract:
    """The part of the loader's contract (``contract.LoaderDataset``) that every dataset over
    one source (a token file or Megatron's mock sequences, ``self.source``, with its item
    layout ``self.item``) answers alike: Megatron's GPT dataset and the computed order's."""

    source: TokenSource
    item: ItemConfig

    reads_in_groups = True
    """A loader worker may read several micro-batches with one ``read_batch``."""

    def describe_sources(self) -> Sources:
        """One source: the token file's prefix (``MockSource`` for the mock data)."""
        source = self.source
        name = str(source.prefix) if isinstance(source, TokenFile) else type(source).__name__
        info = SourceInfo(name=name, key=name, sequence_length=self.item.sequence_length)
        return Sources(members=(info,), packed=bool(getattr(self, "packed", False)))

    def sample_bytes(self) -> list[int | None]:
        """``window x itemsize`` of the token file (None for the mock data, which reads none)."""
        if not isinstance(self.source, TokenFile):
            return [None]
        return [self.item.window * np.dtype(self.source.dtype).itemsize]

    def blend_index(self) -> np.ndarray | None:
        return None

    def mixture_cursors(self) -> MixtureCursors | None:
        return None


class BlendContract:
    """The loader's contract of a blend of ``self.datasets`` (what ``dataset_id`` numbers): the
    members' sources, epoch sizes and sample sizes in member order, each member keyed by
    ``member_keys`` (the blend's identity for it)."""

    datasets: list[Any]

    reads_in_groups = True
    """A loader worker may read several micro-batches with one ``read_batch``."""

    def member_keys(self, names: list[str]) -> Sequence[str]:
        raise NotImplementedError

    def describe_sources(self) -> Sources:
        """The members, keyed by ``member_keys``."""
        infos = [info for d in self.datasets for info in d.describe_sources().members]
        keys = self.member_keys([info.name for info in infos])
        members = tuple(replace(info, key=key) for info, key in zip(infos, keys))
        packed = bool(getattr(self.datasets[0], "packed", False))
        return Sources(members=members, blended=True, packed=packed)

    def epoch_sizes(self) -> list[int]:
        return [size for d in self.datasets for size in d.epoch_sizes()]

    def sample_bytes(self) -> list[int | None]:
        return [size for d in self.datasets for size in d.sample_bytes()]
