"""Files that appear whole or not at all.

A writer writes under a hidden temporary name in the target folder (same filesystem, so the
final ``os.replace`` is atomic) and renames at the end; a crash or kill leaves only a
``.NAME.tmp-HOST-PID-XXXXXXXX`` file that no reader ever opens. The host and process id in the
name let a later writer of the same file tell a killed writer's leftovers from a live one's.

A writer of many files (a build's index caches) uses a ``WriteGroup``: all temporaries first,
their data made durable in one step (one ``syncfs`` per filesystem where Linux reports its
writeback errors, else an fsync per file), then the renames in order and one fsync per folder;
see its docstring for what a power loss can leave.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import logging
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..storage.os_errors import write_error
from ..storage.owners import host_name, owner_gone

logger = logging.getLogger(__name__)

#: A leftover not modified for this long is stale even when its owner cannot be checked (a
#: writer on another host of a shared filesystem).
STALE_AFTER_S = 24 * 3600

_TEMP = re.compile(
    r"^\.(?P<name>.+)\.tmp-(?:(?P<host>[A-Za-z0-9_.]+)-)?(?P<pid>\d+)-(?P<token>[0-9a-f]{8})"
    r"(?P<ready>\.ready)?$"
)
#: A complete, fsynced temporary of a replacement in progress (``ready_path``).
READY = ".ready"
#: A replacement whose writer cannot be checked (another host) and whose ready marker has not
#: changed for this long is finished by the next reader: a publish takes milliseconds.
PUBLISH_STALL_S = 60.0
#: How long a reader waits for a live writer to finish its publish before giving up.
PUBLISH_WAIT_S = 5.0
#: errnos that can only come from writing, so a write callback's OSError with one is our write's
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


def temp_path(final: str | os.PathLike[str]) -> Path:
    """A unique temporary name beside ``final`` that records this host and process."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{host_name()}-{os.getpid()}-{secrets.token_hex(4)}")


def remove_stale_temporaries(
    final: str | os.PathLike[str], *, now: float | None = None
) -> list[Path]:
    """Delete the temporaries of ``final`` that killed writers left; returns what was removed.

    A temporary is stale when its writer process is gone (same host) or it has not been modified
    for ``STALE_AFTER_S``. A live writer's temporary is never touched, so two writers of the same
    file do not destroy each other's work (the later rename still wins)."""
    final = Path(final)
    now = time.time() if now is None else now
    removed = []
    for path in final.parent.glob(f".{glob.escape(final.name)}.tmp-*"):
        match = _TEMP.match(path.name)
        if match is None or match["name"] != final.name:
            continue
        try:
            old = now - path.stat().st_mtime > STALE_AFTER_S
        except FileNotFoundError:
            continue
        if old or owner_gone(match["host"], int(match["pid"])):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # the write that follows reports an unwritable folder itself
                logger.warning("cannot remove the stale temporary %s: %s", path, exc.strerror)
                continue
            removed.append(path)
    if removed:
        logger.info(
            "removed %d temporary file(s) of %s left by killed writers", len(removed), final
        )
    return removed


def remove_stale_in_listing(
    folder: str, names: Iterable[str], final: re.Pattern[str], *, now: float | None = None
) -> int:
    """Delete the temporaries among ``names`` (a listing of ``folder``) of files whose names
    match ``final`` that killed writers left, as ``remove_stale_temporaries`` decides (writer
    gone, or untouched for ``STALE_AFTER_S``); returns how many. Costs nothing beyond the
    listing when no temporary is in it. (``final`` keeps other writers' temporaries out: a
    token file's half-published replacement is finished by its readers, ``finish_publish``.)"""
    removed = 0
    for name in names:
        match = _TEMP.match(name) if name.startswith(".") and ".tmp-" in name else None
        if match is None or match["ready"] or not final.match(match["name"]):
            continue
        path = os.path.join(folder, name)
        gone = owner_gone(match["host"], int(match["pid"]))
        try:
            old = (
                not gone
                and (time.time() if now is None else now) - os.stat(path).st_mtime > STALE_AFTER_S
            )
            if gone or old:
                os.unlink(path)
                removed += 1
        except FileNotFoundError:
            continue
        except OSError as exc:  # the write that follows reports an unwritable folder itself
            logger.warning("cannot remove the stale temporary %s: %s", path, exc.strerror)
    if removed:
        logger.info("removed %d temporary file(s) in %s left by killed writers", removed, folder)
    return removed


