"""Datasets: what global sample k holds, built on token files (format/) and orders (index/)."""

from __future__ import annotations

from .flat import FlatDatasetConfig, FlatTokenDataset

__all__ = ["FlatDatasetConfig", "FlatTokenDataset"]
