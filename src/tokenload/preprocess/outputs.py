"""The final outputs of preprocess: one token file per key, with the run's totals in its sidecar.

Two ways to make them, by executor:

* **Written once** (the local executor, ``pool``; also for an ``s3://`` output, which it stages
  in a local folder): ``OutputStreams`` holds one staged ``TokenFileWriter`` per key whose
  ``.bin`` is ``output_{key}.bin.partial`` in the work folder. The executor appends each input
  file's documents to it as its results come back in input order, and commits the file
  (``commit``: flush and fsync the outputs, write the file's index ``{i:06d}_{key}.idx``, then
  its marker with the file's token offsets); ``publish`` moves the outputs to their real names
  with the usual atomic publish (``.idx`` last, see docs/FORMAT.md "Writing"). So every token is
  written once, and a resume (``resume``) keeps the committed files in place: it cuts off what a
  killed run wrote after the last of them and reloads their indexes (the kept tokens are read
  once, to hash them again for the sidecar). Files finished as parts (an earlier Ray run) are
  copied in at their place in input order (``copy_in``); a kept file that comes after a file
  being redone (its input changed, or it was encoded with records skipped and the job is now
  strict) cannot stay where it is, so ``resume`` first copies its tokens out into a part of its
  own and then treats it as one.
* **From parts** (the Ray executor, ``cluster``: its tasks run anywhere, each writing its own
  part; local or under an object-storage work prefix, read one part at a time):
  ``_write_outputs`` concatenates the finished parts in input order, or, for a single part on
  the same filesystem, hard-links its ``.bin`` (``TokenFileWriter.adopt``).

Apart from ``pipeline`` because it is the one step both executors share, and the step a full disk
at the end of a run fails in (the committed files stay, and a rerun only does this).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TokenloadError
from ..format import TokenFileWriter
from ..format.atomic import write_atomic
from ..format.idx import index_arrays, parse_header
from ..format.writer import WriterMark
from ..storage.os_errors import read_error
from .config import PreprocessConfig
from .inputs import InputFile
from .summaries import FileSummary, Totals
from .tokenizer import TextTokenizer
from .workdir import WorkDir, WorkFolder

log = logging.getLogger(__name__)

_COPY_CHUNK = 64 << 20

Marks = list[WriterMark]
"""Where each key's output stood when an input file began (``OutputStreams.mark``)."""


