"""Reading one input file for preprocess: a stream of chunks, whole or one byte range at a time.

Line-based files are cut into chunks of about ``chunk_bytes`` at line boundaries; each chunk carries
the number of its first line, so a worker reports ``file:line`` without seeing the rest of the file.
Compressed files are decompressed block by block with an explicit end-of-stream check: a truncated
``.gz``/``.zst`` is an error, never a silently shorter file (zstandard's stream reader would just
stop). Arrow files (``datasets``' ``save_to_disk`` output) are read one record batch at a time
from a plain file (not memory-mapped, so memory stays at the chunks in flight), and regrouped into
chunks of about ``chunk_bytes``. Which files to read, and how, is ``inputs``; the pieces of an
in-memory dataset object are read by ``hf``.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from ..errors import StorageError, TokenloadError, require
from .inputs import InputFile, _remote, is_url

_BLOCK = 1 << 20


@dataclass(frozen=True)
class Chunk:
    """A slice of one input file: whole lines, a whole text file, or a batch of parquet rows."""

    path: str
    format: str
    first: int
    """1-based number of the first line (row) in the chunk."""
    payload: Any
    """bytes, or a pyarrow RecordBatch/Table for parquet, arrow and dataset (a dict of the row
    count and column names when a requested column is missing)."""
    size: int
    """Bytes of input text (decompressed) the chunk holds, for progress."""


class UnreadableFile(Exception):
    """The file could not be read to its end (I/O error, corrupt or truncated compression)."""


class ChunkSize:
    """Input bytes per chunk: small at first, then what one worker encodes in about
    ``TARGET_SECONDS`` at the rate measured so far, within [``MINIMUM``, ``limit``].

    Why: results come back per chunk, so the chunk's encode time is how often progress moves and
    how long the first result takes. A fixed 4 MB chunk took ~7 s with a slow encoder (an 8 MB
    file showed 0% for ~15 s); fast encoders still get full-size chunks, so their per-chunk
    overhead stays negligible. The output does not depend on where chunks are cut.
    """

    TARGET_SECONDS = 0.4
    MINIMUM = 64 << 10
    FIRST = 128 << 10

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.value = min(limit, self.FIRST)

    def __call__(self) -> int:
        return self.value

    def observe(self, nbytes: int, seconds: float) -> None:
        """Adjust to a chunk of ``nbytes`` that a worker encoded in ``seconds``."""
        if nbytes > 0 and seconds > 0:
            target = nbytes / seconds * self.TARGET_SECONDS
            self.value = int(min(self.limit, max(min(self.MINIMUM, self.limit), target)))


def read_chunks(
    file: InputFile, chunk_bytes: int | Callable[[], int], columns: tuple[str, ...]
) -> Iterator[Chunk]:
    """The chunks of ``file`` in order; raises UnreadableFile if it cannot be read to its end
    and StorageError if it cannot be read at all (permissions) or its storage fails."""
    size = chunk_bytes if callable(chunk_bytes) else (lambda: chunk_bytes)
    if file.format == "parquet":
        yield from _parquet_chunks(file, getattr(chunk_bytes, "limit", size()), columns)
        return
    if file.format == "arrow":
        yield from _arrow_chunks(file, getattr(chunk_bytes, "limit", size()), columns)
        return
    if file.format == "dataset":
        for first, table in file.source.tables(getattr(chunk_bytes, "limit", size()), columns):
            nbytes = 0 if isinstance(table, dict) else int(table.nbytes)
            yield Chunk(file.path, "dataset", first, table, nbytes)
        return
    blocks = _blocks(file)
    if file.format == "text":
        data = b"".join(blocks)
        yield Chunk(file.path, "text", 1, data, len(data))
        return
    line = 1
    for data in _line_chunks(blocks, size):
        yield Chunk(file.path, file.format, line, data, len(data))
        line += data.count(b"\n")


def byte_ranges(file: InputFile, range_bytes: int) -> list[tuple[int, int]]:
    """The byte ranges a file is split into for tasks of their own: about ``range_bytes`` each
    for an uncompressed line-based file (a range holds the lines that start inside it, so the
    cuts need no reading), else the whole file as one range ``(0, -1)``."""
    if file.compression or file.format not in ("jsonl", "lines") or file.size is None:
        return [(0, -1)]
    if file.size <= range_bytes:
        return [(0, -1)]
    cuts = [*range(0, file.size, range_bytes), file.size]
    return list(itertools.pairwise(cuts))


def read_range_chunks(
    file: InputFile,
    start: int,
    end: int,
    chunk_bytes: int | Callable[[], int],
    columns: tuple[str, ...],
) -> Iterator[Chunk]:
    """The chunks of the lines that start in bytes [start, end) of ``file`` (``end`` -1: the whole
    file, any format). Line numbers count from 1 at the range's first line; the caller shifts
    them by the lines of the earlier ranges."""
    if end < 0:
        yield from read_chunks(file, chunk_bytes, columns)
        return
    size = chunk_bytes if callable(chunk_bytes) else (lambda: chunk_bytes)
    line = 1
    for data in _line_chunks(_range_blocks(file, start, end), size):
        yield Chunk(file.path, file.format, line, data, len(data))
        line += data.count(b"\n")


def _range_blocks(file: InputFile, start: int, end: int) -> Iterator[bytes]:
    """Bytes from the first line start at or after ``start`` to the first one at or after ``end``
    (a line starts at 0 and after each newline), so consecutive ranges share no line."""
    try:
        with _open_raw(file.path) as raw:
            pos, head = _first_line_start(raw, start)
            if pos >= end:
                return
            while True:
                block = head or raw.read(_BLOCK)
                head = b""
                if not block:
                    return
                if pos + len(block) >= end:  # the line under way at end-1 is ours, to its newline
                    cut = block.find(b"\n", max(end - 1 - pos, 0))
                    if cut >= 0:
                        yield block[: cut + 1]
                        return
                yield block
                pos += len(block)
    except (UnreadableFile, TokenloadError):
        raise
    except Exception as exc:
        raise _read_error(file.path, exc) from None


def _first_line_start(raw: Any, start: int) -> tuple[int, bytes]:
    """(offset of the first line that starts at or after ``start``, the bytes read past it)."""
    if start == 0:
        return 0, b""
    pos = start - 1
    raw.seek(pos)
    while block := raw.read(_BLOCK):
        cut = block.find(b"\n")
        if cut >= 0:
            return pos + cut + 1, block[cut + 1 :]
        pos += len(block)
    return pos, b""


def _line_chunks(blocks: Iterator[bytes], size: Callable[[], int]) -> Iterator[bytes]:
    """Regroup ``blocks`` into pieces of about ``size()`` bytes that end at a newline; a line
    longer than that stays whole."""
    buf = bytearray()
    scanned = 0  # buf[:scanned] holds no newline (a long line being read): not searched again
    for block in blocks:
        buf += block
        while len(buf) >= (target := size()):
            cut = buf.rfind(b"\n", scanned, target) if scanned < target else -1
            if cut < 0:
                cut = buf.find(b"\n", max(target, scanned))
                if cut < 0:
                    scanned = len(buf)
                    break
            with memoryview(buf) as view:
                piece = bytes(view[: cut + 1])
            del buf[: cut + 1]
            scanned = 0
            yield piece
    if buf:
        yield bytes(buf)


def _blocks(file: InputFile) -> Iterator[bytes]:
    """Decompressed bytes of ``file`` in blocks."""
    try:
        with _open_raw(file.path) as raw:
            raw_blocks = iter(lambda: raw.read(_BLOCK), b"")
            if file.compression is None:
                yield from raw_blocks
            else:
                yield from _decompress(raw_blocks, file.compression)
    except (UnreadableFile, TokenloadError):
        raise
    except Exception as exc:
        raise _read_error(file.path, exc) from None


def _read_error(path: str, exc: BaseException) -> BaseException:
    """What a failed read of input ``path`` is: a storage problem (permissions, an object store
    that fails mid-stream), a StorageError; damaged bytes, UnreadableFile (skippable)."""
    if isinstance(exc, PermissionError):
        return StorageError(
            f"cannot read the input file ({exc.strerror or exc})",
            path=path,
            hint="this user may not read it: fix its permissions (e.g. chmod a+r, or the owner),"
            " or leave it out of `inputs=`",
        )
    damaged = isinstance(exc, (EOFError, zlib.error)) or _is_zstd_error(exc)
    if is_url(path) and not damaged and not type(exc).__module__.startswith("pyarrow"):
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return StorageError(
            f"reading the object failed while it streamed ({type(exc).__name__}: {detail})",
            path=path,
            hint="check that the storage endpoint (e.g. AWS_ENDPOINT_URL) is up and reachable, then"
            " rerun the same command: input files already finished are resumed",
        )
    if damaged or isinstance(exc, OSError) or type(exc).__module__.startswith("pyarrow"):
        return UnreadableFile(str(exc) or type(exc).__name__)  # pyarrow: a damaged parquet/arrow
    return exc


def _is_zstd_error(exc: BaseException) -> bool:
    return type(exc).__name__ == "ZstdError"


def _open_raw(path: str) -> BinaryIO:
    if is_url(path):
        fsspec = require("fsspec", "s3", f"reading {path}")
        raw: BinaryIO = _remote(path, "open it", lambda: fsspec.open(path, "rb").open())
        return raw
    return open(path, "rb")


def _decompress(raw_blocks: Iterator[bytes], compression: str) -> Iterator[bytes]:
    """Decompress concatenated gzip members / zstd frames; a stream cut short is an error."""
    new: Callable[[], Any]
    if compression == "gzip":
        new = lambda: zlib.decompressobj(wbits=31)  # noqa: E731
    else:
        zstandard = require("zstandard", "preprocess", "reading .zst files")
        new = lambda: zstandard.ZstdDecompressor().decompressobj()  # noqa: E731
    obj, inside = new(), False
    for block in raw_blocks:
        while block:
            out = obj.decompress(block)
            inside = True
            if out:
                yield out
            if obj.eof:
                block, obj, inside = obj.unused_data, new(), False
            else:
                block = b""
    if inside:
        raise UnreadableFile(
            f"the {compression} stream is truncated (ends before its end-of-stream marker)"
        )


def _parquet_chunks(file: InputFile, chunk_bytes: int, columns: tuple[str, ...]) -> Iterator[Chunk]:
    pq = require("pyarrow.parquet", "parquet", "reading parquet files")
    try:
        with _open_raw(file.path) as raw:
            pf = pq.ParquetFile(raw)
            meta = pf.metadata
            names = set(pf.schema_arrow.names)
            present = [c for c in columns if c in names]
            rows_total = max(1, meta.num_rows)
            row_bytes = (
                sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
                / rows_total
            )
            batch_rows = max(1, int(chunk_bytes / max(row_bytes, 1.0)))
            first = 1
            if len(present) < len(columns):  # the worker reports the missing column per row
                for start in range(0, meta.num_rows, batch_rows):
                    n = min(batch_rows, meta.num_rows - start)
                    yield Chunk(file.path, "parquet", first, {"rows": n, "names": sorted(names)}, 0)
                    first += n
                return
            for batch in pf.iter_batches(batch_size=batch_rows, columns=list(columns)):
                yield Chunk(file.path, "parquet", first, batch, int(batch.nbytes))
                first += batch.num_rows
    except (UnreadableFile, TokenloadError):
        raise
    except Exception as exc:
        raise _read_error(file.path, exc) from None


def _arrow_chunks(file: InputFile, chunk_bytes: int, columns: tuple[str, ...]) -> Iterator[Chunk]:
    """An Arrow IPC file (stream format, as ``datasets`` writes, or file format) as chunks of
    about ``chunk_bytes`` of the requested columns; batches are read one at a time."""
    pa = require("pyarrow", "hf", "reading Arrow files")
    try:
        with pa.OSFile(file.path) if not is_url(file.path) else _open_raw(file.path) as raw:
            reader = _arrow_reader(pa, raw)
            names = reader.schema.names
            whole = all(c in names for c in columns)
            first, held, held_bytes = 1, [], 0
            for batch in reader:
                if not whole:  # the worker reports the missing column per row
                    missing = {"rows": batch.num_rows, "names": sorted(names)}
                    yield Chunk(file.path, "arrow", first, missing, 0)
                    first += batch.num_rows
                    continue
                batch = batch.select(list(columns))
                step = max(1, int(chunk_bytes * batch.num_rows / max(batch.nbytes, 1)))
                for start in range(0, batch.num_rows, step):
                    piece = batch.slice(start, step)
                    held.append(piece)
                    held_bytes += piece.nbytes
                    if held_bytes >= chunk_bytes:
                        table = pa.Table.from_batches(held)
                        yield Chunk(file.path, "arrow", first, table, held_bytes)
                        first += table.num_rows
                        held, held_bytes = [], 0
            if held:
                yield Chunk(file.path, "arrow", first, pa.Table.from_batches(held), held_bytes)
    except (UnreadableFile, TokenloadError):
        raise
    except Exception as exc:
        raise _read_error(file.path, exc) from None


class _Batches:
    """The record batches of an Arrow IPC file-format reader, one at a time."""

    def __init__(self, reader: Any) -> None:
        self.reader, self.schema = reader, reader.schema

    def __iter__(self) -> Iterator[Any]:
        return (self.reader.get_batch(i) for i in range(self.reader.num_record_batches))


def _arrow_reader(pa: Any, raw: Any) -> Any:
    """A reader of the stream format (``datasets``' files) or, after its magic, the file format."""
    if raw.read(6) == b"ARROW1":
        raw.seek(0)
        return _Batches(pa.ipc.open_file(raw))
    raw.seek(0)
    return pa.ipc.open_stream(raw)
