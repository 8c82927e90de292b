"""Serving the global order to training ranks: samplers, the DataLoader, resumable state."""

from __future__ import annotations

from .collate import to_tensors
from .dataloader import LoaderConfig, TokenloadDataLoader, build_dataloader
from .sampler import CyclicSampler, MicroBatchPlan, PretrainingSampler
from .state import LoaderState

__all__ = [
    "CyclicSampler",
    "LoaderConfig",
    "LoaderState",
    "MicroBatchPlan",
    "PretrainingSampler",
    "TokenloadDataLoader",
    "build_dataloader",
    "to_tensors",
]
