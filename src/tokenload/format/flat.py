"""nanoGPT-style flat token files: a raw ``.bin`` of tokens (uint16 by default), no ``.idx``.

The whole file is one document stream; a training sample is any window of it. Reading shares the
three read modes of Megatron token files, and opens lazily per process the same way.
"""

from __future__ import annotations

import os

import numpy as np

from .bin import BinSource, ReadMode, open_bin, warmup_file


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
        self._source: BinSource | None = None
        self._pid = -1

    def _opened(self) -> BinSource:
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

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_source", "_pid")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._source, self._pid = None, -1

    def __repr__(self) -> str:
        return f"FlatTokenFile({self.path!r}, dtype={self.dtype.name!r}, mode={self.mode.value!r})"


def write_flat(path: str | os.PathLike[str], tokens: np.ndarray, dtype: np.dtype | type | str = np.uint16) -> None:
    """Write ``tokens`` as a flat file atomically (the nanoGPT ``prepare.py`` output format)."""
    from .atomic import write_bytes_atomic

    write_bytes_atomic(path, np.ascontiguousarray(tokens, dtype=np.dtype(dtype)).tobytes())
