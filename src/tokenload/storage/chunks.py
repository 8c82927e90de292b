"""A ``.bin`` in object storage, read by ranged GETs of whole chunks.

As Megatron's ``_S3BinReader``, a read that misses fetches the aligned chunk around it (default
256 MiB), so neighbouring reads cost nothing more. Unlike it, each process keeps several chunks
(an LRU bounded in bytes, not one chunk), a background thread fetches chunk k+1 while a reader
moving forward is still in chunk k, failed GETs are retried (``remote.call``), and a read far
from the previous one fetches only its own bytes (``TOKENLOAD_DIRECT_READS``, default on): a
random reader does not pay a whole chunk per sample, and the next read near it fetches the chunk.

A chunk is read as several ranged GETs of ``TOKENLOAD_GET_BYTES`` (64 MiB), up to
``TOKENLOAD_GET_THREADS`` (4) in flight (the parts of the chunk read, then those of the one read
ahead), each written by ``readinto`` straight into one buffer of the chunk's size; a read waits
only for the parts it covers. Measured on SeaweedFS over loopback (benchmarks/storage.py, 2
shared cores, 1 MiB reads of a 256 MiB file, which is one default chunk): one GET per chunk into
``bytes`` reached 78-85% of raw botocore GETs of 256 MiB, the defaults 98-103% (95-109% of raw
GETs with the same concurrency) at 0.75-0.80 CPU s/GiB against raw's 0.81-0.82. A chunk of one
GET (small chunks: random reads use 8 MiB) still goes into ``bytes``, fetched by the reading
thread: glibc reuses heap pages for allocations up to 32 MiB, where each mapping faults in fresh
ones (block-mode random reads measured 29% slower through mappings and the pool).
The buffer is a private anonymous ``mmap``, not ``np.empty``: NumPy asks for transparent huge pages
on large arrays, and GETs into such arrays measured 105-330 MB/s in half the rounds (the kernel
compacting memory at faults) against 560-810 into a mapping. Evicted buffers are not reused: reads
hand out views of their chunk, which may outlive its place in the cache, and a reused buffer would
change tokens a caller still holds. Read-ahead is one chunk: with parts in flight the next
chunk's GETs queue behind the current one's, so the connection is not idle while the reader
copies.

The object's size and ETag are recorded when it is opened. A GET that finds the object gone, or
returns fewer bytes than the recorded size promises, stats the object again and names what
changed: a file replaced under a running job would otherwise feed it other tokens.
"""

from __future__ import annotations

import mmap
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from ..byte_source import CheckedSource, gather_spans
from ..errors import FormatError, StorageError
from .options import StorageOptions
from .remote import ObjectInfo, call, count, info, ranged_get, ranged_get_into


def _buffer(size: int) -> mmap.mmap:
    """``size`` bytes of private anonymous memory, zero pages until written. Private, not the
    default shared mapping: shared anonymous pages live in shmem, and a GET into them measured
    0.65 CPU s/GiB against 0.58 into private pages (the same as into the ``bytes`` of
    ``.read()``)."""
    private = getattr(mmap, "MAP_PRIVATE", None)
    return mmap.mmap(-1, size) if private is None else mmap.mmap(-1, size, flags=private)


