"""Read Megatron-LM / GPT-NeoX token files (``PREFIX.idx`` + ``PREFIX.bin``).

A ``TokenFile`` is cheap to create and to pickle: it holds only ``(prefix, options)`` and opens
the files on first use, in the process that uses them, re-opening after a fork. So DataLoader
workers and forked or spawned processes never share a file offset or a mapping.

This module is the read API (index arrays, token reads, documents); what an open reads and
checks, in O(1), is ``opening.py``'s. Given the counts of a sequences JSON
(``sequences=(N, D + 1)``, ``dtype=``), a token file knows its length and dtype without opening.
"""

from __future__ import annotations

import os
from typing import Any, SupportsIndex, overload

import numpy as np

from ..arrays import distinct
from ..errors import FormatError, StorageError
from .bin import ReadMode
from .idx import DtypeCodes, IndexHeader, code_table, prefix_of
from .opening import Opened, open_pair


class TokenFile:
    """One token file pair, read lazily.

    ``mode``: "mmap" (default), "pread" or "memory" (see ``tokenload.format.bin``).
    ``dtype_codes``: "auto" (default: megatron-core's table, a float code resolved by the ``.bin``
    size), "megatron" or "neox" (codes 6/7 swapped). Integer codes mean the same in all three.
    ``multimodal``: whether the index has a modes array; None infers it from the size.
    ``warmup``: pre-read both files into the page cache when first opened.
    ``sequences``: ``(sequence_count, document_count)`` of the ``.idx`` header (a sequences
    JSON's entry); with ``dtype`` too, the header is not parsed, only checked against them on
    first use. With counts but no ``dtype`` the header is read and must hold those counts.
    ``sequences_path``: the sequences JSON the counts came from, named in errors.
    ``allow_float``: open an index whose dtype is a float (codes 6 and 7: a data file, never a
    token file) to describe or convert it; by default such a file is a FormatError when it opens.
    """

    def __init__(
        self,
        prefix: str | os.PathLike[str],
        *,
        mode: ReadMode | str = ReadMode.MMAP,
        dtype_codes: DtypeCodes = "auto",
        multimodal: bool | None = None,
        warmup: bool = False,
        sequences: tuple[int, int] | None = None,
        dtype: np.dtype | str | None = None,
        sequences_path: str | os.PathLike[str] | None = None,
        allow_float: bool = False,
    ) -> None:
        self.prefix = prefix_of(prefix)
        self.mode = ReadMode.parse(mode)
        code_table(dtype_codes)  # an unknown table name fails here, not at first use
        self.dtype_codes: DtypeCodes = dtype_codes
        self.multimodal = multimodal
        self.warmup = warmup
        self.sequences = None if sequences is None else (int(sequences[0]), int(sequences[1]))
        self.given_dtype = None if dtype is None else np.dtype(dtype)
        if self.given_dtype is not None and self.sequences is None:
            raise ValueError("dtype= is given with sequences=(sequence_count, document_count) only")
        self.sequences_path = None if sequences_path is None else os.fspath(sequences_path)
        self.allow_float = allow_float
        self._state: Opened | None = None
        self._first: tuple[Any, ...] | None = None
        """The pair as first opened (``opening.pair_stamp``: sizes, a hash of each file's ends,
        an object's ETag): carried to the processes this file is pickled into, whose own opening
        must find the same files."""

    @property
    def idx_path(self) -> str:
        return self.prefix + ".idx"

    @property
    def bin_path(self) -> str:
        return self.prefix + ".bin"

    # -- lazy opening ----------------------------------------------------------------------------
    def _opened(self) -> Opened:
        state = self._state
        if state is None or state.pid != os.getpid():
            state = open_pair(self)
            if self._first is None:
                self._first = state.stamp
            elif state.stamp != self._first:  # indices, plans, reads were made of the first
                state.bin.close()
                raise StorageError(
                    "the token file changed since it was first opened (its .bin or .idx now"
                    f" has another size or other index contents: first {self._first}, now"
                    f" {state.stamp}); the job's indices and reads belong to the files as they"
                    " were",
                    path=self.bin_path,
                    hint="do not rewrite token files while a job reads them; restart the job on"
                    " the new files",
                )
            self._state = state
        return state

    def close(self) -> None:
        """Drop file handles and mappings; the next access reopens."""
        if self._state is not None:
            self._state.bin.close()
            self._state = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_state"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._state = None

    def __repr__(self) -> str:
        return f"TokenFile({self.prefix!r}, mode={self.mode.value!r})"

    # -- the index -------------------------------------------------------------------------------
    @property
    def header(self) -> IndexHeader:
        return self._opened().header

    @property
    def dtype(self) -> np.dtype:
        if self.given_dtype is not None and self._state is None:
            return self.given_dtype
        return self._opened().header.dtype

    @property
    def bin_bytes(self) -> int:
        """Bytes of the ``.bin`` opened (the file's or the object's size at its opening)."""
        return int(self._opened().bin.num_bytes)

    @property
    def sequence_lengths(self) -> np.ndarray:
        """int32 tokens per sequence (read-only view)."""
        return self._opened().lengths

    @property
    def sequence_pointers(self) -> np.ndarray:
        """int64 byte offset of each sequence in ``.bin`` (read-only view)."""
        return self._opened().pointers

    @property
    def document_indices(self) -> np.ndarray:
        """int64 ``[0, end_0, end_1, ...]``: document d is sequences ``[di[d], di[d+1])``.

        ``arange(N + 1)`` for an index without document boundaries
        (``documents_from_sequences``)."""
        state = self._opened()
        if state.documents is None:
            state.documents = np.arange(state.header.sequence_count + 1, dtype=np.int64)
        return state.documents

    @property
    def documents_from_sequences(self) -> bool:
        """True when the index records no document boundaries (``document_indices == [0]``, as
        GPT-NeoX's merge writes it) and each sequence is read as one document."""
        return self._opened().per_sequence

    @property
    def sequence_modes(self) -> np.ndarray | None:
        """int8 modes of a multimodal file, else None."""
        return self._opened().modes

    @property
    def num_sequences(self) -> int:
        if self.sequences is not None and self._state is None:
            return self.sequences[0]
        return self._opened().header.sequence_count

    @property
    def num_documents(self) -> int:
        state = self._opened()
        return (
            state.header.sequence_count if state.per_sequence else state.header.document_count - 1
        )

    @property
    def num_tokens(self) -> int:
        return self._opened().bin.num_tokens

    def __len__(self) -> int:
        return self.num_sequences

    # -- token reads -----------------------------------------------------------------------------
    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset + length)`` of sequence ``index`` (length: to its end)."""
        # The hot path of random access: plain ints, no temporary arrays.
        state = self._state
        if state is None or state.pid != os.getpid():
            state = self._opened()
        count = state.header.sequence_count
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(
                f"sequence {index} out of range for {count} sequences in {self.idx_path}"
            )
        seq_len = int(state.lengths[index])
        if seq_len < 0:
            raise _negative_length(index, seq_len, self.idx_path)
        if length is None:
            length = seq_len - offset
        if offset < 0 or length < 0 or offset + length > seq_len:
            raise IndexError(
                f"tokens [{offset}, {offset + length}) are outside sequence {index} of length "
                f"{seq_len}"
            )
        pointer = int(state.pointers[index])
        following = int(state.pointers[index + 1]) if index + 1 < count else state.bin.num_bytes
        if following - pointer != seq_len * state.itemsize:
            raise _pointer_gap(state, np.array([index]), self.idx_path)
        return state.bin.read(pointer // state.itemsize + offset, length)

    @overload
    def __getitem__(self, key: SupportsIndex) -> np.ndarray: ...

    @overload
    def __getitem__(self, key: slice) -> list[np.ndarray]: ...

    def __getitem__(self, key: SupportsIndex | slice) -> np.ndarray | list[np.ndarray]:
        """Sequence ``key``'s tokens; a slice (step 1): the list of its sequences' tokens."""
        if isinstance(key, slice):
            return self._slice(key)
        return self.get(key.__index__())

    def _slice(self, key: slice) -> list[np.ndarray]:
        begin, end, step = key.indices(self.num_sequences)
        if step != 1:
            raise ValueError("token files support slices with step 1 only")
        if end <= begin:
            return []
        flat, lengths = self._run(begin, end)
        return np.split(flat, np.cumsum(lengths)[:-1])

    def _run(self, begin: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The tokens of sequences ``[begin, end)`` concatenated, and their int64 lengths.

        Every sound file stores its sequences back to back, so they are read in one piece once
        each pointer is checked against the previous pointer and length (and the last against the
        next pointer, or the end of ``.bin``): a corrupt index whose pointers disagree with its
        lengths is a ``FormatError`` naming the first such sequence, never other tokens."""
        state = self._opened()
        lengths = state.lengths[begin:end].astype(np.int64)
        if int(lengths.min()) < 0:
            i = begin + int(np.argmin(lengths))
            raise _negative_length(i, int(state.lengths[i]), self.idx_path)
        bad = _bad_steps(state, begin, end)
        if bad.size:
            raise _pointer_gap(state, begin + bad[:1], self.idx_path)
        start = int(state.pointers[begin]) // state.itemsize
        return state.bin.read(start, int(lengths.sum())), lengths

    def read_pieces(
        self,
        sequences: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        dtype: np.dtype | None = None,
    ) -> np.ndarray:
        """Concatenated tokens of pieces ``(sequence, offset, length)``, in one vectorized read,
        optionally cast to ``dtype`` on the way."""
        starts = self.token_starts(sequences)
        starts += offsets
        return self.read_spans(starts, lengths, dtype)

    def read_spans(
        self, starts: np.ndarray, lengths: np.ndarray, dtype: np.dtype | None = None
    ) -> np.ndarray:
        """Concatenated tokens of ``.bin`` token ranges ``[starts[i], starts[i] + lengths[i])``,
        optionally cast to ``dtype`` on the way."""
        return self._opened().bin.read_spans(starts, lengths, dtype)

    def token_starts(self, sequences: np.ndarray) -> np.ndarray:
        """Position in ``.bin`` (in tokens) where each sequence begins (a new int64 array).

        Every sequence read is first checked against the next pointer: ``pointer[i + 1] -
        pointer[i] == length[i] * itemsize`` (the last against the end of ``.bin``), so an index
        with two lengths swapped or a pointer moved is a ``FormatError`` naming the file and the
        sequence instead of other tokens. The check runs once per chunk of ``CHECK_CHUNK``
        sequences, vectorized, on the chunk's first use in the process; until every chunk is
        checked a batch pays one lookup per sequence in a small flag array, then nothing
        (measured in benchmarks/README.md)."""
        state = self._state
        if state is None or state.pid != os.getpid():
            state = self._opened()
        starts: np.ndarray = state.pointers[sequences]
        verified = state.verified
        if state.unverified and (verified is None or not _ALL(verified[sequences >> CHECK_SHIFT])):
            _check_chunks(state, np.asarray(sequences), self.idx_path)
        starts //= state.itemsize
        return starts

    def document(self, index: int) -> np.ndarray:
        """All tokens of document ``index`` (its sequences concatenated)."""
        docs = self.document_indices
        if not 0 <= index < len(docs) - 1:
            raise IndexError(f"document {index} out of range for {len(docs) - 1} documents")
        first, last = int(docs[index]), int(docs[index + 1])
        if not 0 <= first <= last <= self.num_sequences:
            raise FormatError(
                f"document {index} spans sequences [{first}, {last}), outside [0, "
                f"{self.num_sequences}]",
                path=self.idx_path,
                hint="the index is corrupt; run `tokenload verify` and rewrite the file",
            )
        if first == last:
            return np.zeros(0, dtype=self.dtype)
        return self._run(first, last)[0]


