"""Where a GPT dataset's sequences come from: a token file, or Megatron's mock sequences.

Both expose ``sequence_lengths`` and ``read_pieces(sequences, offsets, lengths)`` (one vectorized
read of many sequence slices, concatenated), which is all the sample layer needs: the
``TokenSource`` Protocol. What only a token file has (its prefix, dtype, ``.bin`` spans, the facts
of its content) is read from a ``format.TokenFile``, narrowed with ``isinstance``. The facts that
identify a token file's content (``file_facts``), recorded with each cache, and their lazy
re-check where the file opens anyway (``stale_facts``) live here too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import xxhash

from ..byte_source import gather_index
from ..errors import CacheError, ConfigError
from ..format import TokenFile, read_sidecar
from ..format.sequences import SequencesFile
from ..storage import file_size, local_path

MOCK_SEQUENCES = 100_000
MOCK_MAX_LENGTH = 4096


class TokenSource(Protocol):
    """What a dataset reads its sequences through: a ``format.TokenFile`` or a ``MockSource``."""

    @property
    def sequence_lengths(self) -> np.ndarray:
        """Tokens per sequence."""
        ...

    def read_pieces(
        self, sequences: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, dtype: Any = None
    ) -> np.ndarray:
        """Concatenated tokens of the pieces ``(sequence, offset, length)`` in one vectorized
        read, cast to ``dtype`` (a NumPy dtype or scalar type) when one is given."""
        ...


class MockSource:
    """Megatron's ``MockGPTLowLevelDataset`` (``--mock-data``), computed instead of stored.

    100,000 sequences with lengths ``default_rng(0).integers(1, 4096)``; sequence i holds
    ``(arange(len - 1) + 1) % vocab_size`` followed by EOD. Any slice is computed from its
    positions, so reading costs no I/O: the throughput ceiling to compare real data against.
    """

    def __init__(self, vocab_size: int, eod_id: int) -> None:
        self.vocab_size = int(vocab_size)
        self.eod_id = int(eod_id)
        self.sequence_lengths = np.random.default_rng(seed=0).integers(
            low=1, high=MOCK_MAX_LENGTH, size=MOCK_SEQUENCES, dtype=np.int32
        )

    def read_pieces(
        self,
        sequences: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        dtype: npt.DTypeLike | None = None,
    ) -> np.ndarray:
        sequences = np.asarray(sequences, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        within = gather_index(offsets, lengths)  # position inside each sequence
        last = np.repeat(self.sequence_lengths[sequences].astype(np.int64) - 1, lengths)
        return np.where(within == last, self.eod_id, (within + 1) % self.vocab_size)

    def __reduce__(self) -> tuple[type[MockSource], tuple[int, int]]:
        return (MockSource, (self.vocab_size, self.eod_id))


_INDEX_DIGESTS: dict[tuple[int, ...], str] = {}
"""``index_digest`` by the ``.idx`` file's identity: each file is hashed once per process."""


def index_digest(source: TokenFile, *, cached: bool = True) -> str:
    """xxh3-64 of what a file's indices depend on, the raw bytes of its sequence lengths and
    document indices (not the pointers: they follow from the lengths). About 15 ms per 10 M
    sequences from the page cache. ``cached``: keyed by device, inode, size and times (one stat),
    so a rewrite is seen; uncached costs no system call beyond the file's own opening."""
    key = None
    if cached:
        st = os.stat(local_path(source.idx_path))  # a URL's: its copy, named by its ETag
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key in _INDEX_DIGESTS:
            return _INDEX_DIGESTS[key]
    h = xxhash.xxh3_64(source.sequence_lengths)  # type: ignore[arg-type]  # a buffer
    if getattr(source, "documents_from_sequences", False):
        h.update(b"each sequence is a document")  # no boundaries recorded: nothing to read
    else:
        h.update(source.document_indices)  # type: ignore[arg-type]
    digest = h.hexdigest()
    if key is not None:
        _INDEX_DIGESTS[key] = digest
    return digest


