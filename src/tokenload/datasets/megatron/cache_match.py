"""Whether a GPT index cache without a tokenload sidecar (Megatron wrote it) fits the token file.

Megatron names its cache by a hash of the configuration, not of the data, so a token file
rewritten with the same sizes keeps its old cache, and the arrays' shapes can still fit. A
tokenload sidecar records the token file's facts and the arrays' hashes; without one, the arrays
are checked against the current sequence lengths on first use, in a few O(n) NumPy passes:

* ``document_index``: ids inside the split's documents, each document the same number of times
  (one per epoch);
* ``sample_index``: positions that never go back, sample k starting at stream position ``k * S``
  (the last one, without drop-last, pinned to the end of the stream minus the extra token), each
  start inside its document -- exactly what Megatron's builder computes from the lengths, so a
  file whose lengths moved is found;
* ``shuffle_index``: a permutation of the samples (a duplicated or lost entry is found).

Memory and time are linear in the documents and samples: the stream positions of the documents
are computed in windows of ``_DOCS`` documents, as the samples that start in them are checked
(rows in passes of ``_ROWS``), never as one array the size of the document index (the first
version's whole-index ``cumsum``, an int32-to-int64 cast into 8 bytes a document, made its 100 M
document check 50-80x its 10 M one); the stream's length is the split's tokens times the epochs,
which the document check has just established.

What cannot be checked: the order itself (which permutation, which order of documents) depends
on the seed only, not on the token files, so two entries swapped in place keep every invariant.
The tokens are not part of the indices either: a file rewritten with the same lengths but other
tokens makes the same cache, and reads the new tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["gpt_cache_mismatches"]


_ROWS = 1 << 20
"""Sample-index rows checked per pass: bounds the int64 temporaries (8 MiB each)."""

_DOCS = 1 << 20
"""Documents whose stream positions are computed at once (8 MiB of int64)."""


def gpt_cache_mismatches(
    arrays: Mapping[str, np.ndarray],
    lengths: np.ndarray,
    begin: int,
    end: int,
    *,
    sequence_length: int,
    extra: int,
) -> list[str]:
    """Why the arrays cannot be the indices of sequences ``[begin, end)`` of a file with these
    ``lengths`` (empty when they can); ``extra`` is 1 with ``add_extra_token`` else 0."""
    documents = np.asarray(arrays["document_index"])
    reasons = _document_reasons(documents, begin, end)
    if reasons:
        return reasons  # the sample checks index the lengths through the document ids
    samples = np.asarray(arrays["sample_index"])
    epochs = documents.size // (end - begin) if end > begin else 0
    tokens = epochs * int(np.sum(lengths[begin:end], dtype=np.int64))  # the stream's length
    reasons += _sample_reasons(samples, lengths, documents, sequence_length, tokens - extra)
    reasons += _shuffle_reasons(np.asarray(arrays["shuffle_index"]), len(samples) - 1)
    return reasons


def _all_once(values: np.ndarray, count: int, offset: int = 0) -> bool:
    """Whether ``values`` (``count`` of them, each in ``[offset, offset + count)``) hold every
    value once: one scatter into a flag per value (a byte each), cheaper than counting."""
    seen = np.zeros(count, dtype=bool)
    seen[values - offset if offset else values] = True
    return bool(seen.all())


def _document_reasons(documents: np.ndarray, begin: int, end: int) -> list[str]:
    if not documents.size:
        return []
    low, high = int(documents.min()), int(documents.max())
    if low < begin or high >= end:
        return [
            f"document_index: ids {low}..{high}, expected ids of the split's sequences "
            f"{begin}..{end - 1} in the current token file"
        ]
    count = end - begin
    epochs, rest = divmod(documents.size, count)
    if rest:
        return [
            f"document_index: {documents.size} entries for {count} documents, expected a "
            "whole number of epochs"
        ]
    if epochs == 1:
        if not _all_once(documents, count, begin):
            return [
                "document_index: a document appears twice and another not at all, expected "
                "each once per epoch"
            ]
        return []
    counts = np.bincount(documents - begin, minlength=count)
    if int(counts.min()) != int(counts.max()):
        low, high = int(counts.min()), int(counts.max())
        return [
            f"document_index: documents appear {low} to {high} times, expected each once per epoch"
        ]
    return []


def _sample_reasons(
    samples: np.ndarray,
    lengths: np.ndarray,
    documents: np.ndarray,
    sequence_length: int,
    last: int,
) -> list[str]:
    """The sample index against the stream of ``documents`` (whose tokens end at ``last`` plus
    the extra token)."""
    if samples.ndim != 2 or samples.shape[1] != 2 or not samples.shape[0]:
        return [f"sample_index: shape {samples.shape}, expected (samples + 1, 2)"]
    if not documents.size:
        return []
    stream = _Stream(lengths, documents)
    previous = 0  # the last position of the pass before
    for first in range(0, samples.shape[0], _ROWS):
        rows = samples[first : first + _ROWS]
        pos, off = rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64)
        if int(pos.min()) < 0 or int(pos.max()) >= documents.size or int(off.min()) < 0:
            return ["sample_index: positions outside the document index or negative offsets"]
        back = np.flatnonzero(pos[1:] < pos[:-1])
        if int(pos[0]) < previous or back.size:
            k = first + (int(back[0]) + 1 if int(pos[0]) >= previous else 0)
            return [
                f"sample_index: sample {k} starts in an earlier document than the sample before"
                " it, expected positions that never go back"
            ]
        previous = int(pos[-1])
        i = 0
        while i < pos.size:  # the rows that start in one window of documents
            a = int(pos[i])
            b = min(a + _DOCS, previous + 1)
            j = int(np.searchsorted(pos, b)) if b <= previous else pos.size
            reason = _window(stream, a, b, pos[i:j] - a, off[i:j], first + i, last, sequence_length)
            if reason:
                return [reason]
            i = j
    return []


class _Stream:
    """Where each document of the document index starts in the token stream, computed forward
    one window at a time; the last window is kept, so that the next may begin inside it."""

    def __init__(self, lengths: np.ndarray, documents: np.ndarray) -> None:
        self.lengths, self.documents = lengths, documents
        self.at = 0  # the document the stream has reached
        self.tokens = 0  # where it starts
        self.kept = (0, np.zeros(1, dtype=np.int64))  # the last window: first document, starts

    def window(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Start positions and lengths (int64) of documents ``[a, b)``."""
        if a < self.at:  # inside the last window
            first, starts = self.kept
            self.at, self.tokens = a, int(starts[a - first])
        for c in range(self.at, a, _DOCS):  # documents in which no sample starts
            piece = self.lengths[self.documents[c : min(c + _DOCS, a)]]
            self.tokens += int(np.sum(piece, dtype=np.int64))
        sizes = self.lengths[self.documents[a:b]].astype(np.int64)
        starts = np.empty(b - a, dtype=np.int64)
        starts[0] = self.tokens
        np.cumsum(sizes[:-1], out=starts[1:])
        starts[1:] += self.tokens
        self.at, self.tokens, self.kept = b, int(starts[-1] + sizes[-1]), (a, starts)
        return starts, sizes


