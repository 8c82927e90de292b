"""The local executor of preprocess (``LocalExecutor``): input files encoded by a thread or
process pool here, their tokens written once, straight into the outputs.

Each input file becomes a ``_FileJob``; its chunks are submitted to the pool (threads when the
tokenizer's encoder releases the GIL, as every Rust encoder does; processes otherwise), at most
``2 x workers + 2`` in flight, and the results are taken back strictly in submission order, so
memory stays bounded and the bytes do not depend on the worker count. Taken back in input order,
each result is appended to the outputs being written (``outputs.OutputStreams``: one ``.bin``
per key, in the work folder until the end), and when a file's last result is in, the file is
committed there (its index and marker; see ``workdir``). A file an earlier run finished as parts
(Ray's) is copied in at its place. Kept apart from ``pipeline`` (which decides what runs and
cleans up after it) so that the two executors, this one and Ray's (``cluster``), sit side by
side under it.
"""

from __future__ import annotations

import logging
import os
from collections import Counter, deque
from collections.abc import Sequence
from concurrent import futures
from dataclasses import replace
from typing import Any

from ..errors import RecordError
from .config import PreprocessConfig, TokenizerSpec
from .encode import Encoded, EncodeTask, encode_chunk, init_worker_process, register_tokenizer
from .executor import Executor
from .inputs import InputFile
from .outputs import Marks, OutputStreams
from .parts import write_documents
from .progress import Progress
from .sources import ChunkSize, UnreadableFile, read_chunks
from .summaries import FileSummary
from .tokenizer import TextTokenizer
from .workdir import WorkFolder

#: Skipped records: the logger the CLI prints (named for ``pipeline``, where it is defined).
skip_log = logging.getLogger(__name__.rsplit(".", 1)[0] + ".pipeline.skipped")
_TICK_SECONDS = 0.5


class _FileJob:
    """One input file being written to the outputs (or, with ``parts``, copied in from the
    parts an earlier run made of it) and what it has counted so far."""

    def __init__(
        self,
        index: int,
        file: InputFile | None,
        config: PreprocessConfig,
        output: OutputStreams,
        parts: FileSummary | None = None,
    ) -> None:
        self.index, self.file, self.config, self.output = index, file, config, output
        self.parts = parts
        self.marks: Marks | None = None
        self.documents = 0
        self.skipped: Counter[str] = Counter()
        self.damaged: str | None = None

    def _begun(self) -> Marks:
        """Where the outputs stood when this file began: its first result or its commit, taken
        back after every earlier file's commit."""
        if self.marks is None:
            self.marks = self.output.mark()
        return self.marks

    def add(self, result: Encoded) -> None:
        if self.damaged:
            return
        self._begun()
        for writer, (tokens, seq_lengths, per_doc) in zip(self.output.writers, result.outputs):
            write_documents(writer, tokens, seq_lengths, per_doc)
        self.documents += result.documents
        self.skipped.update(result.skipped)
        for example in result.examples:
            skip_log.warning("skipped %s", example)

    def commit(self) -> FileSummary:
        marks = self._begun()
        if self.parts is not None:
            self.output.copy_in(self.index, self.parts)
            return self.output.commit(self.index, self.parts, marks)
        assert self.file is not None
        if self.damaged:
            if self.config.on_bad_record == "error":
                raise RecordError(
                    f"cannot read the file to its end: {self.damaged}",
                    path=self.file.path,
                    hint="replace the damaged file, or pass `on_bad_record='skip'` to skip it",
                )
            skip_log.warning("skipped %s: unreadable: %s", self.file.path, self.damaged)
            self.output.rollback(marks)
            self.documents, self.skipped = 0, Counter({"unreadable_file": 1})
        summary = FileSummary(
            path=self.file.path,
            stamp=self.file.stamp,
            documents=self.documents,
            tokens=self.output.tokens_since(marks),
            skipped=dict(sorted(self.skipped.items())),
        )
        return self.output.commit(self.index, summary, marks)