def require_folder(final: str | os.PathLike[str]) -> None:
    """Raise ConfigError unless ``final`` names a file (not ``''`` or ``dir/``, which would write
    hidden ``.bin``/``.idx`` files) in a folder that exists. Every command writes only into an
    existing folder, so a mistyped path creates nothing."""
    from ..errors import ConfigError

    text = os.fspath(final)
    if os.path.basename(text) in ("", ".", ".."):
        raise ConfigError(
            f"output {text!r} names a folder, not a file",
            path=text or None,
            hint="end the output with a file name, e.g. data/corpus (writes data/corpus.bin)",
        )
    require_existing_folder(Path(text).parent, text)


def require_existing_folder(folder: str | os.PathLike[str], path: str | None = None) -> None:
    """Raise ConfigError unless ``folder``, where an output goes, exists."""
    from ..errors import ConfigError

    if not Path(folder).is_dir():
        raise ConfigError(
            f"output folder {os.fspath(folder)!r} does not exist",
            path=path or os.fspath(folder),
            hint="create the folder first (mkdir -p) or choose another output path",
        )


def ready_path(tmp: Path, final: str | os.PathLike[str]) -> Path:
    """The name under which a complete temporary of ``final`` waits for its publish: the
    temporary ``tmp``'s host, process and token (those of the replacement's ``.bin``), plus
    ``.ready``. A reader that finds no ``.idx`` finishes a replacement whose files are all ready
    (``finish_publish``)."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{tmp.name.rsplit('.tmp-', 1)[1]}{READY}")


def finish_publish(idx_final: str | os.PathLike[str], *, wait_s: float = PUBLISH_WAIT_S) -> bool:
    """Finish a replacement of ``PREFIX.idx``/``.bin``/``.json`` that a writer began (its old
    ``.idx`` is gone, its new files are all complete: the ``.idx`` as ``ready_path``) and return
    True once ``idx_final`` exists; False when no replacement is under way.

    A live writer on this host is waited for (``wait_s``); a writer that is gone (killed), or one
    on another host whose ready ``.idx`` has not changed for ``PUBLISH_STALL_S``, is rolled
    forward here: the new ``.bin`` (unless already in place), then the new ``.idx`` (the commit),
    then the sidecar, each by one rename that another finisher may have done already. So a
    reader of a replaced output finds the old pair or the new one, never a loss of both."""
    final = Path(idx_final)
    markers = sorted(
        final.parent.glob(f".{glob.escape(final.name)}.tmp-*{READY}"),
        key=lambda p: _mtime(p) or 0.0,
    )
    if not markers:
        return final.exists()
    marker = markers[-1]
    match = _TEMP.match(marker.name)
    if match is None:
        return final.exists()
    deadline = time.monotonic() + wait_s
    host, pid = match["host"], int(match["pid"])
    while not owner_gone(host, pid) and time.time() - (_mtime(marker) or 0.0) < PUBLISH_STALL_S:
        if final.exists() or not marker.exists():
            return final.exists()
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    suffix = marker.name[len(f".{final.name}.tmp-") : -len(READY)]
    stem = final.with_suffix("")
    bin_final, json_final = stem.with_name(stem.name + ".bin"), stem.with_name(stem.name + ".json")
    moves = (
        (bin_final.with_name(f".{bin_final.name}.tmp-{suffix}"), bin_final),
        (marker, final),
        (json_final.with_name(f".{json_final.name}.tmp-{suffix}{READY}"), json_final),
    )
    for src, dst in moves:
        try:
            os.replace(src, dst)
        except FileNotFoundError:
            continue  # moved already: by the writer before it was killed, or by another reader
    fsync_dir(final.parent)
    logger.warning("finished the replacement of %s that a killed writer left half published", stem)
    return final.exists()


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def remove_temporaries(prefix: str | os.PathLike[str]) -> None:
    """Delete the temporaries that killed writers left for ``prefix``'s files (``prefix.*``).

    Only for a caller that owns ``prefix``: a writer still running on it would lose its file."""
    prefix = Path(prefix)
    for stale in prefix.parent.glob(f".{glob.escape(prefix.name)}.*.tmp-*"):
        stale.unlink(missing_ok=True)


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make renames inside ``folder`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_into(
    f: BinaryIO, write: Callable[[BinaryIO], object], final: str | os.PathLike[str]
) -> None:
    """``write(f)``; a full disk, a read-only filesystem or a quota raises ``StorageError``."""
    try:
        write(f)
    except OSError as exc:
        if exc.errno in _WRITE_ERRNOS:
            raise write_error(exc, final, "the file") from None
        raise


def write_temp(final: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """``write(f)`` into a new temporary beside ``final``, fsynced; returns its path.

    A full disk, a read-only filesystem or a folder this user may not write raises StorageError
    and leaves no temporary behind."""
    tmp = temp_path(final)
    try:
        f = create_temp(tmp, final)
        try:
            _write_into(f, write, final)
            sync_file(f, final)
        except BaseException:
            close_quietly(f)
            raise
        f.close()
    except BaseException:
        discard(tmp)
        raise
    return tmp


def write_atomic(
    final: str | os.PathLike[str], write: Callable[[BinaryIO], object], *, fsync_folder: bool = True
) -> None:
    """Write ``final`` atomically: ``write(f)`` into a temporary file beside it, fsync, rename.

    Failures are StorageErrors that leave no temporary behind (see ``write_temp``).
    ``fsync_folder=False`` leaves the folder's fsync to the caller (one for many files)."""
    tmp = write_temp(final, write)
    try:
        replace(tmp, final)
    except BaseException:
        discard(tmp)
        raise
    if fsync_folder:
        fsync_dir(Path(final).parent)


