"""Opening a token file pair (``PREFIX.idx`` + ``PREFIX.bin``): everything ``TokenFile`` does on
first use, in the process that uses it, kept apart from ``reader.py``'s read API so that the
checks an open makes are read in one place. It reads the file's options through ``PairSpec``,
which ``TokenFile`` satisfies, so the dependency points one way: ``reader`` imports ``opening``.

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
import logging
import os
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import xxhash

from ..byte_source import ByteSource
from ..errors import FormatError, StorageError
from ..storage.os_errors import read_error
from .atomic import finish_publish
from .bin import ReadMode, open_bin, warmup_file
from .descriptors import map_readonly
from .idx import (
    FLOAT_CODES,
    HEADER_SIZE,
    DtypeCodes,
    IndexHeader,
    check_token_dtype,
    index_arrays,
    parse_header,
    resolve_float_dtype,
)
from .legacy import is_legacy, read_legacy
from .prefixes import folder_message, missing_prefix_hint
from .sequences import check_counts, header_from_counts
from .sidecar import read_sidecar, sidecar_path

logger = logging.getLogger(__name__)


class PairSpec(Protocol):
    """What ``open_pair`` reads of the token file it opens (``reader.TokenFile``'s options)."""

    @property
    def prefix(self) -> str: ...
    @property
    def idx_path(self) -> str: ...
    @property
    def bin_path(self) -> str: ...
    @property
    def mode(self) -> ReadMode: ...
    @property
    def dtype_codes(self) -> DtypeCodes: ...
    @property
    def multimodal(self) -> bool | None: ...
    @property
    def warmup(self) -> bool: ...
    @property
    def sequences(self) -> tuple[int, int] | None: ...
    @property
    def given_dtype(self) -> np.dtype | None: ...
    @property
    def sequences_path(self) -> str | None: ...
    @property
    def allow_float(self) -> bool: ...


@dataclass
class Opened:
    """A token file's state in the process that opened it."""

    pid: int
    header: IndexHeader
    lengths: np.ndarray
    pointers: np.ndarray
    documents: np.ndarray | None
    """None until first needed when ``per_sequence`` (then it is ``arange(N + 1)``)."""
    modes: np.ndarray | None
    bin: ByteSource
    per_sequence: bool
    """The index records no document boundaries: each sequence is one document."""
    verified: np.ndarray | None = None
    """Per chunk of ``CHECK_CHUNK`` sequences, whether its pointers were checked against its
    lengths (``TokenFile.token_starts``); made on first use."""
    unverified: int = -1
    """Chunks not checked yet (-1: not counted yet); 0 once every pointer was checked."""
    stamp: tuple[Any, ...] | None = None
    """What identifies the pair opened (``pair_stamp``): a reopening in another process must
    find the same files."""

    @property
    def itemsize(self) -> int:
        return self.header.dtype.itemsize


def open_pair(file: PairSpec, *, retry: bool = True) -> Opened:
    """Open ``file``'s index and ``.bin`` with its options, after the O(1) checks.

    A writer replaces the ``.idx`` last (``TokenFileWriter._publish``), so the ``.bin`` opened
    after an ``.idx`` belongs to it when that ``.idx`` is still in place afterwards: one
    ``stat`` checks it, and a pair replaced in between is opened again."""
    if file.warmup and "://" not in file.prefix:
        warmup_file(file.idx_path)
        warmup_file(file.bin_path)
    opened: list[int] = []
    header, lengths, pointers, documents, modes = _index(file, opened)
    per_sequence = _per_sequence_documents(header, documents, file.idx_path)
    # a float code in an MMIDIDX header (in a TNTIDX index its element size decides)
    if header.code in FLOAT_CODES and header.index_format == "MMIDIDX":
        header = _float_header(file, header, lengths)
    if not file.allow_float:
        check_token_dtype(header, file.idx_path)
    source = open_bin(file.bin_path, header.dtype, file.mode)
    if not _same_index(file, opened, retry):
        source.close()
        return open_pair(file, retry=False)  # replaced between the two opens: both again
    try:
        _check_bin_size(header, lengths, pointers, source, file.bin_path)
        _check_recorded_dtype(file, header)  # a width the sizes did not refuse: the type
    except FormatError:
        source.close()
        raise
    kept = None if per_sequence else documents
    opened_pair = Opened(os.getpid(), header, lengths, pointers, kept, modes, source, per_sequence)
    opened_pair.stamp = pair_stamp(file, opened, source)
    return opened_pair


_SAMPLE = 4096
"""Bytes of each end of an ``.idx`` that its opening hashes (``pair_stamp``)."""


def pair_stamp(file: PairSpec, opened: list[int], source: Any) -> tuple[Any, ...]:
    """The identity of an opened pair, the same on every host that reads it (a dataset may be
    pickled to another node, where a shared filesystem's device and inode numbers differ, or
    that holds its own copy) and whatever touches its times: the ``.idx``'s size and a hash of
    its two ends (an object's local copy: its name, made of its ETag) and the ``.bin``'s size
    and a hash of its two ends (an object's size and ETag). A rewrite that keeps both sizes and
    both files' ends is not told apart (the bytes in between are not read for this)."""
    from ..storage import local_path

    if "://" in file.prefix:
        idx: Any = os.path.basename(local_path(file.idx_path))
    else:
        idx = tuple(opened[2:4])
    stamp = getattr(source, "stamp", None)  # (a local file's size and ends, an object's ETag)
    return (idx, stamp() if callable(stamp) else None)


def _same_index(file: PairSpec, opened: list[int], retry: bool) -> bool:
    """Whether the ``.idx`` opened (device and inode in ``opened``) is still ``PREFIX.idx``; a
    file in object storage (its local copy) is not checked. False is an error on the retry."""
    if not opened or "://" in file.prefix:
        return True
    try:
        st = os.stat(file.idx_path)
        if (st.st_dev, st.st_ino) == tuple(opened[:2]):
            return True
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise read_error(exc, file.idx_path, "the index") from None
    if retry:
        return False
    raise StorageError(
        "the index was replaced while the token file was opened, twice in a row",
        path=file.idx_path,
        hint="a writer or merge is rewriting this prefix right now; open it when it is done",
    )


def _index(
    file: PairSpec, opened: list[int]
) -> tuple[IndexHeader, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The header and (lengths, pointers, documents, modes) of either index format."""
    buffer = _read_index(file, opened)
    if is_legacy(buffer[:8]):
        header, lengths, pointers, documents = read_legacy(
            buffer, file.idx_path, dtype_codes=file.dtype_codes, multimodal=file.multimodal
        )
        return header, lengths, pointers, documents, None
    if file.sequences is not None and file.given_dtype is not None:
        header = header_from_counts(
            bytes(buffer[:HEADER_SIZE]),
            len(buffer),
            file.idx_path,
            file.sequences,
            file.given_dtype,
            multimodal=file.multimodal,
            source=file.sequences_path,
        )
        return (header, *index_arrays(buffer, header))
    header = parse_header(
        bytes(buffer[:HEADER_SIZE]),
        len(buffer),
        file.idx_path,
        dtype_codes=file.dtype_codes,
        multimodal=file.multimodal,
    )
    if file.sequences is not None:
        check_counts(header, file.sequences, file.idx_path, file.sequences_path)
    return (header, *index_arrays(buffer, header))


def _check_recorded_dtype(file: PairSpec, header: IndexHeader) -> None:
    """The dtype the ``PREFIX.json`` sidecar recorded must be the header's: a dtype code changed
    to another type of the same width (uint16 -> int16) passes every size check and would read
    every token >= 32768 as a negative number. One open of a small file (or one failed lookup
    when there is none: Megatron's files); a file in object storage is not checked here (a GET
    per process), nor is a sidecar that cannot be read (reading never requires one)."""
    if "://" in file.prefix:
        return
    try:
        sidecar = read_sidecar(file.prefix)
    except (FormatError, StorageError):
        return
    try:
        if sidecar is None or np.dtype(sidecar.dtype) == header.dtype:
            return
    except TypeError:  # not a dtype name: a damaged sidecar says nothing
        return
    raise FormatError(
        f"the header's dtype code {header.code} means {header.dtype}, but the sidecar "
        f"{os.path.basename(sidecar_path(file.prefix))} records {sidecar.dtype}; expected the "
        "same dtype in both",
        path=file.idx_path,
        hint="the .idx header is damaged (or the sidecar belongs to another file); run "
        "`tokenload verify --hashes` and rewrite the file",
    )


def _float_header(file: PairSpec, header: IndexHeader, lengths: np.ndarray) -> IndexHeader:
    """Codes 6/7: "auto" takes the float type the ``.bin`` size fits; a forced table that the
    size contradicts is named, since the cause is the table, not a damaged file."""
    fitting = resolve_float_dtype(header, lengths, _bin_size(file.bin_path))
    if file.dtype_codes == "auto" or fitting.dtype == header.dtype:
        return fitting
    raise FormatError(
        f"dtype code {header.code} is {header.dtype} in the {file.dtype_codes!r} table, but the"
        f" .bin size fits {fitting.dtype} (codes 6 and 7 are swapped between megatron-core and"
        " GPT-NeoX)",
        path=file.idx_path,
        hint="open it with dtype_codes='auto' (the default), which takes the table the .bin size"
        " fits (as `tokenload convert --dtype-codes auto` does)",
    )


def _bin_size(bin_path: str) -> int:
    try:
        if "://" in bin_path:
            from ..storage import file_size

            return file_size(bin_path)
        return os.stat(bin_path).st_size
    except OSError as exc:
        raise read_error(exc, bin_path, "token data") from None


def _read_index(file: PairSpec, opened: list[int], *, finish: bool = True) -> memoryview:
    """The ``.idx`` bytes (a mapping in mmap mode); its device and inode go to ``opened``. No
    ``.idx`` while a replacement is half published: wait for its writer, or finish it when the
    writer was killed (``atomic.finish_publish``), and read the result."""
    try:
        from ..storage import local_path  # a URL's .idx: its local copy

        with open(local_path(file.idx_path), "rb") as f:
            st = os.fstat(f.fileno())
            if file.mode is ReadMode.MMAP and st.st_size > 0:  # a mapping that keeps no descriptor
                data = map_readonly(f.fileno(), st.st_size).data
            else:
                data = memoryview(f.read())
            # its content's sample (first and last 4 KiB: the header, the first lengths, the
            # last document indices): what ``pair_stamp`` tells a same-size rewrite by
            sample = xxhash.xxh3_64_intdigest(bytes(data[:_SAMPLE]) + bytes(data[-_SAMPLE:]))
            opened[:] = [st.st_dev, st.st_ino, st.st_size, sample]
            return data
    except FileNotFoundError as exc:
        if finish and "://" not in file.idx_path and _finished(file.idx_path):
            return _read_index(file, opened, finish=False)
        raise _missing_index(exc, file.idx_path) from None
    except OSError as exc:
        raise read_error(exc, file.idx_path, "the index") from None


def _finished(idx_path: str) -> bool:
    """Whether a half-published replacement of ``idx_path`` was found and is now complete."""
    try:
        return finish_publish(idx_path)
    except OSError as exc:  # e.g. a read-only folder: the error names the leftovers
        logger.warning("cannot finish the replacement of %s: %s", idx_path, exc)
        return False


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
        raise _bad_documents(
            f"document_indices[-1] is {last}, expected the sequence count {n}", path
        )
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
        return missing_prefix_error(exc, path)
    return StorageError(
        f"cannot read the index ({exc.strerror}); its hidden temporary "
        f"{os.path.basename(leftovers[0])}"
        " remains",
        path=path,
        hint="a writer or merge of this prefix was killed while replacing its files and its new"
        " files could not be put in place here (a read-only folder?); rerun it (a new merge removes"
        " the leftovers), or open the prefix once from an account that may write its folder",
    )


def missing_prefix_error(exc: OSError, idx_path: str) -> StorageError:
    """The error for an ``.idx`` that cannot be opened: for a missing one (a prefix that misses,
    or a folder given as a prefix) the hint names the nearest existing prefixes."""
    error = read_error(exc, idx_path, "the index")
    if not isinstance(exc, FileNotFoundError) or "://" in idx_path:
        return error
    prefix = idx_path[: -len(".idx")] if idx_path.endswith(".idx") else idx_path
    folder = prefix if os.path.isdir(prefix) else prefix.rstrip("/\\")
    message = folder_message(folder)
    hint = missing_prefix_hint(folder)
    if message is None and hint is None:
        return error
    missing = StorageError(
        message or error.message, path=None if message else idx_path, hint=hint or error.hint
    )
    missing.strerror = exc.strerror
    return missing


def _check_bin_size(
    header: IndexHeader,
    lengths: np.ndarray,
    pointers: np.ndarray,
    source: ByteSource,
    path: str,
) -> None:
    if header.sequence_count == 0:
        expected = 0
    else:
        expected = int(pointers[-1]) + int(lengths[-1]) * header.dtype.itemsize
    if expected != source.num_bytes:
        state = "shorter" if source.num_bytes < expected else "longer"
        raise FormatError(
            f".bin is {source.num_bytes} bytes, {state} than the {expected} bytes its index "
            "describes",
            path=path,
            hint="the .bin and .idx do not belong together or one was truncated; rewrite the pair",
        )
