"""Index caches in object storage (``path_to_cache="s3://bucket/cache"``): made locally, published
file by file, read through the node's local copy cache.

An object cannot be renamed into place, but one PUT appears whole or not at all. So a cache bound
for a bucket is written by the ordinary atomic writer into a local staging folder
(``storage.upload.staging_folder``) and then uploaded in the order that makes a partial publish
harmless: the old description is deleted first (a reader sees a miss while the files change), then
the arrays, the tokenload sidecar, and Megatron's description last. Whatever a killed or failed
upload leaves lacks its description, which is Megatron's and tokenload's test of completeness, so
it is never loaded. The build manifest goes up after every cache it names (``datasets.manifest``).

Reading: each file is copied once per node into the local copy cache keyed by its URL and ETag
(``storage.cached_copy``, under a lock, so concurrent ranks download once), and the copies are
checked and mapped exactly as a local cache's files. A replaced object has another ETag, hence
another copy: a stale copy is never read.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from ..errors import CacheError
from ..storage.upload import copy_or_none, remove_object, staging_folder, upload_file
from .cache import CacheFiles

__all__ = ["local_copies", "publish_cache", "staged_cache"]


def local_copies(files: CacheFiles) -> dict[str, str | None]:
    """``{suffix: local copy or None}`` of the cache's files (description, sidecar, arrays). None
    for a missing one; nothing else is fetched once Megatron's files are found incomplete."""
    suffixes = ["description.txt", *(f"{name}.npy" for name in files.arrays)]
    copies: dict[str, str | None] = {}
    for suffix in suffixes:
        copies[suffix] = copy_or_none(files.path(suffix))
        if copies[suffix] is None:
            break
    copies["tokenload.json"] = copy_or_none(files.sidecar) if all(copies.values()) else None
    return copies


@contextlib.contextmanager
def staged_cache(files: CacheFiles) -> Iterator[CacheFiles]:
    """Local files to write the cache ``files`` (in a bucket) to; their staged copies are removed
    when the block ends, published or not."""
    local = CacheFiles(directory=staging_folder(files.directory), hash=files.hash, class_name=files.class_name,
                       split=files.split, arrays=files.arrays)
    hint = (f"a cache bound for a bucket is made in the local staging folder {local.directory} first: set"
            " TOKENLOAD_STAGING_DIR to a writable local folder")
    try:
        os.makedirs(local.directory, exist_ok=True)
    except OSError as exc:
        raise CacheError(f"cannot make the staging folder of the cache ({exc.strerror or exc})",
                         path=files.directory, hint=hint) from None
    try:
        yield local
    except CacheError as exc:
        if exc.path != local.directory:
            raise
        raise CacheError(exc.message, path=files.directory, hint=hint) from None
    finally:
        for suffix in ("description.txt", "tokenload.json", *(f"{name}.npy" for name in files.arrays)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local.path(suffix))


def publish_cache(local: CacheFiles, remote: CacheFiles) -> None:
    """Upload a complete local cache to ``remote``: the old description deleted first, then the
    arrays, the sidecar, and the description last (see the module docstring)."""
    remove_object(remote.description)
    for name in remote.arrays:
        upload_file(local.array(name), remote.array(name))
    upload_file(local.sidecar, remote.sidecar)
    upload_file(local.description, remote.description)

