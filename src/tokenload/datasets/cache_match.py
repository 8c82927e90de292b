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


def gpt_cache_mismatches(
    arrays: Mapping[str, np.ndarray], lengths: np.ndarray, begin: int, end: int, *,
    sequence_length: int, extra: int,
) -> list[str]:
    """Why the arrays cannot be the indices of sequences ``[begin, end)`` of a file with these
    ``lengths`` (empty when they can); ``extra`` is 1 with ``add_extra_token`` else 0."""
    documents = np.asarray(arrays["document_index"]).astype(np.int64)
    reasons = _document_reasons(documents, begin, end)
    if reasons:
        return reasons  # the sample checks index the lengths through the document ids
    reasons += _sample_reasons(np.asarray(arrays["sample_index"]), lengths, documents, sequence_length, extra)
    reasons += _shuffle_reasons(np.asarray(arrays["shuffle_index"]), len(arrays["sample_index"]) - 1)
    return reasons


def _document_reasons(documents: np.ndarray, begin: int, end: int) -> list[str]:
    if not documents.size:
        return []
    low, high = int(documents.min()), int(documents.max())
    if low < begin or high >= end:
        return [f"document_index: ids {low}..{high}, expected ids of the split's sequences "
                f"{begin}..{end - 1} in the current token file"]
    counts = np.bincount(documents - begin, minlength=end - begin)
    if int(counts.min()) != int(counts.max()):
        return [f"document_index: documents appear {int(counts.min())} to {int(counts.max())} times, "
                "expected each once per epoch"]
    return []


def _sample_reasons(samples, lengths, documents, sequence_length: int, extra: int) -> list[str]:
    if samples.ndim != 2 or samples.shape[1] != 2 or not samples.shape[0]:
        return [f"sample_index: shape {samples.shape}, expected (samples + 1, 2)"]
    pos, off = samples[:, 0].astype(np.int64), samples[:, 1].astype(np.int64)
    if int(pos.min()) < 0 or int(pos.max()) >= max(documents.size, 1) or int(off.min()) < 0:
        return ["sample_index: positions outside the document index or negative offsets"]
    if not documents.size:
        return []
    doc_lengths = lengths[documents].astype(np.int64)
    if bool(np.any(off > doc_lengths[pos])):
        k = int(np.flatnonzero(off > doc_lengths[pos])[0])
        return [f"sample_index: sample {k} starts at offset {int(off[k])} of a document of "
                f"{int(doc_lengths[pos[k]])} tokens in the current token file"]
    cum = np.zeros(documents.size + 1, dtype=np.int64)
    np.cumsum(doc_lengths, out=cum[1:])
    starts = cum[pos] + off
    expected = np.minimum(np.arange(samples.shape[0], dtype=np.int64) * sequence_length, cum[-1] - extra)
    expected[0] = 0
    bad = np.flatnonzero(starts != expected)
    if bad.size:
        k = int(bad[0])
        return [f"sample_index: sample {k} starts at stream position {int(starts[k])} in the current "
                f"token file, expected {int(expected[k])} ({k} x {sequence_length} tokens): the "
                "sequence lengths changed since the cache was built"]
    return []


def _shuffle_reasons(shuffle: np.ndarray, samples: int) -> list[str]:
    if shuffle.size != samples:
        return [f"shuffle_index: {shuffle.size} entries, expected {samples}"]
    if not samples:
        return []
    values = shuffle.astype(np.int64)
    if int(values.min()) < 0 or int(values.max()) >= samples:
        return [f"shuffle_index: entries outside 0..{samples - 1}"]
    counts = np.bincount(values, minlength=samples)
    if int(counts.max()) > 1:
        k = int(np.argmax(counts))
        return [f"shuffle_index: sample {k} appears {int(counts[k])} times, expected a permutation"]
    return []
