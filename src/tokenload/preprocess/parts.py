"""One part of a preprocess job done in one go: a whole input file, or one byte range of a large
one, encoded into its own part files in the work folder and marked finished.

This is the unit of work of the Ray executor (``cluster``), written so that it can run anywhere:
it takes a small description (file, range, work folder; never the input bytes), reads its own
bytes from the path, encodes them chunk by chunk (memory stays about one chunk), publishes each
part atomically and only then writes its marker. A second attempt of the same part (a retry
after its worker died) rewrites the same bytes under the same names, so a retry neither
duplicates nor loses records. Returns a small ``PartResult``: counts, never tokens.

Under a work prefix in object storage (``task.root`` is a URL) the part is made in a local
temporary folder of the node that runs the task, then each part file is uploaded (the index
last) and the marker object after them; the local copy is removed either way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import RecordError, TokenloadError
from ..format import TokenFileWriter
from ..storage.remote import is_url
from ..storage.upload import publish_prefix, temporary_folder
from .encode import EncodeTask, encode_chunk
from .inputs import InputFile
from .records import BadRecord
from .sources import UnreadableFile, read_range_chunks
from .summaries import FileSummary, PartSummary, RangeSummary
from .workdir import write_marker

_MAX_EXAMPLES = 20


@dataclass(frozen=True)
class PartTask:
    """What a task needs to encode one part; small and picklable."""

    index: int
    """Input file number (in input order)."""
    k: int
    """Byte range number within the file (0 for a whole file)."""
    file: InputFile
    span: tuple[int, int]
    """Byte range [start, end) of the file; (0, -1) for the whole file."""
    root: str
    """The work folder (a local path, or the URL of a work prefix in object storage)."""
    stem: str
    """Name stem of the part files and marker in the work folder."""
    encode: EncodeTask
    chunk_bytes: int

    @property
    def whole(self) -> bool:
        return self.span[1] < 0


@dataclass
class PartResult:
    """What a finished part reports back to the driver."""

    index: int
    k: int
    summary: PartSummary | None = None
    """The marker's content: a ``FileSummary`` (a whole file) or a ``RangeSummary`` (None when
    the part failed)."""
    examples: list[BadRecord] = field(default_factory=list)
    """Some skipped records, line numbers counted within the part's range."""
    error: BadRecord | None = None
    """Strict mode: the first bad record."""
    failure: TokenloadError | None = None
    """Any other typed error (storage, configuration), returned so Ray does not retry it."""
    damaged: str | None = None
    """The file could not be read to its end (a whole file is then committed empty)."""
    input_bytes: int = 0
    tokens: int = 0
    seconds: float = 0.0


Report = Callable[[int, int, int], None]
"""report(input bytes, tokens, documents) so far in this attempt; for a live progress bar."""


def encode_part(task: PartTask, report: Report | None = None) -> PartResult:
    """Encode ``task``'s part, publish it and write its marker; errors come back as values."""
    try:
        with _local_folder(task) as folder:
            return _encode_part(task, folder, report)
    except TokenloadError as exc:  # making the local folder or uploading the part
        return PartResult(task.index, task.k, failure=exc)


@contextlib.contextmanager
def _local_folder(task: PartTask) -> Iterator[str]:
    """Where the part files are written: the work folder itself, or for a work prefix in
    object storage a temporary folder on this node, removed afterwards."""
    if not is_url(task.root):
        yield task.root
        return
    folder = temporary_folder(f".part-{task.stem}-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _encode_part(task: PartTask, folder: str, report: Report | None) -> PartResult:
    start = time.perf_counter()
    result = PartResult(task.index, task.k)
    keys = task.encode.keys
    writers = _writers(task, folder)
    counts: Counter[str] = Counter()
    documents = lines = 0
    try:
        for chunk in read_range_chunks(task.file, *task.span, task.chunk_bytes, keys):
            encoded = encode_chunk(task.encode, chunk)
            for writer, (tokens, seq_lengths, per_doc) in zip(writers, encoded.outputs):
                write_documents(writer, tokens, seq_lengths, per_doc)
            documents += encoded.documents
            counts.update(encoded.skipped)
            result.examples.extend(encoded.examples[: _MAX_EXAMPLES - len(result.examples)])
            result.input_bytes += encoded.input_bytes
            result.tokens += sum(int(t.size) for t, _, _ in encoded.outputs)
            if isinstance(chunk.payload, bytes):
                lines = chunk.first - 1 + chunk.payload.count(b"\n")
            if report is not None:
                report(result.input_bytes, result.tokens, documents)
    except UnreadableFile as exc:
        result.damaged = str(exc) or type(exc).__name__
    except RecordError as exc:
        _abort(writers)
        record = getattr(exc, "record", None)
        if record is None:
            result.failure = exc
        else:
            result.error = record
        return result
    except TokenloadError as exc:
        _abort(writers)
        result.failure = exc
        return result
    except BaseException:
        _abort(writers)
        raise
    if result.damaged is not None:
        _abort(writers)
        if not task.whole or task.encode.strict:
            return result  # the driver decides for the whole file
        writers, documents, counts = [], 0, Counter({"unreadable_file": 1})
    counted = PartSummary(
        path=task.file.path,
        stamp=task.file.stamp,
        documents=documents,
        tokens={key: w.num_tokens for key, w in zip(keys, writers)} or {key: 0 for key in keys},
        skipped=dict(sorted(counts.items())),
    )
    for writer in writers:
        writer.finalize()
    if folder != task.root:
        for writer in writers:
            publish_prefix(writer.prefix, f"{task.root}/{os.path.basename(writer.prefix)}")
    summary: PartSummary
    if task.whole:
        summary = FileSummary(**vars(counted), parts=(task.stem,) if writers else ())
        write_marker(task.root, f"{task.stem}.done", summary)
    else:
        summary = RangeSummary(**vars(counted), span=task.span, lines=lines)
        write_marker(task.root, f"{task.stem}.range", summary)
    result.summary = summary
    result.seconds = time.perf_counter() - start
    return result


def _writers(task: PartTask, folder: str) -> list[TokenFileWriter]:
    dtype = np.dtype(task.encode.dtype)
    root = Path(folder)
    return [TokenFileWriter(str(root / f"{task.stem}_{key}"), dtype) for key in task.encode.keys]


def _abort(writers: list[TokenFileWriter]) -> None:
    for writer in writers:
        writer.abort()


def write_documents(
    writer: TokenFileWriter, tokens: np.ndarray, seq_lengths: np.ndarray, per_doc: np.ndarray
) -> None:
    """Append documents given as (tokens, sequence lengths, sequences per document)."""
    if per_doc.size and bool((per_doc == 1).all()):
        writer.add_documents(tokens, seq_lengths)
        return
    seq_bounds = np.concatenate(([0], np.cumsum(per_doc, dtype=np.int64)))
    tok_bounds = np.concatenate(([0], np.cumsum(seq_lengths, dtype=np.int64)))
    doc = 0
    for irregular in [*np.flatnonzero(per_doc != 1).tolist(), per_doc.size]:
        if irregular > doc:  # a run of single-sequence documents
            s0, s1 = seq_bounds[doc], seq_bounds[irregular]
            writer.add_documents(tokens[tok_bounds[s0] : tok_bounds[s1]], seq_lengths[s0:s1])
        if irregular < per_doc.size:
            s0, s1 = seq_bounds[irregular], seq_bounds[irregular + 1]
            writer.add_document(tokens[tok_bounds[s0] : tok_bounds[s1]], seq_lengths[s0:s1])
        doc = irregular + 1
