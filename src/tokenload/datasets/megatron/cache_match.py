"""Whether a GPT index cache without a tokenload sidecar (Megatron wrote it) fits the token file.

Megatron names its cache by a hash of the configuration, not of the data, so a token file
rewritten with the same sizes keeps its old cache, and the arrays' shapes can still fit. A
tokenload sidecar records the token file's facts and the arrays' hashes; without one, the arrays
are checked against the current sequence lengths on first use, in a few O(n) NumPy passes:

* ``document_index``: ids inside the split's documents, each document the same number of times
  (one per epoch);
* ``sample_index``: sample k starts at stream position ``k * S`` (the last one, without
  drop-last, pinned to the end of the stream minus the extra token), each start inside its
  document -- exactly what Megatron's builder computes from the lengths, so a file whose lengths
  moved is found;
* ``shuffle_index``: a permutation of the samples (a duplicated or lost entry is found).

What cannot be checked: the order itself (which permutation, which order of documents) depends
on the seed only, not on the token files, so two entries swapped in place keep every invariant.
The tokens are not part of the indices either: a file rewritten with the same lengths but other
tokens makes the same cache, and reads the new tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["gpt_cache_mismatches"]


_ROWS = 1 << 22
"""Sample-index rows checked per pass: bounds the int64 temporaries (32 MiB each)."""


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
    reasons += _sample_reasons(samples, lengths, documents, sequence_length, extra)
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
    extra: int,
) -> list[str]:
    if samples.ndim != 2 or samples.shape[1] != 2 or not samples.shape[0]:
        return [f"sample_index: shape {samples.shape}, expected (samples + 1, 2)"]
    if not documents.size:
        return []
    doc_lengths = lengths[documents]
    cum = np.zeros(documents.size + 1, dtype=np.int64)
    np.cumsum(doc_lengths, out=cum[1:])
    last = cum[-1] - extra
    for first in range(0, samples.shape[0], _ROWS):
        rows = samples[first : first + _ROWS]
        reason = _sample_rows(rows, first, doc_lengths, cum, last, sequence_length)
        if reason:
            return [reason]
    return []


def _sample_rows(
    rows: np.ndarray,
    first: int,
    doc_lengths: np.ndarray,
    cum: np.ndarray,
    last: int,
    sequence_length: int,
) -> str | None:
    """The check of sample-index rows ``first..`` (one pass's worth)."""
    pos, off = rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64)
    if int(pos.min()) < 0 or int(pos.max()) >= doc_lengths.size or int(off.min()) < 0:
        return "sample_index: positions outside the document index or negative offsets"
    beyond = off > doc_lengths[pos]
    if beyond.any():
        k = int(np.flatnonzero(beyond)[0])
        return (
            f"sample_index: sample {first + k} starts at offset {int(off[k])} of a document of "
            f"{int(doc_lengths[pos[k]])} tokens in the current token file"
        )
    starts = cum[pos]
    starts += off
    expected = np.arange(first, first + rows.shape[0], dtype=np.int64)
    expected *= sequence_length
    np.minimum(expected, last, out=expected)
    if first == 0:
        expected[0] = 0
    bad = np.flatnonzero(starts != expected)
    if bad.size:
        k = int(bad[0])
        return (
            f"sample_index: sample {first + k} starts at stream position {int(starts[k])} in "
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
