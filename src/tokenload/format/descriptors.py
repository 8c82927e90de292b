"""File descriptors of token files: mappings that keep none, and a bounded set for ``pread``.

A job reading a blend of thousands of prefixes must not hold a descriptor per file: the default
soft limit on many clusters is still ``ulimit -n 1024``, and every DataLoader worker has its own.

* ``map_readonly`` maps a file read-only and keeps no descriptor. Python's ``mmap.mmap`` keeps a
  duplicate of the descriptor for as long as the mapping lives (before Python 3.13's
  ``trackfd=False``), which is what ``numpy.memmap`` and ``np.load(mmap_mode=...)`` do too; here
  the mapping is made with the C library's ``mmap`` and its descriptor is closed by the caller.
  The mapping is released when the last array viewing it is gone.
* ``pread`` mode needs a descriptor per read, so each process keeps the most recently used ones
  open, at most ``max_open_files()`` of them (default 128; ``set_max_open_files`` or the
  ``TOKENLOAD_OPEN_FILES`` environment variable, which spawned workers inherit). A file evicted
  from the set is reopened on its next read, and the reopened file must be the one first opened
  (same device, inode, size and modification time): a ``.bin`` replaced while a job reads it is a
  ``StorageError``, never tokens from another file.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import StorageError

DEFAULT_OPEN_FILES = 128
ENV_OPEN_FILES = "TOKENLOAD_OPEN_FILES"


def _libc_mmap() -> tuple[Any, Any] | None:
    """(mmap, munmap) of the C library, or None where it cannot be called (then ``mmap.mmap``)."""
    if os.name != "posix" or sys.version_info >= (3, 13):
        return None
    try:
        # the process's own symbols (libc's among them): find_library("c") would run
        # /sbin/ldconfig -p in a child process, 12-27 ms in every process that imports this
        libc = ctypes.CDLL(None, use_errno=True)
        do_map, do_unmap = libc.mmap, libc.munmap
    except (OSError, AttributeError):
        return None
    do_map.restype = ctypes.c_void_p
    do_map.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int64,
    ]
    do_unmap.restype = ctypes.c_int
    do_unmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return do_map, do_unmap


_LIBC = _libc_mmap()
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Mapping:
    """Owns one mapping made with the C library's ``mmap``; unmaps it when collected."""

    __slots__ = ("address", "size")

    def __init__(self, address: int, size: int) -> None:
        self.address, self.size = address, size

    def __del__(self) -> None:
        if _LIBC is not None and self.address:
            _LIBC[1](self.address, self.size)
            self.address = 0