def _window(
    stream: _Stream,
    a: int,
    b: int,
    local: np.ndarray,
    off: np.ndarray,
    first: int,
    last: int,
    sequence_length: int,
) -> str | None:
    """The check of the sample rows ``first..`` that start in documents ``[a, b)`` (``local``:
    their positions less ``a``)."""
    starts, sizes = stream.window(a, b)
    beyond = off > sizes[local]
    if beyond.any():
        k = int(np.flatnonzero(beyond)[0])
        return (
            f"sample_index: sample {first + k} starts at offset {int(off[k])} of a document of "
            f"{int(sizes[local[k]])} tokens in the current token file"
        )
    at = starts[local]
    at += off
    expected = np.arange(first, first + local.size, dtype=np.int64)
    expected *= sequence_length
    np.minimum(expected, last, out=expected)
    if first == 0:
        expected[0] = 0
    bad = np.flatnonzero(at != expected)
    if bad.size:
        k = int(bad[0])
        return (
            f"sample_index: sample {first + k} starts at stream position {int(at[k])} in "
            f"the current token file, expected {int(expected[k])} ({first + k} x "
            f"{sequence_length} tokens): the sequence lengths changed since the cache was "
            "built"
        )
    return None


def _shuffle_reasons(shuffle: np.ndarray, samples: int) -> list[str]:
    if shuffle.size != samples:
        return [f"shuffle_index: {shuffle.size} entries, expected {samples}"]
    if not samples:
        return []
    if int(shuffle.min()) < 0 or int(shuffle.max()) >= samples:
        return [f"shuffle_index: entries outside 0..{samples - 1}"]
    if not _all_once(shuffle, samples):
        return [
            "shuffle_index: an entry appears twice and another not at all, expected a permutation"
        ]
    return []
