"""nanoGPT-style flat token files: a raw ``.bin`` of tokens (uint16 by default), no ``.idx``.

The whole file is one document stream; a training sample is any window of it. Reading shares the
three read modes of Megatron token files, and opens lazily per process the same way.

A flat file has no sidecar to carry a hash, and hashing all of a 100 GB file would take minutes,
so its identity (``content_fingerprint``) is an xxh3 over its size and 64 blocks of 64 KiB at
fixed, evenly spaced offsets: 4 MiB read whatever the size, the whole file when it is smaller.
It does not depend on the file's name or folder, so a run can move to another mount point.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import xxhash

from ..byte_source import ByteSource
from ..errors import StorageError
from .bin import ReadMode, open_bin, warmup_file


class FlatTokenFile:
    """One flat token file, opened lazily in the process that reads it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: np.dtype | type | str = np.uint16,
        mode: ReadMode | str = ReadMode.MMAP,
        warmup: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.dtype = np.dtype(dtype)
        self.mode = ReadMode.parse(mode)
        self.warmup = warmup
        self._source: ByteSource | None = None
        self._pid = -1

    def _opened(self) -> ByteSource:
        if self._source is None or self._pid != os.getpid():
            if self.warmup:
                warmup_file(self.path)
            self._source = open_bin(self.path, self.dtype, self.mode)
            self._pid = os.getpid()
        return self._source

    @property
    def num_tokens(self) -> int:
        return self._opened().num_tokens

    def __len__(self) -> int:
        return self.num_tokens

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start + length)``."""
        return self._opened().read(start, length)

    def read_spans(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Concatenated token ranges ``[starts[i], starts[i] + lengths[i])``."""
        return self._opened().read_spans(starts, lengths)

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_source", "_pid")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._source, self._pid = None, -1

    def __repr__(self) -> str:
        return f"FlatTokenFile({self.path!r}, dtype={self.dtype.name!r}, mode={self.mode.value!r})"


_SAMPLED_BLOCKS = 64
_BLOCK_BYTES = 64 << 10


def content_fingerprint(path: str | os.PathLike[str]) -> str:
    """xxh3-64 (hex) of the file's size and sampled blocks: the same bytes under any name or
    folder give the same value, other bytes of the same size a different one (wholly when the
    file is at most 4 MiB, else wherever they touch a sampled block)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            digest = xxhash.xxh3_64(size.to_bytes(8, "little"))
            for offset, length in _sampled_blocks(size):
                digest.update(os.pread(fd, length, offset))
        finally:
            os.close(fd)
    except OSError as exc:
        raise StorageError(
            f"cannot read the flat token file ({exc.strerror or exc})",
            path=path,
            hint="check that the file exists and is readable",
        ) from exc
    return digest.hexdigest()


def _sampled_blocks(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the blocks hashed for a file of ``size`` bytes: first and last
    included, so a file's head and tail always count."""
    if size <= _SAMPLED_BLOCKS * _BLOCK_BYTES:
        return [(start, min(_BLOCK_BYTES, size - start)) for start in range(0, size, _BLOCK_BYTES)]
    last = size - _BLOCK_BYTES
    return [(i * last // (_SAMPLED_BLOCKS - 1), _BLOCK_BYTES) for i in range(_SAMPLED_BLOCKS)]


def write_flat(
    path: str | os.PathLike[str], tokens: np.ndarray, dtype: np.dtype | type | str = np.uint16
) -> None:
    """Write ``tokens`` as a flat file atomically (the nanoGPT ``prepare.py`` output format)."""
    from .atomic import write_bytes_atomic

    write_bytes_atomic(path, np.ascontiguousarray(tokens, dtype=np.dtype(dtype)).tobytes())