def map_readonly(fd: int, size: int) -> np.ndarray:
    """A read-only uint8 array over the first ``size`` bytes of ``fd`` (``size`` > 0), mapped
    shared; the mapping keeps no descriptor, so the caller closes ``fd`` right after.

    Raises ``OSError`` as ``mmap.mmap`` would."""
    if _LIBC is None:
        if sys.version_info >= (3, 13):
            buffer = mmap.mmap(fd, size, access=mmap.ACCESS_READ, trackfd=False)
        else:  # no C library to call: the mapping keeps a duplicate descriptor
            buffer = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        return np.frombuffer(buffer, dtype=np.uint8)
    address = _LIBC[0](None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    raw = (ctypes.c_ubyte * size).from_address(address)
    # the mapping lives as long as any view of ``raw`` (a ctypes array takes attributes)
    raw._owner = _Mapping(address, size)  # type: ignore[attr-defined]
    array: np.ndarray = np.frombuffer(raw, dtype=np.uint8)  # type: ignore[call-overload]  # a C buffer
    array.flags.writeable = False  # the pages are mapped PROT_READ: a write would be a SIGSEGV
    return array


# -- pread mode's bounded set of open descriptors ------------------------------------------------


def _limit_from_env() -> int:
    text = os.environ.get(ENV_OPEN_FILES, "")
    try:
        value = int(text)
    except ValueError:
        return DEFAULT_OPEN_FILES
    return value if value >= 1 else DEFAULT_OPEN_FILES


def max_open_files() -> int:
    """How many ``.bin`` descriptors ``pread`` mode keeps open per process."""
    return _CACHE.limit


def set_max_open_files(count: int) -> None:
    """Keep at most ``count`` (>= 1) ``.bin`` descriptors open per process in ``pread`` mode.

    Also sets ``TOKENLOAD_OPEN_FILES`` so that workers started later (forked or spawned) keep the
    same bound; files open beyond it are closed now, least recently used first."""
    count = int(count)
    if count < 1:
        raise ValueError(f"the number of open files must be at least 1, got {count}")
    os.environ[ENV_OPEN_FILES] = str(count)
    _CACHE.resize(count)


class _Entry:
    __slots__ = ("dropped", "fd", "pins")

    def __init__(self, fd: int) -> None:
        self.fd, self.pins, self.dropped = fd, 0, False


class DescriptorCache:
    """At most ``limit`` descriptors, least recently used closed first; one in use (pinned
    between ``acquire`` and ``release``) is never closed under a reader, whatever its thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._keys = itertools.count()

    def new_key(self) -> int:
        return next(self._keys)

    def __len__(self) -> int:
        return len(self._entries)

    def adopt(self, key: int, fd: int) -> None:
        """Keep ``fd`` (just opened by its owner) under ``key``."""
        with self._lock:
            self._entries[key] = _Entry(fd)
            self._trim()

    def acquire(self, key: int, reopen: Callable[[], int]) -> _Entry:
        """The pinned entry of ``key``, reopened by ``reopen()`` when it was evicted."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(reopen())
            else:
                self._entries.move_to_end(key)
            entry.pins += 1
            self._trim()
            return entry

    def release(self, entry: _Entry) -> None:
        with self._lock:
            entry.pins -= 1
            if entry.dropped and entry.pins == 0:
                os.close(entry.fd)
            elif len(self._entries) > self.limit:
                self._trim()

    def discard(self, key: int) -> None:
        """Close ``key``'s descriptor (once no reader uses it)."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._close(entry)

    def resize(self, limit: int) -> None:
        with self._lock:
            self.limit = limit
            self._trim()

    def _trim(self) -> None:
        if len(self._entries) <= self.limit:
            return
        for key in [k for k, e in self._entries.items() if e.pins == 0]:
            self._close(self._entries.pop(key))
            if len(self._entries) <= self.limit:
                return

    @staticmethod
    def _close(entry: _Entry) -> None:
        if entry.pins:
            entry.dropped = True  # the last reader closes it
        else:
            os.close(entry.fd)

    def after_fork(self) -> None:
        """In a forked child: the inherited descriptors are the child's copies; close them and
        start afresh (a lock held by another thread at the fork is never released here)."""
        self._lock = threading.Lock()
        entries, self._entries = self._entries, OrderedDict()
        for entry in entries.values():
            try:
                os.close(entry.fd)
            except OSError:
                pass


_CACHE = DescriptorCache(_limit_from_env())
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_CACHE.after_fork)


def descriptor_cache() -> DescriptorCache:
    """This process's set of ``pread`` descriptors."""
    return _CACHE


Identity = tuple[int, int, int, int]


def identity(stat: os.stat_result) -> Identity:
    """What a reopened file must match: device, inode, size and modification time."""
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def reopen_same(path: str, expected: Identity, error: Callable[[OSError], StorageError]) -> int:
    """``path`` opened again, checked to be the file first opened; ``StorageError`` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise error(exc) from None
    try:
        found = identity(os.fstat(fd))
    except OSError as exc:
        os.close(fd)
        raise error(exc) from None
    if found != expected:
        os.close(fd)
        raise StorageError(
            f"the file changed since it was first opened (device, inode, size, mtime {found},"
            f" expected {expected})",
            path=path,
            hint="the .bin was replaced or rewritten while the job read it; replace token files"
            " between runs, then restart the job so that index and tokens are read together",
        )
    return fd
