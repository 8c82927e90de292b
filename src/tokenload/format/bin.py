"""Three ways to read tokens out of a local ``.bin`` file, behind one interface
(``byte_source.ByteSource``; ``open_bin`` hands a URL to ``storage``, which implements it too).

* ``mmap`` (default): the file is mapped once per process and reads are NumPy views or gathers;
  the page cache does the work, nothing is copied until a sample is assembled.
* ``pread``: positional reads into fresh arrays, no mapping at all (Megatron's
  ``--no-mmap-bin-files``), for filesystems where mmap is slow or where live mappings are capped
  (WekaFS refuses new mappings after a few hundred).
* ``memory``: the whole file read into RAM once (GPT-NeoX ``data_impl=cached``).

Every read is bounds-checked against the file (``byte_source.CheckedSource``), so a corrupt index
yields ``FormatError``, never a NumPy error or bytes from outside the file. ``read_spans`` gathers
many ``(start, length)`` token ranges into one array: a join of slices for long ranges, one
vectorized index for short ones (mmap/memory, ``byte_source.gather_spans``), or one positional
read per range (pread).
"""

from __future__ import annotations

import enum
import os
from typing import Any

import numpy as np
import xxhash

from ..byte_source import ByteSource, CheckedSource, gather_spans
from ..errors import FormatError, StorageError
from ..storage.os_errors import read_error
from .descriptors import descriptor_cache, identity, map_readonly, reopen_same

WARMUP_CHUNK = 100 << 20  # GPT-NeoX's mmap warm-up reads in 100 MiB chunks


class ReadMode(str, enum.Enum):
    """How ``.bin`` bytes are read."""

    MMAP = "mmap"
    PREAD = "pread"
    MEMORY = "memory"

    @classmethod
    def parse(cls, value: ReadMode | str) -> ReadMode:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"read mode must be one of {[m.value for m in cls]}, got {value!r}"
            ) from None


