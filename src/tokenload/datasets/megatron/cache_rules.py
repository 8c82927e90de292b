"""The index arrays of one ``build_datasets`` call, from and to Megatron's cache files.

For each dataset the builder asks ``IndexCache.indices`` for its arrays; the process's build role
(``policy``) decides what that means: build in memory (``MEMORY``, or no cache folder),
load a cache or record it as missing (``READ``), load or build without writing (``CHECK``), or
load, build and write (``WRITE``). The cache files are named and written as Megatron's
(``caches.names``, ``caches.files``), so a cache Megatron wrote loads here and the reverse.

Unlike Megatron, a cache is checked before use: the description text, the arrays' dtypes and
shapes (against those the configuration implies) and, when tokenload wrote it, a sidecar with
what Megatron's hash forgets (extra token, validation drop-last, the token files' sizes, their
sidecar hashes when they have one, and an xxh3 of each ``.idx``'s sequence lengths and document
indices: what the indices depend on, so a file rewritten to the same sizes is noticed). A stale
cache is rebuilt (``cache="auto"``) or refused (``cache="strict"``), never silently reused. The
sidecar's xxh3-64 of each array is verified by ``check_cache`` (arrays up to 256 MiB) or where the
array is first mapped; a cache without a sidecar is checked against the token file's current
lengths on its first use (``cache_match``).

A writer with ``behind`` set (``auto`` on many ranks) serves its arrays from memory and writes
them afterwards in a thread (``write_behind``); ``wait_for_cache_writes`` waits for those writes.
Otherwise, within ``grouped()`` (the builder's whole build), every cache and the build manifest
are written as one group (``caches.CacheWriter``): temporaries first, one durable step, then
each put in place, the manifest last; nothing is read under its final name before the group is
published (``publish``). Each cache folder is listed once per build (``caches.list_folder``)
instead of one lookup per file and cache.

Separate from ``builder`` because this is the cache's trust and write rules, whatever
dataset the arrays belong to; the builder plans the splits and makes the datasets.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...caches import (
    CACHE_FILE_NAME,
    CacheCheck,
    CacheFiles,
    CacheState,
    CacheWriter,
    check_cache,
    list_folder,
    map_array,
    write_cache,
)
from ...caches.files import array_digests
from ...errors import CacheError
from ...format.atomic import remove_stale_in_listing
from ...storage import is_url
from .gpt_dataset import IndexArrays
from .manifest import ManifestFile, write_manifest
from .policy import Role

__all__ = ["IndexCache", "wait_for_cache_writes", "write_behind"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedIndices:
    """A dataset's index arrays, and its build-manifest entry when a cache file backs them."""

    indices: IndexArrays
    entry: dict[str, Any] | None


@dataclass(frozen=True)
class PendingWrite:
    """A cache the writer serves from memory and writes behind its first batches."""

    files: CacheFiles
    description: str
    arrays: dict[str, Any]
    fields: dict[str, Any]
    digests: dict[str, str]


