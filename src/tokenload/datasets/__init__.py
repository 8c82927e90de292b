"""Datasets: what global sample k holds, built on token files (format/) and orders (index/)."""

from __future__ import annotations

from .build import build_datasets
from .config import MegatronDataConfig
from .flat import FlatDatasetConfig, FlatTokenDataset
from .items import ItemConfig
from .megatron import BlendedDataset, GPTDataset, wait_for_cache_writes
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