class _Chunk:
    """One chunk's tokens and the GETs that fill them (futures). A chunk of several parts has its
    buffer from the start; a chunk of one GET (``tokens`` None) is that GET's result."""

    __slots__ = ("nbytes", "part_tokens", "parts", "tokens")

    def __init__(
        self,
        tokens: np.ndarray | None,
        parts: list[Future[np.ndarray]],
        part_tokens: int,
        nbytes: int,
    ) -> None:
        self.tokens, self.parts, self.part_tokens, self.nbytes = tokens, parts, part_tokens, nbytes

    def wait(self, lo: int, hi: int) -> np.ndarray:
        """All tokens, once those in ``[lo, hi)`` have arrived (a failed part raises here)."""
        if self.tokens is None:
            return self.parts[0].result()
        for part in self.parts[lo // self.part_tokens : max(hi - 1, lo) // self.part_tokens + 1]:
            part.result()
        return self.tokens


class RemoteBin(CheckedSource):
    """Token reads from a ``.bin`` object through chunked, cached, prefetched ranged GETs (a
    ``byte_source.ByteSource``)."""

    def __init__(self, url: str, dtype: np.dtype, options: StorageOptions | None = None) -> None:
        self.path = url
        self.dtype = np.dtype(dtype)
        self.options = options or StorageOptions.from_env()
        self.opened: ObjectInfo = info(url, self.options)
        size = self.opened.size
        if size % self.dtype.itemsize:
            raise FormatError(
                f".bin is {size} bytes, not a multiple of the {self.dtype} item size"
                f" {self.dtype.itemsize}",
                path=url,
                hint="the object is truncated or was written with another dtype; rewrite it",
            )
        self.num_bytes = size
        self.num_tokens = size // self.dtype.itemsize
        self.chunk_tokens = self.options.chunk_bytes // self.dtype.itemsize
        part_bytes = min(self.options.get_bytes, self.options.chunk_bytes)
        self.part_tokens = part_bytes // self.dtype.itemsize
        self._chunks: OrderedDict[int, _Chunk] = OrderedDict()
        self._lock = threading.Lock()
        self._last = -2
        self._executor: ThreadPoolExecutor | None = None

    def stamp(self) -> tuple[Any, ...]:
        """The object opened: its size and ETag (``format.opening.pair_stamp``)."""
        return (self.opened.size, self.opened.tag)

    # -- chunks ----------------------------------------------------------------------------------
    def _ready(self, k: int, lo: int, hi: int) -> np.ndarray:
        """Tokens of chunk ``k`` once its tokens ``[lo, hi)`` have arrived: from the cache, from
        GETs in flight (read ahead or started by another read), or from GETs started now."""
        with self._lock:
            chunk = self._chunks.get(k)
            if chunk is not None:
                self._chunks.move_to_end(k)
        if chunk is not None:
            count("chunk_hits")
        else:
            count("chunk_misses")
            chunk = self._start(k)
        forward = k in (self._last, self._last + 1)
        self._last = k
        if self.options.prefetch and forward:
            self._prefetch(k + 1)
        try:
            return chunk.wait(lo, hi)
        except BaseException:
            with self._lock:  # a failed chunk is not kept: the next read asks again
                if self._chunks.get(k) is chunk:
                    del self._chunks[k]
            raise

    def _start(self, k: int, ahead: bool = False) -> _Chunk:
        """Chunk ``k`` in the LRU, its GETs submitted in order (a chunk of one GET that a read is
        waiting for is fetched by the reading thread: no hand-off, as before parts)."""
        first = k * self.chunk_tokens * self.dtype.itemsize
        size = min(first + self.options.chunk_bytes, self.num_bytes) - first
        step = self.part_tokens * self.dtype.itemsize
        tokens = None
        if size > step:
            buffer = _buffer(size)
            tokens = np.frombuffer(buffer, dtype=self.dtype)
            tokens.flags.writeable = False
            view = memoryview(buffer)
        mine: Future[np.ndarray] | None = None
        with self._lock:
            if k in self._chunks:  # started by another thread meanwhile
                return self._chunks[k]
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self.options.get_threads, thread_name_prefix="tokenload-get"
                )
            parts: list[Future[Any]]
            if tokens is not None:
                parts = [
                    self._executor.submit(self._part, view[a : a + step], first + a)
                    for a in range(0, size, step)
                ]
            elif ahead:
                parts = [self._executor.submit(self._get, first, first + size)]
            else:
                parts = [mine := Future()]
            chunk = self._chunks[k] = _Chunk(tokens, parts, self.part_tokens, size)
            self._chunks.move_to_end(k)
            self._evict(keep=(k, self._last))
        if ahead:
            count("prefetched")
        if mine is not None:
            try:
                mine.set_result(self._get(first, first + size))
            except BaseException as exc:
                mine.set_exception(exc)
        return chunk

    def _evict(self, keep: tuple[int, ...]) -> None:
        """Least recently used chunks out until the cache fits its bound, but never the chunk just
        started nor the one being read (so a read-ahead may hold one chunk over a small bound).
        Parts in flight of an evicted chunk finish into its buffer, which is freed with them."""
        held = sum(c.nbytes for c in self._chunks.values())
        for k in list(self._chunks):
            if held <= self.options.cache_bytes:
                break
            if k not in keep:
                held -= self._chunks.pop(k).nbytes

    def _prefetch(self, k: int) -> None:
        if k * self.chunk_tokens < self.num_tokens and k not in self._chunks:
            self._start(k, ahead=True)

    def _part(self, out: memoryview, start: int) -> None:
        """One part of a chunk: bytes ``[start, start + len(out))`` into ``out``, checked."""
        end = start + len(out)
        got, tag = self._request(
            start, end, lambda: ranged_get_into(self.path, start, out, self.options)
        )
        self._verify(start, end, got, tag)

    def _get(self, start: int, end: int) -> np.ndarray:
        """Bytes ``[start, end)`` as tokens, one ranged GET (a read outside the chunks)."""
        data, tag = self._request(
            start, end, lambda: ranged_get(self.path, start, end, self.options)
        )
        self._verify(start, end, len(data), tag)
        return np.frombuffer(data, dtype=self.dtype)

    def _request(self, start: int, end: int, fn: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...]:
        """``fn()`` through ``call`` (retried); a missing object or a refused range is a change."""
        try:
            return call(self.path, f"read bytes [{start}, {end})", fn, self.options)
        except StorageError as exc:
            if "does not exist" in exc.message or "refused" in exc.message:
                raise self._changed(f"a read of bytes [{start}, {end}) failed") from None
            raise

    def _verify(self, start: int, end: int, got: int, tag: str | None) -> None:
        """The answer is the object opened: as many bytes as asked, the ETag recorded at open."""
        if got != end - start:
            raise self._changed(f"a read of bytes [{start}, {end}) returned {got} bytes")
        if tag is not None and self.opened.tag and tag != self.opened.tag:
            raise self._changed(f"a read of bytes [{start}, {end}) came with ETag {tag}")
        count("gets")
        count("bytes", got)

    def _changed(self, what: str) -> StorageError:
        """The object changed since it was opened: say how (stat it again)."""
        was = f"{self.opened.size} bytes, ETag {self.opened.tag or '-'}"
        try:
            now = info(self.path, replace(self.options, retries=0))
            found = f"now {now.size} bytes, ETag {now.tag or '-'}"
        except StorageError as exc:
            gone = "does not exist" in exc.message
            found = "now gone" if gone else f"now unreadable ({exc.message})"
        return StorageError(
            f"the object changed while in use: {what}; it was {was} when opened, {found}",
            path=self.path,
            hint="the .bin was deleted, truncated or rewritten during the run; restore it (or rerun"
            " with the new files, whose index then matches)",
        )

    def _tokens(self, k: int, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start + length)`` inside chunk ``k``: from the chunk when it is held,
        in flight, or next to the previous read; otherwise (a random read) by a GET of just these
        bytes. Measured on SeaweedFS (S = 2048, 8 MiB chunks), a whole chunk per random sample
        gave 79 samples/s where one GET per sample gives 478."""
        if self.options.direct_reads and k not in (self._last, self._last + 1):
            with self._lock:
                held = k in self._chunks
            if not held:
                self._last = k
                count("direct_reads")
                size = self.dtype.itemsize
                return self._get(start * size, (start + length) * size)
        offset = start - k * self.chunk_tokens
        return self._ready(k, offset, offset + length)[offset : offset + length]

    # -- CheckedSource ---------------------------------------------------------------------------
    def _read(self, start: int, length: int) -> np.ndarray:
        if length == 0:
            return np.zeros(0, dtype=self.dtype)
        c = self.chunk_tokens
        first, last = start // c, (start + length - 1) // c
        if first == last:
            return self._tokens(first, start, length)
        parts = [
            self._read(max(start, k * c), min(start + length, (k + 1) * c) - max(start, k * c))
            for k in range(first, last + 1)
        ]
        return np.concatenate(parts)

    def _read_spans(
        self, starts: np.ndarray, lengths: np.ndarray, ends: np.ndarray, dtype: np.dtype | None
    ) -> np.ndarray:
        c = self.chunk_tokens
        one_chunk = int(starts.min()) // c == (int(ends.max()) - 1) // c if starts.size else False
        if starts.size > 1 and one_chunk and int(lengths.min()) > 0:
            k = int(starts.min()) // c
            # every span in one chunk: the in-memory gather of mapped files, on that chunk
            tokens = self._ready(k, int(starts.min()) - k * c, int(ends.max()) - k * c)
            return gather_spans(tokens, starts - k * c, lengths, ends - k * c, dtype)
        parts = [self._read(s, n) for s, n in zip(starts.tolist(), lengths.tolist())]
        out = np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)
        return out if dtype is None else out.astype(dtype)

    def close(self) -> None:
        with self._lock:
            self._chunks.clear()
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