class IndexCache:
    """One build's index arrays as its role says, and what the build must do afterwards: the
    caches a loading rank found missing, the caches left to write behind, whether it wrote one."""

    def __init__(
        self,
        role: Role,
        cache: str,
        *,
        behind: bool,
        phase: Callable[[str], AbstractContextManager[None]],
    ) -> None:
        self.role = role
        self.cache = cache
        """``MegatronDataConfig.cache``: a stale cache is rebuilt (``auto``) or refused
        (``strict``)."""
        self.behind = behind
        """A writer that serves from memory and leaves its writes in ``deferred`` for
        ``write_behind``."""
        self.phase = phase
        """The builder's timer of startup phases (``index_build``, ``index_load``,
        ``cache_write``)."""
        self.missing: list[str] = []
        """A loading rank's caches not found (``name: reasons``), for ``policy.missing_cache``."""
        self.folders: list[str] = []
        """The folders of ``missing``."""
        self.wanted: list[tuple[str, str]] = []
        """Each of ``missing``'s folder and description (``near_miss.near_misses``)."""
        self.deferred: list[PendingWrite] = []
        """The caches left to ``write_behind``."""
        self.wrote = False
        """A cache file was written by this build: the build manifest must then follow."""
        self.writer: CacheWriter | None = None
        """The group the caches are written into, inside ``grouped()``."""
        self._listings: dict[str, frozenset[str] | None] = {}
        self._lock = threading.Lock()

    @contextmanager
    def grouped(self) -> Iterator[None]:
        """Write the caches and the manifest of the block as one group, published when the block
        ends (discarded when it raises)."""
        self.writer = CacheWriter()
        try:
            yield
        except BaseException:
            self.writer.discard()
            raise
        else:
            self.publish()
        finally:
            self.writer = None

    def publish(self) -> None:
        """Put the group's caches written so far in place (before anything reads them)."""
        if self.writer is not None:
            with self.phase("cache_write"):
                self.writer.publish()

    def _listing(self, folder: str) -> frozenset[str] | None:
        """The folder's names, listed once per build (None: look each file up). A writer also
        deletes the temporaries that killed writers left there (``remove_stale_in_listing``)."""
        with self._lock:
            if folder not in self._listings:
                names = list_folder(folder)
                if names and self.role is Role.WRITE:
                    remove_stale_in_listing(folder, names, CACHE_FILE_NAME)
                self._listings[folder] = names
            return self._listings[folder]

    def indices(
        self,
        folder: str | None,
        uid: Mapping[str, Any],
        description: str,
        build: Callable[[], dict[str, np.ndarray]],
        fields: dict[str, Any],
        expected: Mapping[str, tuple[int, ...]],
        consistent: Callable[[dict[str, np.ndarray]], list[str]] | None = None,
    ) -> CachedIndices:
        """The dataset's index arrays as the role says, and its manifest entry when cached.
        ``consistent(arrays)``: why a cache without a sidecar (Megatron's) does not fit the
        current token file (``cache_match``), checked on its first use; a mismatch is a stale
        cache."""
        if folder is None or self.role is Role.MEMORY:
            with self.phase("index_build"):
                return CachedIndices(IndexArrays(arrays=build()), None)
        files = CacheFiles.of(folder, uid, description)
        paths = {name: files.array(name) for name in files.arrays}
        with self.phase("index_load"):
            check = check_cache(
                files,
                description=description,
                fields=fields,
                expected_shapes=expected,
                listing=self._listing(folder),
            )
            if check.state is CacheState.HIT and not check.has_sidecar and consistent is not None:
                check = _matched(check, consistent)
        entry: dict[str, Any] = {
            "arrays": {k: os.path.basename(p) for k, p in paths.items()},
            "shapes": {k: list(v) for k, v in expected.items()},
        }
        if check.state is CacheState.HIT:
            if not check.has_sidecar:
                logger.info(
                    "using index cache without a tokenload sidecar (written by Megatron), "
                    "checked against the token file's lengths: %s",
                    files.description,
                )
            indices = IndexArrays(paths=dict(check.arrays))
            digests = dict(check.digests)
            if self.role is Role.WRITE and set(digests) != set(paths):
                # the manifest's writer: the digests of what was checked (a sidecar-less cache
                # was just checked against the token file), so that build_policy='none' never
                # maps an array it cannot verify, whatever becomes of the sidecar
                digests = array_digests(indices.arrays())
            return CachedIndices(indices, {**entry, "digests": digests})
        if self.role is Role.READ:
            self.missing.append(
                f"{os.path.basename(files.description)[:-16]}: {'; '.join(check.reasons)}"
            )
            self.folders.append(folder)
            self.wanted.append((folder, description))
            return CachedIndices(IndexArrays(paths=paths), None)
        if check.state is CacheState.STALE:
            if self.cache == "strict":
                raise CacheError(
                    f"the index cache is stale: {'; '.join(check.reasons)}",
                    path=files.description,
                    hint="delete these cache files or use cache='auto' to rebuild them",
                )
            logger.warning(
                "rebuilding stale index cache %s: %s", files.description, "; ".join(check.reasons)
            )
        with self.phase("index_build"):
            arrays = build()
        if self.role is not Role.WRITE:  # CHECK: the writer writes it
            return CachedIndices(IndexArrays(arrays=arrays), None)
        with self.phase("cache_write"):
            digests = array_digests(arrays)  # the sidecar's and the manifest's
        entry["digests"] = digests
        if self.behind:
            self.deferred.append(PendingWrite(files, description, arrays, fields, digests))
            return CachedIndices(IndexArrays(arrays=arrays), entry)
        with self.phase("cache_write"):
            write = self.writer.add if self.writer is not None else write_cache
            # in a group: in place when the group is published, before the build returns
            write(files, description=description, arrays=arrays, fields=fields, digests=digests)
        self.wrote = True
        if is_url(folder):  # just uploaded: serve from memory rather than download it again
            return CachedIndices(IndexArrays(arrays=arrays), entry)
        return CachedIndices(IndexArrays(paths=paths), entry)

    def write_manifest(self, manifest: ManifestFile, entries: list[Any]) -> None:
        """After a build that wrote caches the manifest must follow (else a failure); after a
        pure hit (maybe a read-only folder of Megatron's caches) it is an extra, best effort."""
        write = None if self.writer is None else self.writer.write_last
        try:
            write_manifest(manifest.path, manifest.key, entries, write)
        except CacheError as exc:
            if self.wrote:
                raise
            logger.info("no build manifest written beside a complete cache: %s", exc)


