"""Describe and verify token files: the library side of ``tokenload info`` and ``tokenload verify``.

``describe`` reads only the index (O(sequences)). ``verify`` checks every structural invariant of
the index against the ``.bin`` size; every token against a vocabulary size (given, or the
sidecar's), scanning ``.bin`` in bounded chunks; and on request the sidecar's xxh3-64 hashes.
``check_file`` also says which of these it did, since "valid" means little without it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import xxhash

from ..errors import FormatError
from ..storage.os_errors import read_error
from .idx import check_arrays, code_note
from .reader import TokenFile
from .sidecar import Sidecar, read_sidecar, sidecar_path


def file_size(path: str) -> int:
    """Bytes of a local file or of an object behind a URL."""
    from ..storage import file_size as size

    return size(path)


_SCAN_TOKENS = 16 << 20


def describe(prefix: str) -> dict[str, Any]:
    """Counts, dtype, document length percentiles and the sidecar of one token file.

    ``prefix`` may also name ``PREFIX.bin`` or ``PREFIX.idx``. A float file (not a token file,
    which ``verify`` fails) is described too, with a note saying so."""
    tf = TokenFile(prefix, mode="pread", allow_float=True)
    header = tf.header
    # the structure `verify` checks (cheap: a pass over the index), so that figures of a damaged
    # index (a negative length, a pointer out of place) are never shown as if sound
    problems = check_arrays(
        header,
        tf.sequence_lengths,
        tf.sequence_pointers,
        tf.document_indices,
        file_size(tf.bin_path),
    )
    doc_tokens = document_token_counts(tf)
    pct = [0, 50, 90, 99, 100]
    sidecar = read_sidecar(tf.prefix)
    return {
        "prefix": tf.prefix,
        "dtype": tf.dtype.name,
        "dtype_code": header.code,
        "dtype_note": code_note(header),
        "index_format": header.index_format,
        "documents": tf.num_documents,
        "documents_from_sequences": tf.documents_from_sequences,
        "sequences": tf.num_sequences,
        "tokens": tf.num_tokens,
        "bin_bytes": file_size(tf.bin_path),
        "idx_bytes": file_size(tf.idx_path),
        "document_tokens": {
            f"p{p}": int(v)
            for p, v in zip(pct, np.percentile(doc_tokens, pct) if doc_tokens.size else [0] * 5)
        },
        "mean_document_tokens": float(doc_tokens.mean()) if doc_tokens.size else 0.0,
        "empty_documents": int(np.count_nonzero(doc_tokens == 0)),
        "sidecar": None if sidecar is None else asdict(sidecar),
        "foreign_sidecar": sidecar is None and foreign_sidecar(tf.prefix),
        "problems": problems,
    }


def document_token_counts(tf: TokenFile) -> np.ndarray:
    """int64 tokens per document (sum of its sequences' lengths)."""
    cum = np.zeros(tf.num_sequences + 1, dtype=np.int64)
    np.cumsum(tf.sequence_lengths, dtype=np.int64, out=cum[1:])
    docs = np.clip(np.asarray(tf.document_indices), 0, tf.num_sequences)
    return np.diff(cum[docs])


@dataclass
class Verification:
    """What ``check_file`` found and what it checked (``problems`` empty: the file is sound)."""

    prefix: str
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    """One phrase per check done, e.g. "structure", "tokens < 50257 (the sidecar's vocab_size)"."""


def verify(prefix: str, *, vocab_size: int | None = None, hashes: bool = False) -> list[str]:
    """Every problem found in one token file; an empty list means it is sound (``check_file``)."""
    return check_file(prefix, vocab_size=vocab_size, hashes=hashes).problems


def check_file(prefix: str, *, vocab_size: int | None = None, hashes: bool = False) -> Verification:
    """Check one token file: its structure always, every token against ``vocab_size`` (default:
    the sidecar's tokenizer vocab_size, when there is one), and the sidecar's hashes if
    ``hashes``."""
    tf = TokenFile(prefix, mode="pread")
    result = Verification(
        tf.prefix, checked=["structure (header, sizes, pointers, document indices)"]
    )
    try:
        header = tf.header
    except FormatError as exc:  # a file that cannot be read at all (StorageError) is not judged
        result.problems.append(str(exc).replace("\n", " "))
        return result
    result.checked[0] = _structure_label(header.index_format, tf.documents_from_sequences)
    result.problems += check_arrays(
        header,
        tf.sequence_lengths,
        tf.sequence_pointers,
        tf.document_indices,
        file_size(tf.bin_path),
    )
    sidecar = read_sidecar(tf.prefix)
    vocab_size, source = _vocab_size(vocab_size, sidecar)
    if vocab_size is not None and not result.problems:
        result.checked.append(f"tokens < {vocab_size} ({source})")
        result.problems += _check_vocab(tf, vocab_size)
    if hashes:
        result.checked.append("xxh3-64 hashes against the sidecar")
        result.problems += _check_hashes(tf, sidecar)
    return result


def _structure_label(index_format: str, per_sequence: bool) -> str:
    """What the structure check covered, in the words of the format that was read."""
    fields = (
        "legacy TNTIDX header, offsets, sizes"
        if index_format == "TNTIDX"
        else "header, sizes, pointers"
    )
    if per_sequence:
        return f"structure ({fields}; no document indices: each sequence is a document)"
    return f"structure ({fields}, document indices)"


def _vocab_size(given: int | None, sidecar: Sidecar | None) -> tuple[int | None, str]:
    """The vocabulary size to check tokens against, and where it came from."""
    if given is not None:
        return given, "`vocab_size=`"
    recorded = (sidecar.tokenizer or {}).get("vocab_size") if sidecar is not None else None
    if isinstance(recorded, int) and recorded > 0:
        return recorded, "the sidecar's vocab_size"
    return None, ""


def _check_vocab(tf: TokenFile, vocab_size: int) -> list[str]:
    for start in range(0, tf.num_tokens, _SCAN_TOKENS):
        chunk = tf.read_spans(
            np.array([start]), np.array([min(_SCAN_TOKENS, tf.num_tokens - start)])
        )
        bad = (chunk < 0) | (chunk >= vocab_size)
        if bool(bad.any()):
            i = int(np.flatnonzero(bad)[0])
            count = int(np.count_nonzero(bad))
            return [
                f"token {int(chunk[i])} at position {start + i} is outside the vocabulary [0, "
                f"{vocab_size})"
                f" ({count} such tokens in that {chunk.size}-token chunk)"
            ]
    return []


def foreign_sidecar(prefix: str) -> bool:
    """Whether a local ``PREFIX.json`` exists that is not a tokenload sidecar (``read_sidecar``
    ignores it: another tool's file, or one not JSON at all)."""
    path = sidecar_path(prefix)
    return "://" not in path and os.path.exists(path) and read_sidecar(prefix) is None


def _check_hashes(tf: TokenFile, sidecar: Sidecar | None) -> list[str]:
    if sidecar is None and foreign_sidecar(tf.prefix):
        return [
            f"{tf.prefix}.json is not a tokenload sidecar (not JSON, or another tool's file), so"
            " no hashes to check"
        ]
    if sidecar is None:
        return [
            f"{tf.prefix}.json: no sidecar, so no hashes to check (files written by Megatron have "
            "none)"
        ]
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
    if "://" in path:
        return _object_xxh3(path, chunk)
    try:
        with open(path, "rb") as f:
            while data := f.read(chunk):
                h.update(data)
    except OSError as exc:
        raise read_error(exc, path, "the file") from None
    return h.hexdigest()


def _object_xxh3(url: str, chunk: int) -> str:
    """xxh3-64 of an object, streamed in ranged GETs of ``chunk`` bytes (each retried)."""
    from ..storage.options import StorageOptions
    from ..storage.remote import call, info, ranged_get

    options = StorageOptions.from_env()
    size = info(url, options).size
    h = xxhash.xxh3_64()
    for start in range(0, size, chunk):
        end = min(size, start + chunk)
        h.update(call(url, "read it", lambda: ranged_get(url, start, end)[0], options))  # noqa: B023 (called at once)
    return h.hexdigest()
