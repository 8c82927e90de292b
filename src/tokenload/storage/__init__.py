"""Where bytes come from: local files, or objects behind fsspec URLs (``s3://`` and others).

A token file prefix may be a URL everywhere a local prefix works. Its ``.idx`` is copied once per
node into a local cache (``local_copies``) and then read like a local index; its ``.bin`` is read by
ranged GETs of whole chunks with a per-process LRU cache and a background read-ahead
(``chunks``); every request is retried and every failure is a ``StorageError`` (``remote``).
Settings come from ``TOKENLOAD_*`` environment variables (``options``); credentials only from the
client library's usual sources.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .local_copies import cached_copy, fetch_copy, file_size, local_folder, local_path
from .options import StorageOptions
from .remote import is_url, stats

if TYPE_CHECKING:
    import numpy as np

    from ..byte_source import ByteSource

__all__ = [
    "StorageOptions",
    "cached_copy",
    "fetch_copy",
    "file_size",
    "is_url",
    "local_folder",
    "local_path",
    "open_remote_bin",
    "stats",
]


def open_remote_bin(url: str, dtype: np.dtype) -> ByteSource:
    """A ``byte_source.ByteSource`` reading the ``.bin`` object at ``url`` in chunks."""
    from .chunks import RemoteBin

    return RemoteBin(url, dtype)
