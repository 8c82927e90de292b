"""Datasets: what global sample k holds, built on token files (format/) and orders (index/)."""

from __future__ import annotations

# the config importers register themselves with MegatronDataConfig (from_megatron_args, ...)
from . import megatron_flags as _megatron_flags  # noqa: F401
from .build import build_datasets
from .config import MegatronDataConfig, Splits
from .flat import FlatDatasetConfig, FlatTokenDataset
from .items import ItemConfig
from .megatron import BlendedDataset, GPTDataset, wait_for_cache_writes
from .neox import neox_yaml as _neox_yaml  # noqa: F401
from .sources import MockSource

__all__ = [
    "BlendedDataset",
    "FlatDatasetConfig",
    "FlatTokenDataset",
    "GPTDataset",
    "ItemConfig",
    "MegatronDataConfig",
    "MockSource",
    "Splits",
    "build_datasets",
    "wait_for_cache_writes",
]
