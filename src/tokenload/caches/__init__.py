"""Megatron's index caches: names and identity, files on disk, and caches in a bucket.

A cache holds the arrays of one dataset's order (``index``'s maths) under Megatron's own file
names, so each side loads the other's: ``names`` reproduces Megatron's description and its md5
(the cache key) and names the files; ``files`` writes them atomically (arrays, tokenload
sidecar, description last; a build's caches made durable as one group), loads and checks them;
``bucket`` publishes a cache bound for object storage object by object and reads it through the
node's local copies. This package sits above ``index`` (NumPy only), ``format`` (atomic
writes, mappings) and ``storage`` (uploads, local copies).
"""

from __future__ import annotations

from tokenload.caches.files import (
    DAMAGED_HINT,
    CacheCheck,
    CacheState,
    CacheWriter,
    check_cache,
    list_folder,
    load_cache,
    map_array,
    write_cache,
)
from tokenload.caches.names import (
    BLENDED_ARRAYS,
    CACHE_FILE_NAME,
    GPT_ARRAYS,
    CacheFiles,
    blended_identifiers,
    default_cache_dir,
    describe,
    description_hash,
    gpt_identifiers,
    segment_identifiers,
)

__all__ = [
    "GPT_ARRAYS",
    "BLENDED_ARRAYS",
    "CACHE_FILE_NAME",
    "gpt_identifiers",
    "blended_identifiers",
    "segment_identifiers",
    "describe",
    "description_hash",
    "default_cache_dir",
    "CacheFiles",
    "CacheState",
    "CacheCheck",
    "CacheWriter",
    "write_cache",
    "list_folder",
    "load_cache",
    "map_array",
    "check_cache",
    "DAMAGED_HINT",
]
