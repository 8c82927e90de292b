"""Datasets: what global sample k holds, built on token files (format/) and orders (index/)."""

from __future__ import annotations

from .blended import BlendedDataset
from .builder import MegatronDataConfig, build_datasets
from .flat import FlatDatasetConfig, FlatTokenDataset
from .gpt import GPTDataset
from .index_cache import wait_for_cache_writes
from .items import ItemConfig
from .sources import MockSource

__all__ = [
    "BlendedDataset",
    "FlatDatasetConfig",
    "FlatTokenDataset",
    "GPTDataset",
    "ItemConfig",
    "MegatronDataConfig",
    "MockSource",
    "build_datasets",
    "wait_for_cache_writes",
]