class BinSource(CheckedSource):
    """Token reads from one local ``.bin`` file; ``num_tokens`` is the file size in tokens."""

    def __init__(self, path: str, dtype: np.dtype) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        # Opened first and sized from the descriptor: no metadata lookup of the path beyond the
        # open itself (at thousands of ranks every path stat is a shared-filesystem request).
        try:
            self._opened = os.open(path, os.O_RDONLY)
            stat = os.fstat(self._opened)
        except OSError as exc:
            self._release()
            raise read_error(exc, path, "token data") from None
        self._identity = identity(stat)  # what a reopened descriptor must match (pread mode)
        size = stat.st_size
        if size % self.dtype.itemsize:
            os.close(self._release())
            raise FormatError(
                f".bin is {size} bytes, not a multiple of the {self.dtype} item size "
                f"{self.dtype.itemsize}",
                path=path,
                hint="the file is truncated or was written with another dtype; rewrite it",
            )
        self.num_bytes = size
        self.num_tokens = size // self.dtype.itemsize

    def stamp(self) -> tuple[Any, ...]:
        """The file opened (``opening.pair_stamp``): its size and a hash of its first and last
        4 KiB (not its times: a mere touch changes them)."""
        k = min(4096 // self.dtype.itemsize, self.num_tokens)
        ends = self.read(0, k).tobytes() + self.read(self.num_tokens - k, k).tobytes()
        return (self._identity[2], xxhash.xxh3_64_intdigest(ends))

    def _release(self) -> int:
        """The descriptor opened by ``__init__``, handed to the caller (-1 when none is left)."""
        fd, self._opened = getattr(self, "_opened", -1), -1
        return fd


class _ArrayBin(BinSource):
    """Reads from an in-process array (a mapping or a RAM copy)."""

    tokens: np.ndarray

    def _read(self, start: int, length: int) -> np.ndarray:
        return self.tokens[start : start + length]

    def _read_spans(
        self, starts: np.ndarray, lengths: np.ndarray, ends: np.ndarray, dtype: np.dtype | None
    ) -> np.ndarray:
        return gather_spans(self.tokens, starts, lengths, ends, dtype)


class MmapBin(_ArrayBin):
    def __init__(self, path: str, dtype: np.dtype) -> None:
        super().__init__(path, dtype)
        # The mapping keeps no descriptor (``descriptors.map_readonly``): a blend of thousands of
        # prefixes holds no open file per prefix.
        self._map: np.ndarray | None = None
        fd = self._release()
        try:
            if self.num_bytes == 0:
                self.tokens = np.zeros(0, dtype=self.dtype)
                return
            self._map = map_readonly(fd, self.num_bytes)
        except OSError as exc:
            raise read_error(exc, path, "token data") from None
        finally:
            os.close(fd)
        self.tokens = self._map.view(self.dtype)

    def close(self) -> None:
        # Views may still reference the mapping; it is unmapped when the last one is gone.
        self.tokens = np.zeros(0, dtype=self.dtype)
        self._map = None


class MemoryBin(_ArrayBin):
    def __init__(self, path: str, dtype: np.dtype) -> None:
        super().__init__(path, dtype)
        try:
            with os.fdopen(self._release(), "rb", buffering=0) as f:
                self.tokens = np.fromfile(f, dtype=self.dtype)
        except OSError as exc:
            raise read_error(exc, path, "token data") from None
        if self.tokens.size != self.num_tokens:
            raise StorageError(
                f"read {self.tokens.size} tokens, expected {self.num_tokens}",
                path=path,
                hint="the file changed while it was read; retry",
            )


class PreadBin(BinSource):
    """Positional reads; the descriptor sits in the process's bounded set of open ``.bin`` files
    (``descriptors.max_open_files``), reopened, and checked to be the same file, when evicted."""

    _key = -1

    def __init__(self, path: str, dtype: np.dtype) -> None:
        super().__init__(path, dtype)
        self._cache = descriptor_cache()
        self._key = self._cache.new_key()
        self._cache.adopt(self._key, self._release())

    def _reopen(self) -> int:
        return reopen_same(self.path, self._identity, self._error)

    def _error(self, exc: OSError) -> StorageError:
        return read_error(exc, self.path, "token data")

    def _fill(self, out: np.ndarray, start: int) -> None:
        offset = start * self.dtype.itemsize
        entry = self._cache.acquire(self._key, self._reopen)
        try:
            try:
                done = os.preadv(entry.fd, [out.data], offset)  # one syscall in the common case
            except OSError as exc:  # costs nothing unless raised (Python >= 3.11)
                raise self._error(exc) from None
            if done != out.nbytes:
                self._fill_rest(entry.fd, out.data.cast("B"), offset, done)
        finally:
            self._cache.release(entry)

    def _fill_rest(self, fd: int, view: memoryview, offset: int, done: int) -> None:
        """Finish a short read (a network filesystem may return fewer bytes than asked)."""
        while done < len(view):
            try:
                got = os.preadv(fd, [view[done:]], offset + done)
            except OSError as exc:
                raise self._error(exc) from None
            if got <= 0:
                raise StorageError(
                    f"file ended after {offset + done} bytes, expected {offset + len(view)}",
                    path=self.path,
                    hint="the file was truncated while in use; rewrite it",
                )
            done += got

    def _read(self, start: int, length: int) -> np.ndarray:
        out = np.empty(length, dtype=self.dtype)
        if length:
            self._fill(out, start)
        return out

    def _read_spans(
        self, starts: np.ndarray, lengths: np.ndarray, ends: np.ndarray, dtype: np.dtype | None
    ) -> np.ndarray:
        # One preadv per run of spans adjacent in the file, straight into byte slices of one
        # memoryview, every offset computed by NumPy first. Measured per micro-batch of 16 x 2049
        # tokens in ~80 random spans (2-core gVisor VM): the system calls cost ~170 us CPU (2.1 us
        # each), the Python around them 37 us with a slice of ``out`` and a call per span, 33 here.
        if starts.size > 1:
            joined = starts[1:] == ends[:-1]
            if joined.any():
                first = np.flatnonzero(np.concatenate(([True], ~joined)))
                starts, lengths = starts[first], np.add.reduceat(lengths, first)
        size = self.dtype.itemsize
        stops = np.cumsum(lengths) * size
        out = np.empty(int(stops[-1]) // size if stops.size else 0, dtype=self.dtype)
        view = out.data.cast("B")
        entry = self._cache.acquire(self._key, self._reopen)
        fd, preadv = entry.fd, os.preadv
        begin = 0
        try:
            for offset, stop in zip((starts * size).tolist(), stops.tolist()):
                if stop > begin:
                    done = preadv(fd, [view[begin:stop]], offset)
                    if done != stop - begin:
                        self._fill_rest(fd, view[begin:stop], offset, done)
                begin = stop
        except OSError as exc:
            raise self._error(exc) from None
        finally:
            self._cache.release(entry)
        return out

    def close(self) -> None:
        if self._key >= 0:
            self._cache.discard(self._key)
            self._key = -1

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the cache may be gone already
            pass


_SOURCES = {ReadMode.MMAP: MmapBin, ReadMode.PREAD: PreadBin, ReadMode.MEMORY: MemoryBin}


def open_bin(path: str, dtype: np.dtype, mode: ReadMode | str) -> ByteSource:
    """A ``ByteSource`` for ``path`` in ``mode`` (a URL: chunked ranged GETs, whatever the mode)."""
    if "://" in path:
        from ..storage import open_remote_bin

        return open_remote_bin(path, dtype)
    return _SOURCES[ReadMode.parse(mode)](path, dtype)


def warmup_file(path: str, chunk: int = WARMUP_CHUNK) -> int:
    """Read ``path`` sequentially so its pages sit in the page cache; returns bytes read."""
    buf = bytearray(min(chunk, max(os.stat(path).st_size, 1)))
    total = 0
    with open(path, "rb", buffering=0) as f:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while n := f.readinto(buf):
            total += n
    return total