class OutputStreams:
    """The outputs of a run written once, one staged writer per key (see the module docstring).

    Used from one thread (the one that takes the results back in input order)."""

    def __init__(self, config: PreprocessConfig, tok: TextTokenizer, work: WorkFolder) -> None:
        if not isinstance(work, WorkDir):
            raise TypeError("outputs are written once only beside a local work folder")
        self.config, self.work, self.dtype = config, work, tok.dtype
        self.keys = config.json_keys
        self.writers: list[TokenFileWriter] = []
        self.copies: dict[int, FileSummary] = {}
        """Files finished as parts, to copy in at their place (input number -> marker)."""

    # -- resuming ------------------------------------------------------------------------------
    def resume(self, files: Sequence[InputFile]) -> dict[int, FileSummary]:
        """Open the outputs, keeping what an interrupted run committed; returns the markers of
        the files reused (kept in place, or in ``copies``) by input number. The other files'
        markers are removed: whatever they vouched for is about to be overwritten."""
        strict = self.config.on_bad_record == "error"
        markers: dict[int, FileSummary] = {}
        for i, file in enumerate(files):
            marker = self.work.marker(i, file)
            if marker is not None and not (strict and marker.bad_records):
                markers[i] = marker
        held = {key: _size(self.work.output(key)) // self.dtype.itemsize for key in self.keys}
        at = dict.fromkeys(self.keys, 0)
        kept: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {key: [] for key in self.keys}
        reused: dict[int, FileSummary] = {}
        for i in range(len(files)):  # the leading files whose tokens are in place
            indexes = self._indexes(i, markers.get(i), at, held)
            if indexes is None:
                break
            for key in self.keys:
                kept[key].append(indexes[key])
                at[key] += markers[i].tokens[key]
            reused[i] = markers[i]
        for j in sorted(set(markers) - set(reused)):
            marker = markers[j]
            if marker.offsets is None:
                if self.work.finished(j, files[j], self.keys) is not None:
                    reused[j] = self.copies[j] = marker
            elif self._indexes(j, marker, None, held) is not None:
                reused[j] = self.copies[j] = self._copy_out(j, marker)
        self.work.uncommit([j for j in range(len(files)) if j not in reused])
        self._open(kept)
        return reused

    def _indexes(
        self,
        index: int,
        marker: FileSummary | None,
        at: dict[str, int] | None,
        held: dict[str, int],
    ) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
        """The indexes of a file whose tokens are in the outputs, starting at ``at`` (None: at
        any place), within what they hold and agreeing with its marker; else None."""
        if marker is None or marker.offsets is None:
            return None
        indexes = {}
        for key in self.keys:
            start, tokens = marker.offsets.get(key), marker.tokens.get(key)
            if start is None or tokens is None or (at is not None and start != at[key]):
                return None
            if start + tokens > held[key]:
                return None
            try:
                lengths, documents = read_index(self.work.index(index, key))
            except TokenloadError as exc:
                log.info("input %d: its index cannot be used (%s); redoing it", index, exc)
                return None
            if int(lengths.sum(dtype=np.int64)) != tokens or documents.size - 1 != marker.documents:
                return None
            indexes[key] = (lengths, documents)
        return indexes

    def _copy_out(self, index: int, marker: FileSummary) -> FileSummary:
        """Copy a committed file's tokens out of the outputs into a part of its own (``.bin``
        beside its ``.idx``), then mark it as that part; returns the new marker."""
        itemsize = self.dtype.itemsize
        assert marker.offsets is not None
        for key in self.keys:
            part = self.work.root / f"{index:06d}_{key}"
            Path(f"{part}.json").unlink(missing_ok=True)  # a sidecar of an older part of it
            start, size = marker.offsets[key] * itemsize, marker.tokens[key] * itemsize
            _copy_range(self.work.output(key), start, size, Path(f"{part}.bin"))
        moved = replace(marker, offsets=None, parts=None)
        self.work.commit(index, moved)
        return moved

    def _open(self, kept: dict[str, list[tuple[np.ndarray, np.ndarray]]]) -> None:
        for key in self.keys:
            self.writers.append(
                TokenFileWriter(
                    self.config.output_for(key),
                    self.dtype,
                    tokenizer=self.work.job["tokenizer"],
                    staged=self.work.output(key),
                    kept=_joined(kept[key]) if kept[key] else None,
                )
            )

    # -- writing -------------------------------------------------------------------------------
    def mark(self) -> Marks:
        """Where each output stands now: taken when an input file begins."""
        return [writer.mark() for writer in self.writers]

    def rollback(self, marks: Marks) -> None:
        """Forget what was written since ``marks`` (a file found damaged, skipped)."""
        for writer, mark in zip(self.writers, marks):
            writer.rollback(mark)

    def tokens_since(self, marks: Marks) -> dict[str, int]:
        return {
            key: writer.num_tokens - mark.tokens
            for key, writer, mark in zip(self.keys, self.writers, marks)
        }

    def copy_in(self, index: int, marker: FileSummary) -> None:
        """Append the parts of a file finished as parts, for every key."""
        for writer, key in zip(self.writers, self.keys):
            for part in self.work.parts(index, marker, key):
                writer.append(part)

    def commit(self, index: int, summary: FileSummary, marks: Marks) -> FileSummary:
        """Input file ``index`` is written from ``marks`` on: make its tokens durable, write its
        index, then its marker (the commit); returns the marker."""
        for writer in self.writers:
            writer.sync()
        for key, writer, mark in zip(self.keys, self.writers, marks):
            self.work.write(self.work.index(index, key).name, writer.index_since(mark))
        done = replace(
            summary,
            parts=None,
            offsets={key: mark.tokens for key, mark in zip(self.keys, marks)},
        )
        self.work.commit(index, done)
        return done

    # -- finishing -----------------------------------------------------------------------------
    def publish(self, metadata: dict[str, Any]) -> None:
        """Publish every output under its real name."""
        for key, writer in zip(self.keys, self.writers):
            writer.metadata = {**metadata, "json_key": key}
            writer.finalize()

    def close(self) -> None:
        """After a failure: close the outputs, keeping them for a resume."""
        for writer in self.writers:
            writer.abort()


def _write_outputs(
    config: PreprocessConfig,
    tok: TextTokenizer,
    work: WorkFolder,
    summaries: Sequence[FileSummary],
    totals: Totals,
    streams: OutputStreams | None = None,
) -> None:
    """Publish the outputs written once (``streams``), or make them from the parts."""
    metadata = {
        "producer": "tokenload preprocess",
        "inputs": work.job["inputs"],
        "json_keys": list(config.json_keys),
        "append_eod": config.append_eod,
        "on_bad_record": config.on_bad_record,
        "shard": {"index": config.shard_index, "count": config.num_shards},
        "skipped": totals.skipped,
    }
    if streams is not None:
        streams.publish(metadata)
        return
    for key in config.json_keys:
        with TokenFileWriter(
            config.output_for(key),
            tok.dtype,
            tokenizer=work.job["tokenizer"],
            metadata={**metadata, "json_key": key},
        ) as writer:
            parts = [
                part
                for index, summary in enumerate(summaries)
                for part in work.parts(index, summary, key)
            ]
            for part in parts:
                with work.readable(part) as local:
                    if len(parts) > 1 or not writer.adopt(
                        local
                    ):  # one part: its .bin linked, not copied
                        writer.append(local)
            writer.finalize()


def read_index(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """(sequence lengths, document indices) of a plain ``.idx`` file, checked against its header;
    FormatError when it is not one, StorageError when it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise read_error(exc, path, "the index") from None
    header = parse_header(data, len(data), os.fspath(path), multimodal=False)
    lengths, _, documents, _ = index_arrays(data, header)
    return lengths.copy(), documents.copy()


def _joined(indexes: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The index of files one after another: their lengths, their document indices shifted."""
    lengths = np.concatenate([lens for lens, _ in indexes]).astype(np.int32, copy=False)
    documents, base = [np.zeros(1, np.int64)], 0
    for lens, docs in indexes:
        documents.append(docs[1:] + base)
        base += lens.size
    return lengths, np.concatenate(documents)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise read_error(exc, path, "the output being written") from None


def _copy_range(source: Path, start: int, size: int, target: Path) -> None:
    """Write bytes [start, start + size) of ``source`` to ``target`` atomically."""

    def write(f: Any) -> None:
        with open(source, "rb") as src:
            src.seek(start)
            left = size
            while left:
                chunk = src.read(min(_COPY_CHUNK, left))
                if not chunk:
                    raise OSError(f"{source} ended early")
                f.write(chunk)
                left -= len(chunk)

    try:
        write_atomic(target, write)
    except OSError as exc:
        raise read_error(exc, source, "the output being written") from None
