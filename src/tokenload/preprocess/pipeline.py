"""``preprocess``: input files -> Megatron token files, in parallel, deterministic and resumable.

This module runs the job: it checks the outputs can be written, loads the tokenizer, lists and
shards the inputs, opens the work folder, hands the files not finished by an earlier run to an
executor, publishes the final outputs and cleans up after a failure. The executors:

* ``pool`` (threads or processes on this machine; any local or ``s3://`` output, the latter
  staged in a local folder): chunks of about ``chunk_bytes`` of whole lines, results taken back
  strictly in submission order, at most ``2 x workers + 2`` in flight, so memory stays bounded
  and the bytes do not depend on the worker count. Each token is written once: straight into
  the outputs, which sit in the work folder under names no reader takes for a token file until
  they are published (``outputs.OutputStreams``); per finished file the work folder keeps only
  its index and marker, so a resume cuts the outputs back to the last committed file and goes
  on from there.
* ``cluster`` (Ray): each task writes its own part files in the work folder (or under a work
  prefix in object storage), and the final outputs are the parts concatenated in input order
  (``outputs._write_outputs``; a single part is hard-linked). Trade-off: every token is written
  twice there (part, then output), which buys tasks that run anywhere and restart without
  redoing finished parts.

Either way a file is marked done in the work folder when it is finished (see ``workdir``), and
the outputs appear only when complete: the ``.idx`` is published last (docs/FORMAT.md).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import ConfigError, StorageError, TokenloadError
from ..format.atomic import remove_temporaries, require_folder
from ..storage.remote import is_url
from ..storage.upload import check_writable, make_staging_folder, publish_prefix, staging_root
from .config import PreprocessConfig
from .executor import Executor
from .inputs import InputFile, expand_inputs, shard_files
from .load import load_tokenizer
from .outputs import OutputStreams, _write_outputs
from .pool import LocalExecutor, encode_task
from .progress import Progress
from .summaries import FileSummary, Totals
from .tokenizer import TextTokenizer
from .workdir import WorkFolder, open_workdir

log = logging.getLogger(__name__)
#: Skipped records, one short line each (the CLI prints this logger without the logging prefix).
skip_log = logging.getLogger(__name__ + ".skipped")


@dataclass(frozen=True)
class PreprocessResult:
    """What a preprocess run wrote and measured."""

    outputs: dict[str, str]
    """Key -> token file prefix written."""
    files: int
    """Input files of this shard."""
    files_resumed: int
    """Files whose finished work (tokens in the outputs, or parts) was reused from an interrupted
    run."""
    documents: int
    """Documents written per key (every key has the same count)."""
    tokens: dict[str, int]
    """Tokens written per key."""
    skipped: dict[str, int]
    """Skipped records (and blank lines, unreadable files) by reason."""
    input_bytes: int
    """Input text bytes encoded by this run (resumed files excluded)."""
    encoded_tokens: int
    """Tokens encoded by this run (resumed files excluded), all keys."""
    seconds: float
    """Wall time of the run."""
    engine: str
    """The encoder used: gigatoken, tokenizers, tiktoken, sentencepiece or numpy (byte)."""

    @property
    def tokens_per_second(self) -> float:
        return self.encoded_tokens / self.seconds if self.seconds > 0 else 0.0


def preprocess(config: PreprocessConfig, *, progress: bool | None = None) -> PreprocessResult:
    """Run the job ``config`` describes; ``progress``: bar on, off, or None (on a terminal)."""
    start = time.perf_counter()
    if config.executor == "ray":
        from .cluster import require_ray

        require_ray()
    if is_url(config.output_prefix):
        check_writable(config.shard_prefix)  # a wrong bucket or key fails before any work
    local = _staged(config)
    try:
        _check_output_folder(local)
        assert config.tokenizer is not None  # PreprocessConfig requires one
        tok = load_tokenizer(config.tokenizer)
        _check_eod(config, tok)
        files = shard_files(
            expand_inputs(config.inputs, config.input_format, config.range_bytes),
            config.num_shards,
            config.shard_index,
        )
        _check_keys_for_text(config, files)
        _check_objects_for_ray(config, files)
        job = _job_description(config, tok, files)
        shared = (
            local is not config and config.executor == "ray"
        )  # nodes share no folder: a work prefix
        work = open_workdir(
            config.shard_prefix if shared else local.shard_prefix, job, remote=shared
        )
    except BaseException:
        _remove_empty_staging(local)
        raise
    try:
        work.open(config.resume)
    except BaseException as exc:
        work.release()  # a refused or failed open holds nothing
        if isinstance(exc, OSError):
            raise _write_error(exc, local, None) from None
        raise
    output = None
    try:
        if config.executor != "ray":  # written once, beside the local work folder
            output = OutputStreams(local, tok, work)
        summaries, bar = _run(local, tok, work, files, progress, output)
        totals = Totals.of(summaries.values(), config.json_keys)
        _write_outputs(local, tok, work, [summaries[i] for i in range(len(files))], totals, output)
        if local is not config:
            for key in config.json_keys:
                publish_prefix(local.output_for(key), config.output_for(key))
        work.remove()
        if local is not config:
            shutil.rmtree(os.path.dirname(local.shard_prefix), ignore_errors=True)
    except BaseException as exc:
        if output is not None:
            output.close()
        _clean_after_failure(local, work)
        work.release()
        if isinstance(exc, OSError) and not isinstance(exc, TokenloadError):  # writing failed
            raise _write_error(exc, local, work) from None
        raise
    return PreprocessResult(
        outputs=config.outputs,
        files=len(files),
        files_resumed=bar.files_resumed,
        documents=totals.documents,
        tokens=totals.tokens,
        skipped=totals.skipped,
        input_bytes=bar.input_bytes,
        encoded_tokens=bar.tokens,
        seconds=time.perf_counter() - start,
        engine=tok.engine,
    )


def _run(
    config: PreprocessConfig,
    tok: TextTokenizer,
    work: WorkFolder,
    files: list[InputFile],
    progress: bool | None,
    output: OutputStreams | None,
) -> tuple[dict[int, FileSummary], Progress]:
    """Encode every input file not finished by an earlier run; returns the summaries by index.
    A file an earlier run finished with bad records skipped is redone in error mode. With
    ``output`` (written once) it is opened here, keeping what an earlier run committed."""
    summaries: dict[int, FileSummary] = {}
    if output is not None:
        summaries = output.resume(files)
    else:
        for index, file in enumerate(files):
            done = work.finished(index, file, config.json_keys)
            if done is not None and not (config.on_bad_record == "error" and done.bad_records):
                summaries[index] = done
    todo = [(i, f) for i, f in enumerate(files) if i not in summaries]
    if summaries:
        log.info("resuming: %d of %d input files already done", len(summaries), len(files))
    bar = Progress(todo=[f for _, f in todo], enabled=progress, resumed=len(summaries))
    try:
        if todo or (output is not None and output.copies):
            summaries.update(executor_for(config, tok, output).run(work, todo, bar))
    finally:
        bar.close()
    return summaries, bar


def executor_for(
    config: PreprocessConfig, tok: TextTokenizer, output: OutputStreams | None = None
) -> Executor:
    """The executor ``config.executor`` names (Ray's imported only when asked for); the local
    one writes into ``output``."""
    if config.executor == "ray":
        from .cluster import RayExecutor

        return RayExecutor(config, encode_task(config, tok))
    return LocalExecutor(config, tok, output)


def _staged(config: PreprocessConfig) -> PreprocessConfig:
    """The job as written locally: for outputs bound for object storage, the same job with its
    outputs in the URL's staging folder (published once the run has succeeded; a rerun finds
    the same folder, so its resumable work carries over), else ``config`` itself."""
    if not is_url(config.output_prefix):
        return config
    folder = make_staging_folder(config.shard_prefix)
    return replace(
        config, output_prefix=os.path.join(folder, os.path.basename(config.output_prefix))
    )


def _clean_after_failure(config: PreprocessConfig, work: WorkFolder) -> None:
    """Remove what a failed run leaves besides what a resume can use (finished files: parts or
    the outputs being written once): temporaries, and the work folder itself when it holds no
    finished file (and then an emptied staging folder)."""
    try:
        for key in config.json_keys:
            remove_temporaries(config.output_for(key))
        if work.exists():
            if work.committed():
                work.remove_temporaries()
            else:
                work.remove()
        _remove_empty_staging(config)
    except OSError as exc:
        log.warning("could not clean up after the failure: %s", exc)


def _remove_empty_staging(config: PreprocessConfig) -> None:
    """The staging folder of an object-storage output, when a failure left nothing in it."""
    if _is_staging(config):
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(config.shard_prefix))  # only when empty


def _is_staging(config: PreprocessConfig) -> bool:
    return os.path.dirname(os.path.abspath(config.output_prefix)).startswith(
        os.path.abspath(staging_root())
    )


def _write_error(exc: OSError, config: PreprocessConfig, work: WorkFolder | None) -> StorageError:
    """The StorageError for an OSError met while writing the work folder or the outputs (for an
    object-storage output: its local staging folder, which TOKENLOAD_STAGING_DIR moves)."""
    folder = os.path.dirname(os.path.abspath(config.output_prefix))
    resume = (
        f"; finished input files stay in {work.location!r} and the same command resumes"
        if work is not None and _exists(work)
        else ""
    )
    other, writable = "choose another `output_prefix=`", "choose a writable `output_prefix=`"
    if _is_staging(config):
        folder = os.path.dirname(folder)
        other = (
            "set TOKENLOAD_STAGING_DIR to a local folder with room for the output"
            " (staged there before the upload)"
        )
        writable = "set TOKENLOAD_STAGING_DIR to a writable local folder"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = f"free space on the filesystem of {folder!r} or {other}{resume}"
    elif exc.errno == errno.EROFS:
        hint = f"{folder!r} is on a read-only filesystem: {writable}"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        hint = f"this user may not write in {folder!r}: fix its permissions or {other}"
    else:
        hint = f"check the disk that holds {folder!r}{resume}"
    return StorageError(
        f"cannot write the output ({exc.strerror or exc})",
        path=exc.filename or config.shard_prefix,
        hint=hint,
    )


def _exists(work: WorkFolder) -> bool:
    """Whether the work folder is there (False when that cannot be told now)."""
    try:
        return work.exists()
    except TokenloadError:
        return False


def _check_output_folder(config: PreprocessConfig) -> None:
    require_folder(config.output_prefix)
    folder = os.path.dirname(os.path.abspath(config.output_prefix))
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        raise _write_error(OSError(errno.EROFS, os.strerror(errno.EROFS), folder), config, None)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _write_error(OSError(errno.EACCES, os.strerror(errno.EACCES), folder), config, None)
    for key in config.json_keys:  # temporaries of a run killed while writing the outputs
        remove_temporaries(config.output_for(key))


def _check_eod(config: PreprocessConfig, tok: TextTokenizer) -> None:
    if not config.append_eod:
        return
    if tok.eod_id is None:
        raise ConfigError(
            f"`append_eod=True` needs an EOD token, and this {tok.kind} tokenizer has none",
            hint="name one with `eod_token=TEXT` or `eod_id=N`",
        )
    if tok.eod_id > np.iinfo(tok.dtype).max:
        raise ConfigError(
            f"EOD id {tok.eod_id} does not fit the output dtype {tok.dtype}",
            hint="pass an `eod_id=` inside the tokenizer's vocabulary",
        )


def _check_keys_for_text(config: PreprocessConfig, files: list[InputFile]) -> None:
    if len(config.json_keys) > 1 and any(f.format in ("text", "lines") for f in files):
        raise ConfigError(
            "plain text inputs have a single text field, but several `json_keys=` were given",
            hint="give one key (it names the output) or pass only JSONL/parquet inputs",
        )


def _check_objects_for_ray(config: PreprocessConfig, files: list[InputFile]) -> None:
    if config.executor == "ray" and any(f.source is not None for f in files):
        raise ConfigError(
            "a datasets.Dataset/IterableDataset object lives in this process, and Ray tasks read"
            " their inputs themselves",
            hint="save it with ds.save_to_disk(DIR) and pass DIR as an input, or use"
            " executor='processes'",
        )


def _job_description(
    config: PreprocessConfig, tok: TextTokenizer, files: list[InputFile]
) -> dict[str, Any]:
    """Everything that decides the parts' bytes (never the worker count or executor; the
    bad-record policy only decides whether a part may be reused, see ``_run``)."""
    return {
        "version": 1,
        "tokenizer": tok.identity(),
        "dtype": tok.dtype.name,
        "keys": list(config.json_keys),
        "append_eod": config.append_eod,
        "input_format": config.input_format,
        "shard": [config.shard_index, config.num_shards],
        "inputs": [f.path for f in files],
    }
