"""OS errors on token files turned into ``StorageError`` with a hint that fits the cause.

A full disk, a read-only mount, a missing file and a permission problem need different actions
from the user, so the hint is chosen from ``errno`` rather than one text for every ``OSError``.
"""

from __future__ import annotations

import errno
import os

from ..errors import StorageError

_NO_READ = "this user may not read the file: check its permissions (ls -l) or run as a user who can"
_NO_WRITE = "this user may not write in the output folder: check its permissions or choose another"
_KEPT_CLEAN = "; nothing half-written was left behind"

_READ_HINTS: dict[int | None, str] = {
    errno.ENOENT: "check the path prefix: PREFIX.idx and PREFIX.bin must both exist",
    errno.EACCES: _NO_READ,
    errno.EPERM: _NO_READ,
    errno.EISDIR: (
        "the path is a folder; pass the token file's prefix (PREFIX for PREFIX.bin + PREFIX.idx)"
    ),
    errno.ENOTDIR: "a part of the path is a file, not a folder; check the path",
    errno.EIO: (
        "the storage failed to read (I/O error); check the disk or network filesystem and retry"
    ),
}

_WRITE_HINTS: dict[int | None, str] = {
    errno.ENOSPC: (
        "the filesystem is full: free space or choose an output folder on another filesystem"
        + _KEPT_CLEAN
    ),
    errno.EDQUOT: (
        "the disk quota is exhausted: free space or choose another output folder" + _KEPT_CLEAN
    ),
    errno.EROFS: (
        "the filesystem is mounted read-only: choose an output folder on a writable filesystem"
    ),
    errno.EACCES: _NO_WRITE,
    errno.EPERM: _NO_WRITE,
    errno.EIO: (
        "the storage failed to write (I/O error); check the disk or network filesystem and retry"
    ),
}


def too_many_open_files_hint(code: int | None) -> str | None:
    """The hint for EMFILE/ENFILE: which limit was reached and how to raise it (None otherwise)."""
    if code == errno.ENFILE:
        return (
            "the system-wide table of open files is full (fs.file-max): close other programs'"
            " files or raise the kernel limit, then rerun"
        )
    if code != errno.EMFILE:
        return None
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = f"the soft limit is {soft}, the hard limit {hard}"
    except (ImportError, OSError, ValueError):
        limit = "see `ulimit -n`"
    return (
        f"this process has as many files open as it may ({limit}): raise it before the job"
        " (`ulimit -n 65536`, or resource.setrlimit(RLIMIT_NOFILE) in the launcher), or keep"
        " fewer .bin files open in pread mode (TOKENLOAD_OPEN_FILES or"
        " tokenload.format.set_max_open_files, default 128)"
    )


def read_error(exc: OSError, path: str | os.PathLike[str], what: str) -> StorageError:
    """A StorageError for a failed read of ``what`` (e.g. "the index") at ``path``."""
    otherwise = "check that the file is readable and its filesystem is healthy"
    return _error(exc, path, f"cannot read {what}", _READ_HINTS, otherwise)


def write_error(exc: OSError, path: str | os.PathLike[str], what: str) -> StorageError:
    """A StorageError for a failed write of ``what`` (e.g. "the token file") at ``path``."""
    otherwise = "check the output folder and its filesystem, then rerun"
    return _error(exc, path, f"cannot write {what}", _WRITE_HINTS, otherwise)


def _error(
    exc: OSError,
    path: str | os.PathLike[str],
    failed: str,
    hints: dict[int | None, str],
    otherwise: str,
) -> StorageError:
    """``exc`` as a StorageError saying what ``failed``, with the hint for its errno."""
    if isinstance(exc, StorageError):
        return exc
    hint = too_many_open_files_hint(exc.errno) or hints.get(exc.errno, otherwise)
    error = StorageError(f"{failed} ({_reason(exc)})", path=os.fspath(path), hint=hint)
    return _keep_cause(error, exc)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _keep_cause(error: StorageError, exc: OSError) -> StorageError:
    """Carry ``strerror`` over for callers that word their own message from it (``errno`` stays
    unset: with both set, ``OSError.__str__`` would drop the path and the hint)."""
    error.strerror = exc.strerror
    return error