def _matched(
    check: CacheCheck, consistent: Callable[[dict[str, np.ndarray]], list[str]]
) -> CacheCheck:
    """A sidecar-less hit checked against the token file: stale when its arrays do not fit."""
    reasons = consistent({name: map_array(path) for name, path in check.arrays.items()})
    if not reasons:
        return check
    note = " (cache without a tokenload sidecar, checked against the current token file)"
    stale = tuple(r + note for r in reasons)
    return dataclasses.replace(check, state=CacheState.STALE, reasons=stale)


def write_behind(
    caches: list[PendingWrite], manifest: ManifestFile | None, entries: list[Any]
) -> threading.Thread:
    """Write ``caches`` (each atomically) and then the manifest (with the splits' ``entries``)
    in a thread of this process. The
    thread is not a daemon: the interpreter waits for it at exit, so a short job still leaves a
    whole cache; a kill leaves only files that were complete (and temporaries the next writer
    removes). A failure (disk full, read-only folder) is logged: the job runs on from memory."""

    def run() -> None:
        writer = CacheWriter()  # one group: one durable step for all of them
        try:
            for c in caches:
                writer.add(
                    c.files,
                    description=c.description,
                    arrays=c.arrays,
                    fields=c.fields,
                    digests=c.digests,
                )
            if manifest is not None:
                write_manifest(manifest.path, manifest.key, entries, writer.write_last)
            writer.publish()
        except (OSError, CacheError) as exc:
            writer.discard()
            logger.warning(
                "index cache not written (the job runs from memory; the next run builds it): %s",
                exc,
            )

    thread = threading.Thread(target=run, name="tokenload-cache-writer")
    thread.start()
    _WRITERS.append(thread)
    return thread


_WRITERS: list[threading.Thread] = []
"""This process's cache writes in flight (``write_behind``)."""


def wait_for_cache_writes(timeout: float | None = None) -> bool:
    """Wait until this process's index caches written behind ``build_datasets`` (``auto`` on many
    ranks) are on disk; True when none is left. ``build_datasets`` itself waits first, so a later
    build in the same process never takes a half-written cache for a miss."""
    for thread in list(_WRITERS):
        thread.join(timeout)
        if not thread.is_alive():
            _WRITERS.remove(thread)
    return not _WRITERS