def file_facts(source: TokenFile) -> dict[str, Any]:
    """What identifies a token file's content: its sizes, the digest of its index arrays, and
    its sidecar's hashes when it has one."""
    facts: dict[str, Any] = {
        "bin_bytes": file_size(source.bin_path),
        "idx_bytes": file_size(source.idx_path),
        "index_xxh3_64": index_digest(source),
    }
    sidecar = read_sidecar(source.prefix)
    if sidecar is not None:
        facts["xxh3_64"] = {k: v.get("xxh3_64") for k, v in sidecar.hashes.items()}
    return facts


class FactsGuard:
    """Checks, on a dataset's first use in each process, that its token file still holds the
    content facts (``file_facts``) its index cache was built from: a ``CacheError`` naming what
    changed otherwise. None (facts checked when the dataset was built) checks nothing."""

    __slots__ = ("_pid", "facts", "source")

    def __init__(self, source: Any, facts: dict[str, Any] | None) -> None:
        self.source, self.facts = source, facts
        self._pid = None if facts is not None else -1

    def check(self) -> None:
        pid = self._pid
        if pid is not None and (pid < 0 or pid == os.getpid()):
            return
        stale = stale_facts(self.source, self.facts or {})
        if stale:
            raise CacheError(
                f"the token file changed since its index cache was built ({'; '.join(stale)})",
                path=self.source.idx_path,
                hint="the cache is stale: rebuild it with `tokenload prepare-cache` and the"
                " job's arguments, or load with build_policy='auto' (rebuilds it)",
            )
        self._pid = os.getpid()

    def __getstate__(self) -> tuple[Any, Any, Any]:
        return self.source, self.facts, self._pid

    def __setstate__(self, state: tuple[Any, Any, Any]) -> None:
        self.source, self.facts, self._pid = state


def stale_facts(source: TokenFile, recorded: dict[str, Any]) -> list[str]:
    """How an opened token file differs from the facts a build recorded, checked with what its
    opening read anyway (the ``.bin`` size from its open descriptor, the index arrays): no path
    stat, no sidecar read. Empty when it matches."""
    found = {
        "bin_bytes": int(source.num_tokens) * source.dtype.itemsize,
        "index_xxh3_64": index_digest(source, cached=False),
    }
    return [
        f"{k}: recorded {recorded.get(k)!r}, found {v!r}"
        for k, v in found.items()
        if recorded.get(k) != v
    ]


def open_token_file(
    prefix: str, mode: str, sequences: SequencesFile | None, *, warmup: bool = False
) -> TokenFile:
    """A lazy ``TokenFile``; with a sequences JSON, opened with its counts and dtype (no header
    parsed; a prefix the file lacks is a ConfigError naming it)."""
    if sequences is None:
        return TokenFile(prefix, mode=mode, warmup=warmup)
    entry = sequences.entry(prefix)
    return TokenFile(
        prefix,
        mode=mode,
        sequences=(entry.sequence_count, entry.document_count),
        dtype=entry.dtype,
        sequences_path=sequences.path,
        warmup=warmup,
    )


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """What opening a source takes of a ``MegatronDataConfig`` (``config.source_options()``)."""

    read_mode: str = "mmap"
    """How token files are read: mmap, pread or memory."""
    warmup: bool = False
    """Read each token file once, sequentially, when first opened."""
    vocab_size: int | None = None
    """Mock data's vocabulary size."""
    eod_id: int | None = None
    """Mock data's end-of-document id."""


def open_source(
    prefix: str | None, options: SourceOptions, sequences: SequencesFile | None
) -> MockSource | TokenFile:
    """What ``prefix`` reads from: mock data for None, else a lazy ``TokenFile`` in the
    configured read mode (and warm-up)."""
    if prefix is None:
        if options.vocab_size is None or options.eod_id is None:
            raise ConfigError(
                "mock data needs vocab_size and eod_id", hint="pass the tokenizer's values"
            )
        return MockSource(options.vocab_size, options.eod_id)
    return open_token_file(prefix, options.read_mode, sequences, warmup=options.warmup)
