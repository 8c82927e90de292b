"""Writing to object storage: files made locally, then published object by object.

Objects cannot be appended to or renamed, but one PUT (or one multipart upload) becomes visible
whole or not at all. So tokenload never writes an object in place: outputs are written to a
local staging folder with the same atomic writers as local outputs, and each finished file is
uploaded with one ``put_file``. For a token file the order makes a partial publish harmless:
the old ``PREFIX.idx`` is deleted first, then ``.bin`` and the sidecar are uploaded, and
``PREFIX.idx`` last, so a reader sees either the old complete file, no file, or the new complete
file, never a new ``.bin`` under an old index. Retries and typed errors come from ``remote.call``.

Staging folders live under ``TOKENLOAD_STAGING_DIR`` (default: the system's temporary folder),
named by a digest of the URL so that a rerun of the same job finds its earlier staging.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import StorageError
from .local_copies import cached_copy
from .options import StorageOptions
from .os_errors import write_error
from .owners import host_name, owner_gone
from .remote import call, filesystem, is_url

logger = logging.getLogger(__name__)

#: Suffixes of a token file prefix in publish order: the index last, once what it describes is
#: there.
TOKEN_FILE_SUFFIXES = (".bin", ".json", ".idx")


def upload_file(local: str, url: str, options: StorageOptions | None = None) -> None:
    """Upload ``local`` to ``url`` as one object (visible whole or not at all), with retries."""
    options = options or StorageOptions.from_env()
    fs, path = filesystem(url, options)
    if not os.path.isfile(local):  # the put would say "the object does not exist": misleading
        raise StorageError(
            f"cannot upload it: the local file {local} is gone",
            path=url,
            hint="another process removed it from the staging folder"
            " (TOKENLOAD_STAGING_DIR) during the upload; rerun the command",
        )
    call(url, "upload it", lambda: fs.put_file(local, path), options)
    logger.debug("uploaded %s (%d bytes) to %s", local, os.path.getsize(local), url)


def upload_bytes(data: bytes, url: str, options: StorageOptions | None = None) -> None:
    """Write ``data`` as the object ``url`` (one PUT), with retries."""
    options = options or StorageOptions.from_env()
    fs, path = filesystem(url, options)
    call(url, "write it", lambda: fs.pipe_file(path, data), options)


def remove_object(url: str, options: StorageOptions | None = None) -> None:
    """Delete ``url``; one that does not exist is fine (one request, no HEAD first)."""
    options = options or StorageOptions.from_env()
    fs, path = filesystem(url, options)
    call(url, "delete it", _removal(fs.rm_file, path), options)


def object_exists(url: str, options: StorageOptions | None = None) -> bool:
    """Whether an object (not a folder) exists at ``url``; asks the server, never a listing
    cache."""
    options = options or StorageOptions.from_env()
    fs, path = filesystem(url, options)

    def probe() -> bool:
        try:
            is_file: bool = fs.info(path, refresh=True).get("type") != "directory"
            return is_file
        except FileNotFoundError:
            return False

    return call(url, "look for it", probe, options)


def list_objects(url: str, options: StorageOptions | None = None) -> list[str]:
    """URLs of the objects directly under the folder ``url`` (empty when there is none); the
    entry ``FOLDER/`` some servers list for an emptied folder is not an object."""
    options = options or StorageOptions.from_env()
    fs, path = filesystem(url, options)
    protocol = url.split("://", 1)[0]

    def listing() -> list[str]:
        try:
            found = fs.ls(path, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(
            f"{protocol}://{entry['name']}"
            for entry in found
            if entry.get("type") != "directory" and not entry["name"].endswith("/")
        )

    return call(url, "list the folder", listing, options)


def publish_prefix(
    local_prefix: str, url_prefix: str, options: StorageOptions | None = None
) -> None:
    """Upload the token file ``local_prefix`` (``.bin``, ``.idx``, and its sidecar if any) to
    ``url_prefix`` so that no reader ever pairs a new ``.bin`` with an old ``.idx``."""
    options = options or StorageOptions.from_env()
    remove_object(url_prefix + ".idx", options)
    for suffix in TOKEN_FILE_SUFFIXES:
        local = local_prefix + suffix
        if os.path.exists(local):
            upload_file(local, url_prefix + suffix, options)
        elif suffix == ".json":
            remove_object(url_prefix + suffix, options)  # an old sidecar would describe other bytes


def remove_objects(urls: list[str], options: StorageOptions | None = None) -> None:
    """Delete the objects ``urls`` (all of one filesystem), in batches; missing ones are fine."""
    if not urls:
        return
    options = options or StorageOptions.from_env()
    fs, _ = filesystem(urls[0], options)
    paths = [fs._strip_protocol(url) for url in urls]
    for start in range(0, len(paths), 1000):
        call(urls[0], "delete objects", _removal(fs.rm, paths[start : start + 1000]), options)


def remove_folder(url: str, options: StorageOptions | None = None) -> None:
    """Delete the entry ``url/`` that a server with real folders (SeaweedFS's filer) keeps and
    lists after the last object under ``url`` was deleted; on S3 itself there is none."""
    options = options or StorageOptions.from_env()
    fs, path = filesystem(url, options)
    call(url, "delete the emptied folder", _removal(fs.rm_file, path + "/"), options)


def _removal(remove: Callable[[Any], object], what: Any) -> Callable[[], None]:
    """``remove(what)`` as a call that finds nothing to remove fine."""

    def run() -> None:
        with contextlib.suppress(FileNotFoundError):
            remove(what)

    return run


def copy_or_none(url: str, options: StorageOptions | None = None) -> str | None:
    """The node's local copy of ``url`` (``local_copies.cached_copy``), or None when no such object
    exists: one HEAD when it does, a second only to tell a missing object from another failure,
    which is raised. An object that appears between the two looks (another writer publishing
    it) is copied."""
    try:
        return cached_copy(url, options)
    except StorageError as exc:
        if not object_exists(url, options):
            return None
        if "does not exist" not in exc.message:
            raise
    # missing at the first look, there at the second: another writer published it meanwhile
    return cached_copy(url, options)


def read_object(url: str, options: StorageOptions | None = None) -> bytes | None:
    """The bytes of the object ``url``, or None when there is no such object."""
    options = options or StorageOptions.from_env()
    fs, path = filesystem(url, options)

    def read() -> bytes | None:
        try:
            data: bytes = fs.cat_file(path)
            return data
        except FileNotFoundError:
            return None

    return call(url, "read it", read, options)


def read_objects(urls: list[str], options: StorageOptions | None = None) -> dict[str, bytes]:
    """The bytes of each object of ``urls`` that exists (fetched concurrently), by URL."""
    if not urls:
        return {}
    options = options or StorageOptions.from_env()
    fs, _ = filesystem(urls[0], options)
    by_path = {fs._strip_protocol(url): url for url in urls}
    found = call(urls[0], "read objects", lambda: fs.cat(list(by_path), on_error="omit"), options)
    return {by_path[path]: data for path, data in found.items() if isinstance(data, bytes)}


def download_file(url: str, local: str, options: StorageOptions | None = None) -> None:
    """Copy the object ``url`` to the local file ``local``, with retries."""
    options = options or StorageOptions.from_env()
    fs, path = filesystem(url, options)
    call(url, "download it", lambda: fs.get_file(path, local), options)


def check_writable(url_prefix: str, options: StorageOptions | None = None) -> None:
    """Write and delete an empty object beside ``url_prefix``: an unreachable endpoint or
    credentials that may not write fail here, before any work, not when the output is published."""
    options = options or StorageOptions.from_env()
    fs, path = filesystem(url_prefix, options)
    probe = path + ".tokenload-probe"
    call(
        url_prefix,
        "write beside it (an empty test object)",
        lambda: fs.pipe_file(probe, b""),
        options,
    )
    call(url_prefix, "delete the test object beside it", lambda: fs.rm_file(probe), options)


def staging_root() -> str:
    """Where local staging folders go: ``TOKENLOAD_STAGING_DIR``, else the temporary folder."""
    return os.environ.get("TOKENLOAD_STAGING_DIR") or os.path.join(
        tempfile.gettempdir(), "tokenload-staging"
    )


def make_staging_root() -> str:
    """``staging_root()``, created if need be (a StorageError naming TOKENLOAD_STAGING_DIR if
    it cannot be)."""
    root = staging_root()
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise _staging_error(exc, root) from None
    return root


#: A temporary folder untouched this long whose process is gone is an orphan (a worker killed
#: mid-task, by SIGKILL or the OOM killer, runs no cleanup); younger ones are left alone.
ORPHAN_SECONDS = 3600.0


def temporary_folder(prefix: str) -> str:
    """A new folder under the staging root: ``prefix``, then ``host@pid@`` of this process and
    random letters. Orphans of dead processes on this host are removed first (see
    ``remove_orphans``), so killed workers do not fill the node's disk run after run."""
    root = make_staging_root()
    remove_orphans(root)
    try:
        return tempfile.mkdtemp(prefix=f"{prefix}@{host_name()}@{os.getpid()}@", dir=root)
    except OSError as exc:
        raise _staging_error(exc, root) from None


def remove_orphans(root: str, now: float | None = None) -> list[str]:
    """Remove temporary folders under ``root`` made by a process of this host that no longer
    exists and untouched for ``ORPHAN_SECONDS`` (the newest of the folder and its files); returns
    their paths. A staging root shared by several hosts keeps every other host's folders."""
    now = time.time() if now is None else now
    removed: list[str] = []
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(".") and e.name.count("@") >= 3]
    except OSError:
        return removed
    for entry in entries:
        _, owner_host, pid, _ = entry.name.rsplit("@", 3)
        if not pid.isdigit() or not owner_gone(owner_host, int(pid)):
            continue
        if now - _last_touched(entry.path) < ORPHAN_SECONDS:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
        logger.info("removed %s, left by process %s that no longer exists", entry.path, pid)
    return removed