def create_temp(tmp: str | os.PathLike[str], final: str | os.PathLike[str]) -> BinaryIO:
    """Open the temporary ``tmp`` of ``final`` for writing; StorageError when that is refused."""
    try:
        return open(tmp, "wb")
    except OSError as exc:
        raise write_error(exc, final, "the file") from None


def sync_file(f: BinaryIO, final: str | os.PathLike[str]) -> None:
    """Flush and fsync ``f``: where a full disk shows up for buffered or delayed writes."""
    try:
        f.flush()
        os.fsync(f.fileno())
    except OSError as exc:
        raise write_error(exc, final, "the file") from None


def replace(tmp: str | os.PathLike[str], final: str | os.PathLike[str]) -> None:
    """``os.replace`` with a StorageError naming ``final`` on failure."""
    try:
        os.replace(tmp, final)
    except OSError as exc:
        raise write_error(exc, final, "the file") from None


def close_quietly(f: BinaryIO) -> None:
    """Close ``f`` after a failure; a second error (the unflushed buffer on a full disk) is moot."""
    try:
        f.close()
    except OSError:
        pass


def discard(path: str | os.PathLike[str]) -> None:
    """Remove a temporary, ignoring a failure (the original error matters more)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def write_bytes_atomic(final: str | os.PathLike[str], chunks: list[bytes] | bytes) -> None:
    """Write ``chunks`` to ``final`` atomically (temp file, fsync, rename)."""

    def write(f: BinaryIO) -> None:
        for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
            f.write(chunk)

    write_atomic(final, write)


# -- durability by group ------------------------------------------------------------------------

#: ``TOKENLOAD_CACHE_SYNC=fsync`` makes a ``WriteGroup`` fsync every file (no ``syncfs``): for a
#: filesystem shared with another job's large unsynced writes, which one ``syncfs`` waits for.
SYNC_ENV = "TOKENLOAD_CACHE_SYNC"

#: Filesystems (``statfs`` magic numbers) whose ``syncfs(2)`` writes back and commits every
#: file's data and, from Linux 5.8, reports a writeback error that happened since the descriptor
#: was opened: ext2/3/4, XFS, Btrfs, F2FS, tmpfs (nothing to make durable). Any other (NFS,
#: Lustre, FUSE, overlay, ...) gets an fsync per file, as before groups.
SYNCFS_FILESYSTEMS = frozenset({0xEF53, 0x58465342, 0x9123683E, 0xF2F52010, 0x01021994})

_LIBC: list[Any] = []


def _libc() -> Any:
    """The C library with ``syncfs`` and ``fstatfs``, on Linux from 5.8; else None."""
    if not _LIBC:
        libc = None
        match = re.match(r"(\d+)\.(\d+)", os.uname().release if hasattr(os, "uname") else "")
        if sys.platform.startswith("linux") and match and (int(match[1]), int(match[2])) >= (5, 8):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.syncfs.argtypes = [ctypes.c_int]
                libc.fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
                libc.sync_file_range.argtypes = [
                    ctypes.c_int,
                    ctypes.c_longlong,
                    ctypes.c_longlong,
                    ctypes.c_uint,
                ]
            except (OSError, AttributeError):
                libc = None
        _LIBC.append(libc)
    return _LIBC[0]


def group_sync_supported(fd: int) -> bool:
    """Whether one ``syncfs`` on ``fd`` (an open folder) may stand for the fsync of each file
    written on its filesystem afterwards: Linux >= 5.8, a filesystem of ``SYNCFS_FILESYSTEMS``,
    and no ``TOKENLOAD_CACHE_SYNC=fsync``."""
    if os.environ.get(SYNC_ENV, "").strip().lower() == "fsync":
        return False
    libc = _libc()
    if libc is None:
        return False
    buf = ctypes.create_string_buffer(512)  # struct statfs (120 bytes on 64-bit): f_type first
    if libc.fstatfs(fd, buf) != 0:
        return False
    return ctypes.c_long.from_buffer(buf).value in SYNCFS_FILESYSTEMS


#: A group's file of at least this size has its writeback started as soon as it is written, so
#: that the disk works while the build goes on and the final ``syncfs`` waits for less.
EARLY_WRITEBACK_BYTES = 256 << 10


def start_writeback(fd: int) -> None:
    """Start writing ``fd``'s dirty pages to disk without waiting (``sync_file_range`` with
    ``SYNC_FILE_RANGE_WRITE``): a hint that makes nothing durable; failures are ignored."""
    libc = _libc()
    if libc is not None:
        libc.sync_file_range(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE


def syncfs(fd: int) -> None:
    """``syncfs(2)``: write back and commit the filesystem of ``fd``; OSError on a failure,
    including a writeback error of any file on it since ``fd`` was opened."""
    libc = _libc()
    if libc is None or libc.syncfs(fd) != 0:
        code = ctypes.get_errno() if libc is not None else errno.ENOSYS
        raise OSError(code, os.strerror(code))


#: A group of at most this many files keeps them open and fsyncs each at publish (as fast as
#: one ``syncfs`` for a handful of files, and never waits for other writers' dirty pages).
KEEP_OPEN = 8

#: A larger group fsyncs its files one by one instead of one ``syncfs`` when the system holds
#: more dirty or in-flight pages than the group wrote plus this (another job's large writes on
#: the filesystem, which a ``syncfs`` would wait for).
FOREIGN_DIRTY_BYTES = 256 << 20


def dirty_bytes() -> int | None:
    """The system's dirty and writeback pages in bytes (``/proc/meminfo``), None if unknown."""
    try:
        with open("/proc/meminfo", "rb") as f:
            text = f.read()
    except OSError:
        return None
    total = 0
    for key in (b"Dirty:", b"Writeback:"):
        at = text.find(b"\n" + key)
        if at < 0:
            return None
        total += int(text[at + len(key) + 1 :].split(None, 1)[0]) * 1024
    return total


