"""Read Megatron-LM / GPT-NeoX token files (``PREFIX.idx`` + ``PREFIX.bin``).

A ``TokenFile`` is cheap to create and to pickle: it holds only ``(prefix, options)`` and opens
the files on first use, in the process that uses them, re-opening after a fork. So DataLoader
workers and forked or spawned processes never share a file offset or a mapping.

Opening costs O(1): the header is parsed, both file sizes are checked against it (the last
pointer plus the last length must end exactly at the end of ``.bin``), and the document indices
must start at 0 and end at the sequence count. An index whose document indices are just ``[0]``
(GPT-NeoX's merge forgets them) is read with each sequence as one document. The O(N) invariants
are ``verify``'s job. A legacy fairseq ``TNTIDX`` index (GPT-NeoX ``data_impl`` cached/lazy) is
recognised by its magic, as NeoX's ``data_impl="infer"`` does, and read and checked in O(N)
(``legacy.py``). The ``.idx`` is memory-mapped in ``mmap`` mode and read into RAM otherwise, so
``pread`` mode creates no mapping at all.

Opened with the counts of a sequences JSON (``sequences=(N, D + 1)``, ``dtype=``: Megatron's
``--per-dataset-sequences-path``, ``sequences.py``), a token file parses no header: its length
and dtype are known without opening it, and on first use the arrays are mapped at the offsets
the counts give, after the O(1) checks of the ``.idx`` size and the header bytes in the mapping.
"""

from __future__ import annotations

import glob
import mmap
import os
from dataclasses import dataclass

import numpy as np

from ..errors import FormatError, StorageError
from .bin import BinSource, ReadMode, open_bin, warmup_file
from .idx import (
    FLOAT_CODES,
    HEADER_SIZE,
    DtypeCodes,
    IndexHeader,
    code_table,
    index_arrays,
    parse_header,
    prefix_of,
    resolve_float_dtype,
)
from .legacy import is_legacy, read_legacy
from .sequences import check_counts, header_from_counts
from .storage import read_error