class LocalExecutor(Executor):
    """Threads or processes on this machine (``config.executor`` auto, threads or processes),
    writing into ``output`` (opened by ``OutputStreams.resume``, which also lists the files to
    copy in from parts)."""

    def __init__(
        self, config: PreprocessConfig, tok: TextTokenizer, output: OutputStreams | None = None
    ) -> None:
        self.config, self.tok, self.output = config, tok, output

    def run(
        self, work: WorkFolder, todo: Sequence[tuple[int, InputFile]], bar: Progress
    ) -> dict[int, FileSummary]:
        output = self.output
        if output is None:
            raise TypeError("LocalExecutor.run needs the outputs it writes (output=)")
        summaries: dict[int, FileSummary] = {}
        config, tok = self.config, self.tok
        depth = 2 * config.workers + 2
        sizer = ChunkSize(config.chunk_bytes)
        task = encode_task(config, tok)
        pending: deque[tuple[Any, Any]] = deque()
        order: list[tuple[int, InputFile | None]] = sorted(
            [*todo, *((i, None) for i in output.copies)], key=lambda item: item[0]
        )
        pool = _pool(config, tok)
        try:
            for index, file in order:
                if file is None:  # finished as parts: copied in at its place
                    pending.append(
                        (_FileJob(index, None, config, output, output.copies[index]), None)
                    )
                    continue
                job = _FileJob(index, file, config, output)
                try:
                    for chunk in read_chunks(file, sizer, config.json_keys):
                        pending.append((job, pool.submit(encode_chunk, task, chunk)))
                        while len(pending) > depth:
                            _drain_one(pending, summaries, bar, sizer)
                except UnreadableFile as exc:
                    job.damaged = str(exc)
                pending.append((job, None))
                if job.damaged and config.on_bad_record == "error":
                    break  # its error is raised once every earlier result is written (in order)
            while pending:
                _drain_one(pending, summaries, bar, sizer)
        except BaseException:
            for _, future in pending:
                if future is not None:
                    future.cancel()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return summaries


def _pool(config: PreprocessConfig, tok: TextTokenizer) -> futures.Executor:
    kind = config.executor
    if kind == "auto":
        kind = "threads" if tok.releases_gil else "processes"
    if kind == "threads":
        register_tokenizer(_resolved_spec(config, tok), tok)
        return futures.ThreadPoolExecutor(config.workers, thread_name_prefix="tokenload-encode")
    import multiprocessing

    return futures.ProcessPoolExecutor(
        config.workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=init_worker_process,
        initargs=(_resolved_spec(config, tok), os.getpid()),
    )


def _resolved_spec(config: PreprocessConfig, tok: TextTokenizer) -> TokenizerSpec:
    """The spec with the engine the main process settled on, so every worker uses the same one."""
    spec = config.tokenizer
    assert spec is not None  # PreprocessConfig requires one
    if spec.kind == "byte":
        return spec
    return replace(spec, engine="gigatoken" if tok.engine == "gigatoken" else "native")


def encode_task(config: PreprocessConfig, tok: TextTokenizer) -> EncodeTask:
    """What every chunk (or Ray task) of the job encodes with: the resolved tokenizer and rules."""
    return EncodeTask(
        tokenizer=_resolved_spec(config, tok),
        keys=config.json_keys,
        append_eod=config.append_eod,
        strict=config.on_bad_record == "error",
        dtype=tok.dtype.name,
    )


def _drain_one(
    pending: deque[tuple[Any, Any]],
    summaries: dict[int, FileSummary],
    bar: Progress,
    sizer: ChunkSize,
) -> None:
    job, future = pending.popleft()
    if future is None:
        summaries[job.index] = job.commit()
        if job.parts is None:  # a file copied in was counted as resumed
            bar.file_done()
        return
    while not futures.wait([future], timeout=_TICK_SECONDS).done:
        bar.tick()
    result = future.result()
    sizer.observe(result.input_bytes, result.seconds)
    job.add(result)
    bar.update(result)
