"""Describe and verify token files: the library side of ``tokenload info`` and ``tokenload verify``.

``describe`` reads only the index (O(sequences)). ``verify`` checks every structural invariant of
the index against the ``.bin`` size, optionally every token against a vocabulary size (scanning
``.bin`` in bounded chunks), and the sidecar's xxh3-64 hashes.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import numpy as np
import xxhash

from ..errors import StorageError, TokenloadError
from .idx import check_arrays
from .reader import TokenFile
from .sidecar import read_sidecar

_SCAN_TOKENS = 16 << 20


def describe(prefix: str) -> dict[str, Any]:
    """Counts, dtype, document length percentiles and the sidecar of one token file."""
    tf = TokenFile(prefix, mode="pread")
    doc_tokens = document_token_counts(tf)
    pct = [0, 50, 90, 99, 100]
    sidecar = read_sidecar(prefix)
    return {
        "prefix": tf.prefix,
        "dtype": tf.dtype.name,
        "documents": tf.num_documents,
        "sequences": tf.num_sequences,
        "tokens": tf.num_tokens,
        "bin_bytes": os.path.getsize(tf.bin_path),
        "idx_bytes": os.path.getsize(tf.idx_path),
        "document_tokens": {
            f"p{p}": int(v) for p, v in zip(pct, np.percentile(doc_tokens, pct) if doc_tokens.size else [0] * 5)
        },
        "mean_document_tokens": float(doc_tokens.mean()) if doc_tokens.size else 0.0,
        "empty_documents": int(np.count_nonzero(doc_tokens == 0)),
        "sidecar": None if sidecar is None else asdict(sidecar),
    }


def document_token_counts(tf: TokenFile) -> np.ndarray:
    """int64 tokens per document (sum of its sequences' lengths)."""
    cum = np.zeros(tf.num_sequences + 1, dtype=np.int64)
    np.cumsum(tf.sequence_lengths, dtype=np.int64, out=cum[1:])
    docs = np.clip(np.asarray(tf.document_indices), 0, tf.num_sequences)
    return np.diff(cum[docs])


def verify(prefix: str, *, vocab_size: int | None = None, hashes: bool = False) -> list[str]:
    """Every problem found in one token file; an empty list means it is sound."""
    tf = TokenFile(prefix, mode="pread")
    try:
        header = tf.header
    except TokenloadError as exc:
        return [str(exc).replace("\n", " ")]
    problems = check_arrays(
        header, tf.sequence_lengths, tf.sequence_pointers, tf.document_indices, os.path.getsize(tf.bin_path)
    )
    if vocab_size is not None and not problems:
        problems += _check_vocab(tf, vocab_size)
    if hashes:
        problems += _check_hashes(tf)
    return problems


def _check_vocab(tf: TokenFile, vocab_size: int) -> list[str]:
    for start in range(0, tf.num_tokens, _SCAN_TOKENS):
        chunk = tf.read_spans(np.array([start]), np.array([min(_SCAN_TOKENS, tf.num_tokens - start)]))
        bad = (chunk < 0) | (chunk >= vocab_size)
        if bool(bad.any()):
            i = int(np.flatnonzero(bad)[0])
            count = int(np.count_nonzero(bad))
            return [
                f"token {int(chunk[i])} at position {start + i} is outside the vocabulary [0, {vocab_size})"
                f" ({count} such tokens in that {chunk.size}-token chunk)"
            ]
    return []


def _check_hashes(tf: TokenFile) -> list[str]:
    sidecar = read_sidecar(tf.prefix)
    if sidecar is None:
        return [f"{tf.prefix}.json: no sidecar, so no hashes to check (files written by Megatron have none)"]
    problems = []
    for ext, path in (("bin", tf.bin_path), ("idx", tf.idx_path)):
        expected = sidecar.hashes.get(ext, {}).get("xxh3_64")
        actual = file_xxh3(path)
        if expected != actual:
            problems.append(f"{path}: xxh3_64 is {actual}, the sidecar records {expected}")
    return problems


def file_xxh3(path: str, chunk: int = 16 << 20) -> str:
    """xxh3-64 hex digest of a whole file, read in bounded chunks."""
    h = xxhash.xxh3_64()
    try:
        with open(path, "rb") as f:
            while data := f.read(chunk):
                h.update(data)
    except OSError as exc:
        raise StorageError(f"cannot read ({exc.strerror})", path=path, hint="check the file exists") from None
    return h.hexdigest()

