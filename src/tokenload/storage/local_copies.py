"""Local copies of small remote files (``.idx``, cache ``.npy``), downloaded once per node.

A copy is named by the object's URL and its identity (size and ETag, or mtime): a rewritten
object gets a new name, so a stale copy is never read and nothing needs invalidating. The name
keeps the URL's path (``{cache}/s3/bucket/path/{key}-name.idx``) so a user can find and delete
it. The download goes to a temporary name in the same folder and is renamed into place, so a
copy is whole or absent, even after a kill. Concurrent processes on one node (ranks, workers)
take an ``fcntl`` lock on ``{copy}.lock`` and look again once they hold it: the first downloads,
the others find the finished copy. A download whose size or ETag differs from the HEAD's is
discarded; a killed download's temporary is removed by the next download of that copy. Cost per
open: one HEAD; a hit reads nothing else remotely.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile

from ..errors import StorageError
from .options import StorageOptions
from .os_errors import write_error
from .remote import LocalWriteError, ObjectInfo, call, count, get_to_file, info, is_url

logger = logging.getLogger(__name__)


def cached_copy(url: str, options: StorageOptions | None = None) -> str:
    """The local path of an up-to-date copy of ``url`` (downloaded now if needed)."""
    return fetch_copy(url, options)[0]


def fetch_copy(url: str, options: StorageOptions | None = None) -> tuple[str, bool]:
    """``(local path, whether this call downloaded it)``."""
    options = options or StorageOptions.from_env()
    found = info(url, options)
    local = copy_path(url, found.size, found.tag, options)
    if os.path.exists(local):
        count("index_hits")
        return local, False
    folder = os.path.dirname(local)
    try:
        os.makedirs(folder, exist_ok=True)
        lock = os.open(local + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _cache_error(exc, folder) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(local):  # another process finished it while we waited
            count("index_hits")
            return local, False
        _remove_killed_downloads(local)
        _download(url, local, found, options)
        count("index_downloads")
        logger.debug("cached %s (%d bytes) as %s", url, found.size, local)
        return local, True
    finally:
        os.close(lock)  # releases the lock


def _remove_killed_downloads(local: str) -> None:
    """The temporaries of ``local``'s earlier downloads: only the holder of its lock downloads,
    and a process that dies releases the lock, so with the lock held every one of them was left
    by a killed download (each as large as the copy). Removed; one that will not go is left."""
    folder, name = os.path.split(local)
    prefix = f".{name}.tmp-"
    removed = 0
    for entry in os.scandir(folder):
        if entry.name.startswith(prefix):
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    if removed:
        logger.info("removed %d partial download(s) of %s left by killed processes", removed, local)


def copy_path(url: str, size: int, tag: str, options: StorageOptions) -> str:
    """Where the copy of ``url`` with this size and tag lives."""
    folder, name = os.path.split(local_folder(url, options))
    key = hashlib.sha256(f"{url}\0{size}\0{tag}".encode()).hexdigest()[:16]
    return os.path.join(folder, f"{key}-{name}")


def _download(url: str, local: str, found: ObjectInfo, options: StorageOptions) -> None:
    folder = os.path.dirname(local)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(local)}.tmp-")
        os.close(fd)
    except OSError as exc:
        raise _cache_error(exc, folder) from None
    try:
        tag = call(url, "download it", lambda: get_to_file(url, tmp, options), options)
        got = os.path.getsize(tmp)
        if got != found.size or (tag and found.tag and tag != found.tag):
            sent = f"{got} bytes" + (f", ETag {tag}" if tag else "")
            raise StorageError(
                f"downloaded {sent}, expected the {found.size} bytes, ETag {found.tag or '-'},"
                " the server reported just before",
                path=url,
                hint="the object changed during the download; retry",
            )
        os.replace(tmp, local)
    except LocalWriteError as exc:
        raise _cache_error(exc.os_error, folder) from None
    except OSError as exc:
        raise _cache_error(exc, folder) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _cache_error(exc: OSError, folder: str) -> StorageError:
    if isinstance(exc, StorageError):
        return exc
    error = write_error(exc, folder, "the local index cache")
    return StorageError(
        error.message,
        path=error.path,
        hint=f"{error.hint}; set TOKENLOAD_CACHE_DIR to a writable local folder",
    )


def local_folder(url: str, options: StorageOptions | None = None) -> str:
    """A local folder standing for ``url`` under the cache folder (``{cache}/s3/bucket/path``):
    where files derived from a remote prefix (Megatron's index caches) can live when the
    configuration names no folder, instead of a folder literally named ``s3:``."""
    options = options or StorageOptions.from_env()
    protocol, rest = url.split("://", 1)
    parts = [p for p in rest.split("/") if p not in ("", ".", "..")]
    return os.path.join(options.index_cache_dir, protocol, *parts)


def local_path(path: str, options: StorageOptions | None = None) -> str:
    """``path`` itself when local, else its cached local copy."""
    return cached_copy(path, options) if is_url(path) else path


def file_size(path: str) -> int:
    """Size of a local file or of an object (one HEAD)."""
    if is_url(path):
        return info(path, StorageOptions.from_env()).size
    try:
        return os.path.getsize(path)
    except OSError as exc:
        from .os_errors import read_error

        raise read_error(exc, path, "the file") from None
