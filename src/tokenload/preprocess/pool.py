"""The local executor of preprocess (``LocalExecutor``): input files encoded by a thread or
process pool here.

Each input file becomes a ``_FileJob`` that owns its part writers; its chunks are submitted to
the pool (threads when the tokenizer's encoder releases the GIL, as every Rust encoder does;
processes otherwise), at most ``2 x workers + 2`` in flight, and the results are taken back
strictly in submission order, so memory stays bounded and the parts' bytes do not depend on the
worker count. Kept apart from ``pipeline`` (which decides what runs and cleans up after it) so
that the two executors, this one and Ray's (``cluster``), sit side by side under it.
"""

from __future__ import annotations

import logging
import os
from collections import Counter, deque
from collections.abc import Sequence
from concurrent import futures
from dataclasses import replace

import numpy as np

from ..errors import RecordError
from ..format import TokenFileWriter
from .config import PreprocessConfig, TokenizerSpec
from .encode import Encoded, EncodeTask, encode_chunk, init_worker_process, register_tokenizer
from .executor import Executor
from .inputs import InputFile
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
    """One input file being encoded: its part writers and what it has counted so far."""

    def __init__(
        self,
        index: int,
        file: InputFile,
        config: PreprocessConfig,
        work: WorkFolder,
        dtype: np.dtype,
    ) -> None:
        self.index, self.file, self.work, self.config, self.dtype = index, file, work, config, dtype
        self._open_writers()
        self.documents = 0
        self.skipped: Counter = Counter()
        self.damaged: str | None = None

    def _open_writers(self) -> None:
        self.writers = [
            TokenFileWriter(self.work.part(self.index, k), self.dtype)
            for k in self.config.json_keys
        ]

    def add(self, result: Encoded) -> None:
        if self.damaged:
            return
        for writer, (tokens, seq_lengths, per_doc) in zip(self.writers, result.outputs):
            write_documents(writer, tokens, seq_lengths, per_doc)
        self.documents += result.documents
        self.skipped.update(result.skipped)
        for example in result.examples:
            skip_log.warning("skipped %s", example)

    def commit(self) -> FileSummary:
        if self.damaged:
            if self.config.on_bad_record == "error":
                raise RecordError(
                    f"cannot read the file to its end: {self.damaged}",
                    path=self.file.path,
                    hint="replace the damaged file, or pass `on_bad_record='skip'` to skip it",
                )
            skip_log.warning("skipped %s: unreadable: %s", self.file.path, self.damaged)
            self.abort()
            self._open_writers()
            self.documents, self.skipped = 0, Counter({"unreadable_file": 1})
        tokens = {}
        for key, writer in zip(self.config.json_keys, self.writers):
            tokens[key] = writer.num_tokens
            writer.finalize()
        self.writers = []  # a finished writer still holds its index arrays
        summary = FileSummary(
            path=self.file.path,
            stamp=self.file.stamp,
            documents=self.documents,
            tokens=tokens,
            skipped=dict(sorted(self.skipped.items())),
        )
        self.work.commit(self.index, summary)
        return summary

    def abort(self) -> None:
        for writer in self.writers:
            writer.abort()


class LocalExecutor(Executor):
    """Threads or processes on this machine (``config.executor`` auto, threads or processes)."""

    def __init__(self, config: PreprocessConfig, tok: TextTokenizer) -> None:
        self.config, self.tok = config, tok

    def run(
        self, work: WorkFolder, todo: Sequence[tuple[int, InputFile]], bar: Progress
    ) -> dict[int, FileSummary]:
        summaries: dict[int, FileSummary] = {}
        config, tok = self.config, self.tok
        depth = 2 * config.workers + 2
        sizer = ChunkSize(config.chunk_bytes)
        task = encode_task(config, tok)
        pending: deque = deque()
        jobs: list[_FileJob] = []
        pool = _pool(config, tok)
        try:
            for index, file in todo:
                job = _FileJob(index, file, config, work, tok.dtype)
                jobs.append(job)
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
            for job in jobs:
                job.abort()
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
    pending: deque, summaries: dict[int, FileSummary], bar: Progress, sizer: ChunkSize
) -> None:
    job, future = pending.popleft()
    if future is None:
        summaries[job.index] = job.commit()
        bar.file_done()
        return
    while not futures.wait([future], timeout=_TICK_SECONDS).done:
        bar.tick()
    result = future.result()
    sizer.observe(result.input_bytes, result.seconds)
    job.add(result)
    bar.update(result)