def _last_touched(folder: str) -> float:
    try:
        times = [os.stat(folder).st_mtime]
        times += [e.stat(follow_symlinks=False).st_mtime for e in os.scandir(folder)]
    except OSError:
        return time.time()  # vanishing as we look: not an orphan to touch
    return max(times)


def staging_folder(url: str) -> str:
    """The local folder where outputs bound for ``url`` are made (stable per URL)."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    name = os.path.basename(url.rstrip("/")) or "output"
    return os.path.join(staging_root(), f"{name}-{digest}")


def make_staging_folder(url: str) -> str:
    """Create ``staging_folder(url)`` (kept if it exists: a rerun resumes there); a folder that
    cannot be made is a StorageError naming TOKENLOAD_STAGING_DIR."""
    folder = staging_folder(url)
    try:
        os.makedirs(folder, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(13, os.strerror(13), folder)
    except OSError as exc:
        raise _staging_error(exc, folder) from None
    return folder


@contextlib.contextmanager
def fetched_prefix(url_prefix: str, options: StorageOptions | None = None) -> Iterator[str]:
    """A local copy of the token file ``url_prefix`` (``.bin`` and ``.idx``) in a temporary folder
    under the staging root, removed when the block ends; a local prefix is yielded unchanged."""
    if not is_url(url_prefix):
        yield url_prefix
        return
    folder = temporary_folder(".fetch-")
    try:
        local = os.path.join(folder, os.path.basename(url_prefix.rstrip("/")) or "part")
        for suffix in (".idx", ".bin"):
            download_file(url_prefix + suffix, local + suffix, options)
        yield local
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def staged_prefix(url_prefix: str, options: StorageOptions | None = None) -> Iterator[str]:
    """A local prefix to write a token file for ``url_prefix`` to; published when the block ends
    without an error, then removed. A local ``url_prefix`` is yielded unchanged."""
    if not is_url(url_prefix):
        yield url_prefix
        return
    check_writable(url_prefix, options)  # a wrong bucket or key fails now, not after the work
    folder = make_staging_folder(url_prefix)
    local = os.path.join(folder, os.path.basename(url_prefix.rstrip("/")) or "output")
    try:
        yield local
        publish_prefix(local, url_prefix, options)
    finally:  # nothing resumes from this staging (merge, convert): never leave it behind
        shutil.rmtree(folder, ignore_errors=True)


def _staging_error(exc: OSError, folder: str) -> StorageError:
    error = write_error(exc, folder, "the local staging folder of an object-storage output")
    return StorageError(
        error.message,
        path=error.path,
        hint=f"{error.hint}; set TOKENLOAD_STAGING_DIR to a writable local folder"
        " with room for the output",
    )