CHECK_SHIFT = 14
CHECK_CHUNK = 1 << CHECK_SHIFT
"""Sequences whose pointers ``token_starts`` checks at once (192 KiB of the index)."""
_ALL = np.logical_and.reduce


def _check_chunks(state: Opened, sequences: np.ndarray, path: str) -> None:
    """Check the pointers of every chunk of sequences that ``sequences`` touch and that was not
    checked yet, and mark them; ``FormatError`` naming the first bad sequence of a chunk."""
    n = state.header.sequence_count
    if state.verified is None:
        state.verified = np.zeros((n + CHECK_CHUNK - 1) // CHECK_CHUNK, dtype=bool)
        state.unverified = state.verified.size
    if not sequences.size:
        return
    chunks = distinct(sequences.astype(np.int64) >> CHECK_SHIFT)
    chunks = chunks[(chunks >= 0) & (chunks < state.verified.size)]  # others: the read's IndexError
    for chunk in chunks[~state.verified[chunks]].tolist():
        begin, end = chunk * CHECK_CHUNK, min(n, (chunk + 1) * CHECK_CHUNK)
        bad = _bad_steps(state, begin, end)
        if bad.size:
            raise _pointer_gap(state, begin + bad[:1], path)
        state.verified[chunk] = True
        state.unverified -= 1


def _bad_steps(state: Opened, begin: int, end: int) -> np.ndarray:
    """Offsets in ``[begin, end)`` of the sequences whose next pointer (or the end of ``.bin``)
    is not their pointer plus their length."""
    bounds = np.empty(end - begin + 1, dtype=np.int64)
    bounds[:-1] = state.pointers[begin:end]
    bounds[-1] = state.pointers[end] if end < state.header.sequence_count else state.bin.num_bytes
    sizes = state.lengths[begin:end].astype(np.int64) * state.itemsize
    return np.flatnonzero(np.diff(bounds) != sizes)


def _pointer_gap(state: Opened, sequences: np.ndarray, path: str) -> FormatError:
    """The error for a sequence whose next pointer (or the end of ``.bin``) is not its own pointer
    plus its length: the index is damaged, and reading it would return other tokens."""
    i = int(sequences[0])
    pointer, length = int(state.pointers[i]), int(state.lengths[i])
    last = i + 1 >= state.header.sequence_count
    following = state.bin.num_bytes if last else int(state.pointers[i + 1])
    what = "the end of .bin" if last else f"sequence {i + 1}'s pointer"
    return FormatError(
        f"sequence {i} has pointer {pointer} and length {length} ({length * state.itemsize} bytes "
        f"of {state.header.dtype}), but {what} is {following}: {following - pointer} bytes "
        "later; expected pointer[i + 1] - pointer[i] == length[i] * itemsize",
        path=path,
        hint="the index is corrupt (lengths or pointers changed); run `tokenload verify` and "
        "rewrite the file",
    )


def _negative_length(index: int, length: int, path: str) -> FormatError:
    return FormatError(
        f"sequence {index} has length {length}, expected a length >= 0",
        path=path,
        hint="the index is corrupt; run `tokenload verify` and rewrite the file",
    )
