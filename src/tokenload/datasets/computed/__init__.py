"""The computed order: windows of ``sequence_length`` tokens in a keyed permutation, on demand.

``computed_dataset`` builds a configuration's splits (no index build, no cache, no barrier) and
holds the per-source dataset; ``computed_blend`` is the blend whose weights may change between a
save and a resume; ``extents`` reads what of a token file a split holds. The window permutation
and the mixture maths are ``tokenload.index.window_order`` and ``tokenload.index.mixture``.
"""

from __future__ import annotations

from .computed_blend import ComputedBlendedDataset
from .computed_dataset import ComputedGPTDataset, ComputedOptions, build_computed_datasets

__all__ = [
    "ComputedBlendedDataset",
    "ComputedGPTDataset",
    "ComputedOptions",
    "build_computed_datasets",
]