@dataclass
class _Pending:
    """A written temporary waiting for its publish."""

    tmp: str
    final: str
    last: bool
    grouped: bool
    """Its durability comes at publish (else it was fsynced as written)."""
    size: int
    handle: BinaryIO | None
    """Kept open for its fsync at publish (a small group)."""


class WriteGroup:
    """Files written now and published together: durability by group instead of per file.

    ``write(final, write)`` writes a temporary beside ``final`` (a hidden name no reader opens).
    ``publish()`` makes every temporary's data durable, renames them over their names in the
    order written (``last=True`` ones after all others and after the others' folders are
    fsynced), then fsyncs each folder once. ``discard()``, or a failed publish, removes the
    temporaries not yet renamed. Threads may write into one group.

    Where ``group_sync_supported`` (the folder's descriptor is opened before the group writes
    its first temporary on that filesystem, so a writeback error of any of them is reported),
    the durable step is one ``syncfs(2)`` per filesystem at publish; a large file's writeback is
    started as soon as it is written (``start_writeback``), so the ``syncfs`` mostly finds it
    done. A group of up to ``KEEP_OPEN`` files fsyncs each instead (kept open, no reopening),
    and so does a larger one when the system holds much more dirty data than it wrote
    (``FOREIGN_DIRTY_BYTES``: another job's writes, which a ``syncfs`` would wait for; each
    temporary is reopened for its fsync). Elsewhere each file is fsynced as it is written.

    Power loss: no name is renamed before the data of every temporary is durable, so after a
    crash each final name holds its old content (or nothing) or the complete new file, never a
    zeroed or partial one. A rename whose folder fsync had not yet happened may be lost, so a
    reader that needs several names together writes its commit name last and treats a set
    without it as absent (a cache without its description is a miss)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: list[_Pending] = []
        """The temporaries in the order written."""
        self._folders: dict[str, bool] = {}
        """Each folder written into, and whether its filesystem syncs as a group."""
        self._fds: dict[int, tuple[str, int]] = {}
        """Per filesystem (device) that syncs as a group: a folder on it and its descriptor."""
        self._kept = 0
        """Temporaries kept open (at most ``KEEP_OPEN``)."""

    def _folder(self, folder: str) -> bool:
        """Register ``folder`` (made when missing): True when its files sync as a group."""
        with self._lock:
            known = self._folders.get(folder)
            if known is not None:
                return known
            flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
            try:
                fd = os.open(folder, flags)
            except FileNotFoundError:
                os.makedirs(folder, exist_ok=True)
                fd = os.open(folder, flags)
            keep = False
            try:
                grouped = group_sync_supported(fd)
                if grouped:
                    dev = os.fstat(fd).st_dev
                    keep = dev not in self._fds
                    if keep:
                        self._fds[dev] = (folder, fd)
            finally:
                if not keep:
                    os.close(fd)
            self._folders[folder] = grouped
            return grouped

    def write(
        self,
        final: str | os.PathLike[str],
        write: Callable[[BinaryIO], object],
        *,
        last: bool = False,
        stat: bool = False,
    ) -> os.stat_result | None:
        """``write(f)`` into a new temporary of ``final``; with ``stat``, returns its ``fstat``
        (the published file's: a rename keeps device, inode, size and mtime). A StorageError on
        failure, and no temporary of this file left behind."""
        final = os.fspath(final)
        folder, name = os.path.split(final)
        try:
            grouped = self._folder(folder or ".")
        except OSError as exc:
            raise write_error(exc, final, "the file") from None
        # temp_path's name, without pathlib (a build writes five files per cache)
        tmp = os.path.join(
            folder, f".{name}.tmp-{host_name()}-{os.getpid()}-{secrets.token_hex(4)}"
        )
        st = None
        keep = False
        try:
            f = create_temp(tmp, final)
            try:
                _write_into(f, write, final)
                if grouped:
                    try:
                        f.flush()
                    except OSError as exc:
                        raise write_error(exc, final, "the file") from None
                else:
                    sync_file(f, final)
                size = f.tell()
                if stat:
                    st = os.fstat(f.fileno())
                if grouped:
                    if size >= EARLY_WRITEBACK_BYTES:
                        start_writeback(f.fileno())
                    with self._lock:
                        keep = self._kept < KEEP_OPEN
                        self._kept += keep
            except BaseException:
                close_quietly(f)
                raise
            if not keep:
                f.close()
        except BaseException:
            discard(tmp)
            raise
        with self._lock:
            self._files.append(_Pending(tmp, final, last, grouped, size, f if keep else None))
        return st

    def _take(self) -> tuple[list[_Pending], dict[int, tuple[str, int]]]:
        with self._lock:
            files, fds = self._files, self._fds
            self._files, self._fds, self._folders, self._kept = [], {}, {}, 0
        return files, fds

    def _make_durable(self, files: list[_Pending], fds: dict[int, tuple[str, int]]) -> None:
        """The group's durable step (class docstring)."""
        grouped = [p for p in files if p.grouped]
        if not grouped:
            return
        if all(p.handle is not None for p in grouped):
            for p in grouped:
                assert p.handle is not None
                sync_file(p.handle, p.final)
            return
        dirty = dirty_bytes()
        if dirty is not None and dirty > sum(p.size for p in grouped) + FOREIGN_DIRTY_BYTES:
            for p in grouped:
                try:
                    fd = os.open(p.tmp, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                except OSError as exc:
                    raise write_error(exc, p.final, "the file") from None
            return
        for folder, fd in fds.values():
            try:
                syncfs(fd)
            except OSError as exc:
                raise write_error(exc, folder, "the files of the folder") from None

    def publish(self) -> None:
        """Make the written files durable, rename them in order and fsync their folders (see the
        class docstring); a StorageError on failure, the temporaries not yet renamed removed."""
        files, fds = self._take()
        ordered = [p for p in files if not p.last] + [p for p in files if p.last]
        held = {folder: fd for folder, fd in fds.values()}
        done = 0
        try:
            self._make_durable(files, fds)
            for p in files:
                if p.handle is not None:
                    p.handle.close()
                    p.handle = None
            for stage in (False, True):
                folders: dict[str, None] = {}
                while done < len(ordered) and ordered[done].last is stage:
                    p = ordered[done]
                    replace(p.tmp, p.final)
                    folders[os.path.dirname(p.final) or "."] = None
                    done += 1
                for folder_path in folders:
                    kept = held.get(folder_path)
                    if kept is None:
                        fsync_dir(folder_path)
                    else:
                        try:
                            os.fsync(kept)
                        except OSError:
                            pass
        finally:
            _close_and_discard(ordered[done:], fds)

    def discard(self) -> None:
        """Remove every temporary not yet published (after a failed build)."""
        files, fds = self._take()
        _close_and_discard(files, fds)


def _close_and_discard(files: list[_Pending], fds: dict[int, tuple[str, int]]) -> None:
    for p in files:
        if p.handle is not None:
            close_quietly(p.handle)
        discard(p.tmp)
    for _, fd in fds.values():
        os.close(fd)
