"""Index caches in object storage (``path_to_cache="s3://bucket/cache"``): made locally, published
file by file, read through the node's local copy cache.

An object cannot be renamed into place, but one PUT appears whole or not at all. So a cache bound
for a bucket is written by the ordinary atomic writer into a local staging folder
(``storage.upload.staging_folder``) and then uploaded in the order that makes a partial publish
harmless: the old description is deleted first (a reader sees a miss while the files change), then
the arrays, the tokenload sidecar, and Megatron's description last. Whatever a killed or failed
upload leaves lacks its description, which is Megatron's and tokenload's test of completeness, so
it is never loaded. The build manifest goes up after every cache it names
(``datasets.megatron.manifest``).

Several writers of one cache (two ``prepare-cache`` runs of one job, started together): each
stages in a folder of its own (``storage.upload.temporary_folder``, named by host and process), so
none removes another's staged files. Before publishing, a writer reads the bucket's description
and sidecar: when both are byte for byte its own, another writer has published the same cache
(or a rebuild repairs a damaged array); the writer then only uploads its arrays again (the same
bytes, or a repair) and leaves the description and sidecar in place, so no reader sees the cache
vanish, and it logs that it found the cache published. A description that differs is deleted
first as before. A description goes up only after all of its writer's arrays and sidecar, so
failed writers, however they interleave, leave no cache a reader takes for complete.

Reading: each file is copied once per node into the local copy cache keyed by its URL and ETag
(``storage.cached_copy``, under a lock, so concurrent ranks download once), and the copies are
checked and mapped exactly as a local cache's files. A replaced object has another ETag, hence
another copy: a stale copy is never read.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterator

from ..errors import CacheError, StorageError
from ..storage.upload import copy_or_none, read_object, remove_object, temporary_folder, upload_file
from .names import CacheFiles

logger = logging.getLogger(__name__)

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
    """Local files to write the cache ``files`` (in a bucket) to, in a staging folder of this
    writer's own, removed when the block ends, published or not."""
    hint = (
        "a cache bound for a bucket is made in a local staging folder first (under"
        " TOKENLOAD_STAGING_DIR, by default the temporary folder): set TOKENLOAD_STAGING_DIR"
        " to a writable local folder"
    )
    try:
        folder = temporary_folder(".cache-")
    except StorageError as exc:
        raise CacheError(
            f"cannot make the staging folder of the cache ({exc.message})",
            path=files.directory,
            hint=hint,
        ) from None
    local = CacheFiles(
        directory=folder,
        hash=files.hash,
        class_name=files.class_name,
        split=files.split,
        arrays=files.arrays,
    )
    try:
        yield local
    except CacheError as exc:
        if exc.path != local.directory:
            raise
        raise CacheError(exc.message, path=files.directory, hint=hint) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def publish_cache(local: CacheFiles, remote: CacheFiles) -> bool:
    """Upload a complete local cache to ``remote`` (see the module docstring): the arrays, the
    sidecar and the description last, after deleting a different description. False when the
    same cache was found published already (its arrays are uploaded again, nothing else)."""
    with open(local.description, "rb") as f:
        description = f.read()
    with open(local.sidecar, "rb") as f:
        sidecar = f.read()
    published = read_object(remote.description)  # None when absent; other failures raise
    same = published == description and read_object(remote.sidecar) == sidecar
    if published is not None and not same:
        remove_object(remote.description)
    for name in remote.arrays:
        upload_file(local.array(name), remote.array(name))
    if same:
        logger.info(
            "index cache %s was already published with the same description and sidecar"
            " (by another writer, or damaged): kept them, uploaded its arrays again",
            remote.description,
        )
        return False
    upload_file(local.sidecar, remote.sidecar)
    upload_file(local.description, remote.description)
    return True
