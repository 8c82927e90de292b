"""tokenload: LLM pretraining data from raw text to the batches of thousands of training ranks.

Importing this package is cheap: no torch, no I/O, no logging setup. Submodules are loaded on
first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    # errors
    "TokenloadError": "tokenload.errors",
    "FormatError": "tokenload.errors",
    "ConfigError": "tokenload.errors",
    "RecordError": "tokenload.errors",
    "StorageError": "tokenload.errors",
    "CacheError": "tokenload.errors",
    "StateError": "tokenload.errors",
    "MissingExtraError": "tokenload.errors",
    # token files
    "TokenFileWriter": "tokenload.format",
    "TokenFile": "tokenload.format",
    "FlatTokenFile": "tokenload.format",
    "ReadMode": "tokenload.format",
    "open_token_file": "tokenload.format",
    "merge_token_files": "tokenload.format",
    # preprocessing
    "preprocess": "tokenload.preprocess",
    "PreprocessConfig": "tokenload.preprocess",
    "TokenizerSpec": "tokenload.preprocess",
    "write_stdlib_corpus": "tokenload.preprocess",
    # loading
    "build_dataloader": "tokenload.loader",
    "LoaderConfig": "tokenload.loader",
    "FlatTokenDataset": "tokenload.datasets",
    "FlatDatasetConfig": "tokenload.datasets",
    "MegatronDataConfig": "tokenload.datasets",
    "build_datasets": "tokenload.datasets",
    "TokenloadDataModule": "tokenload.integrations.lightning",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenload' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
