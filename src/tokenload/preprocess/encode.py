"""The work item of preprocess: parse one chunk, encode it in one batch, lay out its documents.

Runs in a worker thread or process. Each key's texts of the chunk go to the tokenizer as one
batch; the document structure is then built with NumPy, not per document in Python:
zero-token sequences are dropped, and with ``append_eod`` the EOD id is added to the last
sequence of every non-empty document (Megatron-LM's preprocess_data.py rule; an empty document
stays a document with zero sequences and gets no EOD).

The result is independent of how the input was cut into chunks, which is what makes the output
the same for any number of workers.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import TokenizerSpec
from .load import load_tokenizer
from .records import BadRecord, parse_chunk
from .sources import Chunk
from .tokenizer import TextTokenizer, id_beyond_dtype

_TOKENIZERS: dict[TokenizerSpec, TextTokenizer] = {}
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class EncodeTask:
    """Everything a worker needs besides the chunk; small and picklable."""

    tokenizer: TokenizerSpec
    keys: tuple[str, ...]
    append_eod: bool
    strict: bool
    dtype: str


@dataclass
class Encoded:
    """One chunk's documents per key: tokens (output dtype), sequence lengths (int32) and the
    number of sequences of each document (int32; 0 for an empty document)."""

    outputs: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    documents: int
    input_bytes: int
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[BadRecord] = field(default_factory=list)
    seconds: float = 0.0
    """Worker time spent on the chunk (sizes the next chunks, see ``sources.ChunkSize``)."""


def tokenizer_for(spec: TokenizerSpec) -> TextTokenizer:
    """The process's tokenizer for ``spec``, loaded once."""
    tok = _TOKENIZERS.get(spec)
    if tok is None:
        tok = _TOKENIZERS[spec] = load_tokenizer(spec)
    return tok


def register_tokenizer(spec: TokenizerSpec, tok: TextTokenizer) -> None:
    """Share an already loaded tokenizer with worker threads of this process."""
    _TOKENIZERS[spec] = tok


def init_worker_process(spec: TokenizerSpec, parent: int) -> None:
    """Process-pool initializer: exit with the parent process ``parent``, one encoder thread per
    process, tokenizer loaded up front."""
    exit_with_parent(parent)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tokenizer_for(spec)


def exit_with_parent(parent: int, poll_seconds: float = 1.0) -> None:
    """End this worker when process ``parent`` dies, even by SIGKILL (which runs no cleanup in
    the parent, so without this its pool workers would live on forever, blocked on a queue).

    On Linux the kernel signals the worker (PR_SET_PDEATHSIG); a daemon thread that polls the
    parent pid covers other systems and a parent that died before the request was made.
    """
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        os._exit(1)

    threading.Thread(target=watch, name="tokenload-parent-watch", daemon=True).start()


def encode_chunk(task: EncodeTask, chunk: Chunk) -> Encoded:
    """Parse and encode ``chunk``."""
    start = time.perf_counter()
    parsed = parse_chunk(chunk, task.keys, task.strict)
    tok = tokenizer_for(task.tokenizer)
    dtype = np.dtype(task.dtype)
    eod = tok.eod_id if task.append_eod else None
    outputs = []
    for column in parsed.columns:
        if not parsed.has_lists:
            laid_out = tok.encode_documents(column, eod, dtype)
            if laid_out is not None:
                outputs.append(laid_out)
                continue
        if parsed.has_lists:
            texts, owners = _flatten_sentences(column)
        else:
            texts, owners = column, None
        ids, lengths = tok.encode_batch(texts)
        outputs.append(layout_documents(ids, lengths, owners, len(column), eod, dtype))
    seconds = time.perf_counter() - start
    return Encoded(
        outputs, parsed.documents, chunk.size, dict(parsed.skipped), parsed.examples, seconds
    )


def _flatten_sentences(column: list[Any]) -> tuple[list[str], np.ndarray]:
    texts: list[str] = []
    counts = np.empty(len(column), dtype=np.int64)
    for d, value in enumerate(column):
        if type(value) is str:
            texts.append(value)
            counts[d] = 1
        else:
            texts.extend(value)
            counts[d] = len(value)
    return texts, np.repeat(np.arange(len(column), dtype=np.int64), counts)


def layout_documents(
    ids: np.ndarray,
    lengths: np.ndarray,
    owners: np.ndarray | None,
    documents: int,
    eod: int | None,
    dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Documents from encoded texts: ``owners[i]`` is the document of text i (None: text i is
    document i). Returns (tokens, sequence lengths, sequences per document)."""
    owners = np.arange(lengths.size, dtype=np.int64) if owners is None else owners
    keep = lengths > 0
    kept_owners = owners[keep]
    seq_lengths = lengths[keep]
    per_doc = np.bincount(kept_owners, minlength=documents)
    ids = _cast(ids, dtype)
    if eod is not None and seq_lengths.size:
        last = np.empty(kept_owners.size, dtype=bool)
        last[:-1] = kept_owners[1:] != kept_owners[:-1]
        last[-1] = True
        ends = np.cumsum(lengths)[keep][last]
        ids = np.insert(ids, ends, dtype.type(eod))
        seq_lengths = seq_lengths + last
    return ids, seq_lengths.astype(np.int32), per_doc.astype(np.int32)


def _cast(ids: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if ids.size and ids.dtype != dtype:
        top, low = int(ids.max()), int(ids.min())
        info = np.iinfo(dtype)
        if top > info.max or low < info.min:
            raise id_beyond_dtype(top if top > info.max else low, dtype)
    return ids.astype(dtype, copy=False)
