"""The GPT-NeoX order: NeoX's ``GPT2Dataset``/``BlendableDataset`` samples, and its YAML configs.

``neox_dataset`` builds a configuration's splits (in memory, on every rank), ``neox_indices`` is
NeoX's index maths (NumPy), and ``neox_yaml`` reads NeoX's YAML files into
``MegatronDataConfig`` fields, with ``neox_launch`` counting the job's GPUs as NeoX's launcher
does (hostfile, ``num_nodes``, ``num_gpus``).
"""

from __future__ import annotations

from .neox_dataset import NeoXGPTDataset, NeoxOptions, build_neox_datasets
from .neox_yaml import NEOX_NON_DATA_KEYS, NEOX_UNSUPPORTED_DATA_KEYS, neox_config_from_yaml

__all__ = [
    "NEOX_NON_DATA_KEYS",
    "NEOX_UNSUPPORTED_DATA_KEYS",
    "NeoXGPTDataset",
    "NeoxOptions",
    "build_neox_datasets",
    "neox_config_from_yaml",
]