@dataclass
class _Opened:
    pid: int
    header: IndexHeader
    lengths: np.ndarray
    pointers: np.ndarray
    documents: np.ndarray | None
    """None until first needed when ``per_sequence`` (then it is ``arange(N + 1)``)."""
    modes: np.ndarray | None
    bin: BinSource
    per_sequence: bool
    """The index records no document boundaries: each sequence is one document."""

    @property
    def itemsize(self) -> int:
        return self.header.dtype.itemsize


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
        self._state: _Opened | None = None

    @property
    def idx_path(self) -> str:
        return self.prefix + ".idx"

    @property
    def bin_path(self) -> str:
        return self.prefix + ".bin"

    # -- lazy opening ----------------------------------------------------------------------------
    def _opened(self) -> _Opened:
        state = self._state
        if state is None or state.pid != os.getpid():
            state = self._state = self._open()
        return state

    def _open(self) -> _Opened:
        if self.warmup and "://" not in self.prefix:
            warmup_file(self.idx_path)
            warmup_file(self.bin_path)
        header, lengths, pointers, documents, modes = self._index()
        per_sequence = _per_sequence_documents(header, documents, self.idx_path)
        if header.code in FLOAT_CODES and header.index_format == "MMIDIDX":  # TNTIDX: its element size decides
            header = self._float_header(header, lengths)
        source = open_bin(self.bin_path, header.dtype, self.mode)
        try:
            _check_bin_size(header, lengths, pointers, source, self.bin_path)
        except FormatError:
            source.close()
            raise
        if per_sequence:
            documents = None
        return _Opened(os.getpid(), header, lengths, pointers, documents, modes, source, per_sequence)

    def _index(self) -> tuple[IndexHeader, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """The header and (lengths, pointers, documents, modes) of either index format."""
        buffer = self._read_index()
        if is_legacy(buffer[:8]):
            header, lengths, pointers, documents = read_legacy(
                buffer, self.idx_path, dtype_codes=self.dtype_codes, multimodal=self.multimodal
            )
            return header, lengths, pointers, documents, None
        if self.sequences is not None and self.given_dtype is not None:
            header = header_from_counts(
                bytes(buffer[:HEADER_SIZE]), len(buffer), self.idx_path, self.sequences, self.given_dtype,
                multimodal=self.multimodal, source=self.sequences_path,
            )
            return (header, *index_arrays(buffer, header))
        header = parse_header(
            bytes(buffer[:HEADER_SIZE]),
            len(buffer),
            self.idx_path,
            dtype_codes=self.dtype_codes,
            multimodal=self.multimodal,
        )
        if self.sequences is not None:
            check_counts(header, self.sequences, self.idx_path, self.sequences_path)
        return (header, *index_arrays(buffer, header))

    def _float_header(self, header: IndexHeader, lengths: np.ndarray) -> IndexHeader:
        """Codes 6/7: "auto" takes the float type the ``.bin`` size fits; a forced table that the
        size contradicts is named, since the cause is the table, not a damaged file."""
        fitting = resolve_float_dtype(header, lengths, self._bin_size())
        if self.dtype_codes == "auto" or fitting.dtype == header.dtype:
            return fitting
        raise FormatError(
            f"dtype code {header.code} is {header.dtype} in the {self.dtype_codes!r} table, but the .bin"
            f" size fits {fitting.dtype} (codes 6 and 7 are swapped between megatron-core and GPT-NeoX)",
            path=self.idx_path,
            hint="open it with dtype_codes='auto' (the default), which takes the table the .bin size"
            " fits (tokenload convert: --dtype-codes auto)",
        )

    def _bin_size(self) -> int:
        try:
            if "://" in self.bin_path:
                from ..storage import file_size

                return file_size(self.bin_path)
            return os.stat(self.bin_path).st_size
        except OSError as exc:
            raise read_error(exc, self.bin_path, "token data") from None

    def _read_index(self):
        try:
            from ..storage import local_path  # a URL's .idx: its local copy

            with open(local_path(self.idx_path), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if self.mode is ReadMode.MMAP and size > 0:
                    return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
                return memoryview(f.read())
        except FileNotFoundError as exc:
            raise _missing_index(exc, self.idx_path) from None
        except OSError as exc:
            raise read_error(exc, self.idx_path, "the index") from None

    def close(self) -> None:
        """Drop file handles and mappings; the next access reopens."""
        if self._state is not None:
            self._state.bin.close()
            self._state = None

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_state"}

    def __setstate__(self, state: dict) -> None:
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

        ``arange(N + 1)`` for an index without document boundaries (``documents_from_sequences``)."""
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
        return state.header.sequence_count if state.per_sequence else state.header.document_count - 1

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
            raise IndexError(f"sequence {index} out of range for {count} sequences in {self.idx_path}")
        seq_len = int(state.lengths[index])
        if seq_len < 0:
            raise _negative_length(index, seq_len, self.idx_path)
        if length is None:
            length = seq_len - offset
        if offset < 0 or length < 0 or offset + length > seq_len:
            raise IndexError(
                f"tokens [{offset}, {offset + length}) are outside sequence {index} of length {seq_len}"
            )
        return state.bin.read(int(state.pointers[index]) // state.itemsize + offset, length)

    def __getitem__(self, key: int | slice) -> np.ndarray | list[np.ndarray]:
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

        Each sequence is taken at its own pointer, as ``get`` takes it: one contiguous read would
        silently return other tokens when a corrupt index's pointers disagree with its lengths.
        Sequences stored back to back (every sound file) are still read in one piece."""
        state = self._opened()
        lengths = state.lengths[begin:end].astype(np.int64)
        if int(lengths.min()) < 0:
            i = begin + int(np.argmin(lengths))
            raise _negative_length(i, int(state.lengths[i]), self.idx_path)
        starts = state.pointers[begin:end] // state.itemsize
        if bool(np.all(starts[1:] == starts[:-1] + lengths[:-1])):
            return state.bin.read(int(starts[0]), int(lengths.sum())), lengths
        return state.bin.read_spans(starts, lengths), lengths

    def read_pieces(
        self, sequences: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, dtype: np.dtype | None = None
    ) -> np.ndarray:
        """Concatenated tokens of pieces ``(sequence, offset, length)``, in one vectorized read,
        optionally cast to ``dtype`` on the way."""
        starts = self.token_starts(sequences)
        starts += offsets
        return self.read_spans(starts, lengths, dtype)

    def read_spans(self, starts: np.ndarray, lengths: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
        """Concatenated tokens of ``.bin`` token ranges ``[starts[i], starts[i] + lengths[i])``,
        optionally cast to ``dtype`` on the way."""
        return self._opened().bin.read_spans(starts, lengths, dtype)

    def token_starts(self, sequences: np.ndarray) -> np.ndarray:
        """Position in ``.bin`` (in tokens) where each sequence begins (a new int64 array)."""
        state = self._state
        if state is None or state.pid != os.getpid():
            state = self._opened()
        return state.pointers[sequences] // state.itemsize

    def document(self, index: int) -> np.ndarray:
        """All tokens of document ``index`` (its sequences concatenated)."""
        docs = self.document_indices
        if not 0 <= index < len(docs) - 1:
            raise IndexError(f"document {index} out of range for {len(docs) - 1} documents")
        first, last = int(docs[index]), int(docs[index + 1])
        if not 0 <= first <= last <= self.num_sequences:
            raise FormatError(
                f"document {index} spans sequences [{first}, {last}), outside [0, {self.num_sequences}]",
                path=self.idx_path,
                hint="the index is corrupt; run `tokenload verify` and rewrite the file",
            )
        if first == last:
            return np.zeros(0, dtype=self.dtype)
        return self._run(first, last)[0]


def _negative_length(index: int, length: int, path: str) -> FormatError:
    return FormatError(
        f"sequence {index} has length {length}, expected a length >= 0",
        path=path,
        hint="the index is corrupt; run `tokenload verify` and rewrite the file",
    )


def _per_sequence_documents(header: IndexHeader, documents: np.ndarray, path: str) -> bool:
    """Check the two ends of ``document_indices`` (O(1)); True for GPT-NeoX's boundary-less ``[0]``.

    A first entry other than 0 or a last one other than N would make documents start or end at
    sequences the file does not have, so reads would silently return the wrong tokens."""
    n = header.sequence_count
    first, last = int(documents[0]), int(documents[-1])
    if documents.size == 1 and first == 0 and n > 0:
        return True
    if first != 0:
        raise _bad_documents(f"document_indices[0] is {first}, expected 0", path)
    if last != n:
        raise _bad_documents(f"document_indices[-1] is {last}, expected the sequence count {n}", path)
    return False


def _bad_documents(message: str, path: str) -> FormatError:
    return FormatError(
        message,
        path=path,
        hint="the index is corrupt or was written incompletely; rewrite the file (tokenload"
        " preprocess or merge), and run `tokenload verify` on its other copies",
    )


def _missing_index(exc: OSError, path: str) -> StorageError:
    """No ``.idx``: name a writer's leftovers when one was killed while replacing the pair."""
    folder, name = os.path.split(path)
    leftovers = glob.glob(os.path.join(glob.escape(folder or "."), f".{glob.escape(name)}.tmp-*"))
    if not leftovers:
        return read_error(exc, path, "the index")
    return StorageError(
        f"cannot read the index ({exc.strerror}); its hidden temporary {os.path.basename(leftovers[0])}"
        " remains",
        path=path,
        hint="a writer or merge of this prefix was killed while replacing its files; rerun it (a"
        " new merge removes the leftovers)",
    )


def _check_bin_size(header, lengths, pointers, source: BinSource, path: str) -> None:
    if header.sequence_count == 0:
        expected = 0
    else:
        expected = int(pointers[-1]) + int(lengths[-1]) * header.dtype.itemsize
    if expected != source.num_bytes:
        state = "shorter" if source.num_bytes < expected else "longer"
        raise FormatError(
            f".bin is {source.num_bytes} bytes, {state} than the {expected} bytes its index describes",
            path=path,
            hint="the .bin and .idx do not belong together or one was truncated; rewrite the pair",
        )
