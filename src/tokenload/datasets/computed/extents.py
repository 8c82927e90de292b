"""Where a split of a token file lies, for the computed order, read without mapping the file.

An ``Extent`` is what the computed order (``datasets.computed``) needs of one split of one file:
the split's sequence range, its window grid (first token and token count of the split's stream),
the token dtype and an identity made of content facts (counts, dtype, ``.bin`` size, the split's
range and token extent, an xxh3 of the 1024 lengths next to each end; never the path).

``file_extent`` reads a few entries of the ``.idx`` with ``pread`` (its header, or nothing of it
with a sequences JSON that gives the dtype, then the pointers at the split's two ends and at most
8 KiB of lengths next to them) and stats the ``.bin``: time and memory do not depend on the
number of documents, and no file stays open. Legacy and float indices, rare formats, are opened
by their reader instead; the mock source's extent is computed from its lengths.

Separate from ``datasets.computed`` because this is file reading (the ``.idx`` layout, its
errors, the identity hash) and that module is the order and its items over any extent.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import xxhash

from ...errors import FormatError
from ...format.idx import FLOAT_CODES, HEADER_SIZE, parse_header
from ...format.legacy import is_legacy
from ...format.opening import missing_prefix_error
from ...format.sequences import SequencesFile, check_counts, check_index_size
from ...index import split_range
from ...index.splits import Bookend
from ...index.windows import WindowGrid
from ...storage import file_size, local_path
from ...storage.os_errors import read_error
from ..sources import MockSource, open_token_file

__all__ = ["Extent", "OnExtent", "file_extent", "mock_extent"]

_SAMPLED_LENGTHS = 1024
"""Lengths hashed next to each end of a split for its identity (4 KiB each)."""


@dataclass(frozen=True, kw_only=True)
class Extent:
    """What the computed order needs of one split of one file, read without mapping it."""

    begin: int
    end: int
    grid: WindowGrid
    dtype: np.dtype
    identity: str
    """Content facts of the file and the split (never its path)."""


def _pread(fd: int, offset: int, size: int, path: str) -> bytes:
    try:
        data = os.pread(fd, size, offset)
    except OSError as exc:
        raise read_error(exc, path, "the index") from None
    if len(data) != size:
        raise FormatError(
            f"index holds {len(data)} bytes at offset {offset}, expected {size}",
            path=path,
            hint="the .idx is truncated; rewrite the token file",
        )
    return data


def _pointers(fd: int, at: int, i: int, n: int, path: str) -> tuple[int, ...]:
    """Pointer i and, when there is one, pointer i + 1 (one ``pread``)."""
    count = min(2, n - i)
    return struct.unpack(f"<{count}q", _pread(fd, at + 8 * i, 8 * count, path))


def _check_step(i: int, pointers: tuple[int, ...], length: int, dtype: np.dtype, path: str) -> None:
    """``pointer[i + 1] - pointer[i] == length[i] * itemsize``, as every read of a token file
    checks it (``TokenFile.token_starts``); a ``FormatError`` naming the sequence otherwise."""
    if len(pointers) == 2 and pointers[1] - pointers[0] != length * dtype.itemsize:
        raise FormatError(
            f"sequence {i} has pointer {pointers[0]} and length {length} ({length * dtype.itemsize}"
            f" bytes of {dtype}), but sequence {i + 1}'s pointer is {pointers[1]}; expected "
            "pointer[i + 1] - pointer[i] == length[i] * itemsize",
            path=path,
            hint="the index is corrupt (lengths or pointers changed); run `tokenload verify` and "
            "rewrite the file",
        )


def file_extent(
    prefix: str,
    bookend: Bookend,
    sequences: SequencesFile | None,
    *,
    sequence_length: int,
    extra: int,
    read_mode: str,
) -> Extent:
    """The split ``bookend`` of ``prefix`` in windows of ``sequence_length + extra`` tokens: a
    few ``pread`` s of the ``.idx`` (no header with a sequences JSON that gives the dtype), the
    ``.bin`` size from one ``stat`` (a URL: its node-local ``.idx`` copy and one HEAD).
    ``read_mode``: how a legacy or float file, which its reader must open, is read."""
    layout = (sequence_length, extra)
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    try:
        fd = os.open(local_path(idx_path), os.O_RDONLY)  # a URL's .idx: its local copy
    except OSError as exc:  # a missing one: the hint names the nearest existing prefixes
        raise missing_prefix_error(exc, idx_path) from None
    try:
        entry = None if sequences is None else sequences.entry(prefix)
        source = None if sequences is None else sequences.path  # where the counts come from
        if entry is not None and entry.dtype is not None:
            n, d, dtype = entry.sequence_count, entry.document_count, np.dtype(entry.dtype)
            # the counts are the JSON's: a file changed since is named with both files, as the
            # Megatron order names it (one fstat; the header is not read)
            check_index_size(
                os.fstat(fd).st_size,
                idx_path,
                (n, d),
                dtype,
                multimodal=None,
                source=source,
            )
        else:
            size = os.fstat(fd).st_size
            head = _pread(fd, 0, min(HEADER_SIZE, size), idx_path)
            if is_legacy(head[:8]):
                return _opened_extent(prefix, bookend, layout, read_mode)
            header = parse_header(head, size, idx_path, dtype_codes="megatron")
            if header.code in FLOAT_CODES:  # the .bin size decides the float type: open it
                return _opened_extent(prefix, bookend, layout, read_mode)
            if entry is not None:  # counts without a dtype: the header must hold them
                counts = (entry.sequence_count, entry.document_count)
                check_counts(header, counts, idx_path, source)
            n, d, dtype = header.sequence_count, header.document_count, header.dtype
        begin, end = split_range(bookend, n)
        sampled = b""
        first = last = 0
        if end > begin:
            pointers = HEADER_SIZE + 4 * n
            # each end's pointer with the next one: a split's two ends are all the computed order
            # takes of the pointers, so each is checked against its neighbour and its length
            ends = [_pointers(fd, pointers, i, n, idx_path) for i in (begin, end - 1)]
            head_n = min(_SAMPLED_LENGTHS, end - begin)
            tail_n = min(_SAMPLED_LENGTHS, end - begin)
            lead = _pread(fd, HEADER_SIZE + 4 * begin, 4 * head_n, idx_path)
            tail = _pread(fd, HEADER_SIZE + 4 * (end - tail_n), 4 * tail_n, idx_path)
            first = ends[0][0]
            last = ends[1][0] + dtype.itemsize * int(np.frombuffer(tail, dtype="<i4")[-1])
            first_length = int(np.frombuffer(lead[:4], dtype="<i4")[0])
            _check_step(begin, ends[0], first_length, dtype, idx_path)
            if end < n:
                last_length = (last - ends[1][0]) // dtype.itemsize
                _check_step(end - 1, ends[1], last_length, dtype, idx_path)
            sampled = lead + tail
    finally:
        os.close(fd)
    bin_bytes = file_size(bin_path)  # one stat, or one HEAD of an object (StorageError)
    if last > bin_bytes or (end == n > begin and last != bin_bytes):
        state = "shorter" if bin_bytes < last else "longer"
        raise FormatError(
            f".bin is {bin_bytes} bytes, {state} than the {last} bytes its index describes",
            path=bin_path,
            hint="the .bin and .idx do not belong together or one was truncated",
        )
    digest = xxhash.xxh3_64_hexdigest(sampled)
    facts = f"{n}|{d}|{dtype.str}|{bin_bytes}|{begin}|{end}|{first}|{last}|{digest}"
    return _extent(
        begin, end, first // dtype.itemsize, (last - first) // dtype.itemsize, dtype, facts, layout
    )


def _opened_extent(
    prefix: str, bookend: Bookend, layout: tuple[int, int], read_mode: str
) -> Extent:
    """Legacy and float indices: their reader decides (it opens the file; rare formats)."""
    tf = open_token_file(prefix, read_mode, None)
    begin, end = split_range(bookend, tf.num_sequences)
    pointers, lengths, size = tf.sequence_pointers, tf.sequence_lengths, tf.dtype.itemsize
    grid = WindowGrid.from_pointers(pointers, lengths, size, begin, end, *layout)
    sampled = np.concatenate(
        [
            lengths[begin : begin + _SAMPLED_LENGTHS],
            lengths[max(begin, end - _SAMPLED_LENGTHS) : end],
        ]
    )
    digest = xxhash.xxh3_64_hexdigest(sampled.tobytes())
    facts = f"{tf.num_sequences}|{tf.dtype.str}|{tf.num_tokens}|{begin}|{end}|{digest}"
    tf.close()
    return _extent(begin, end, grid.first_token, grid.num_tokens, tf.dtype, facts, layout)


def _extent(
    begin: int,
    end: int,
    first_token: int,
    num_tokens: int,
    dtype: npt.DTypeLike,
    facts: str,
    layout: tuple[int, int],
) -> Extent:
    """``layout``: (sequence length, extra token)."""
    grid = WindowGrid(
        first_token=first_token,
        num_tokens=num_tokens,
        sequence_length=layout[0],
        extra=layout[1],
    )
    identity = hashlib.sha256(
        f"{facts}|S={grid.sequence_length}|x={grid.extra}".encode()
    ).hexdigest()[:16]
    return Extent(begin=begin, end=end, grid=grid, dtype=np.dtype(dtype), identity=identity)


def mock_extent(
    source: MockSource, bookend: Bookend, *, sequence_length: int, extra: int
) -> Extent:
    lengths = source.sequence_lengths
    begin, end = split_range(bookend, len(lengths))
    first = int(np.sum(lengths[:begin], dtype=np.int64))
    tokens = int(np.sum(lengths[begin:end], dtype=np.int64))
    facts = f"mock|{source.vocab_size}|{source.eod_id}|{begin}|{end}"
    return _extent(begin, end, first, tokens, np.dtype(np.int64), facts, (sequence_length, extra))


class OnExtent:
    """What a dataset over one split's ``extent`` answers from it: its identity and grid."""

    extent: Extent

    @property
    def identity(self) -> str:
        return self.extent.identity

    @property
    def grid(self) -> WindowGrid:
        return self.extent.grid
