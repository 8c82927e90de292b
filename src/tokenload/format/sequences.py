"""Megatron's per-dataset sequences JSON (``--per-dataset-sequences-path``), with dtypes.

Megatron's file is ``{prefix: [sequence_count, document_count]}``, the two counts of each
prefix's ``.idx`` header (``document_count`` = documents + 1), so that a reader at scale skips
opening and parsing every header. Megatron then guesses the token dtype from the tokenizer's
vocabulary size (uint16 up to 65,536, else int32), while its writer picks int32 from 65,500 up:
files of vocabularies 65,500-65,536 are read as the wrong type. tokenload's file therefore also
records each file's dtype, under one extra top-level key that is not a prefix
(``"__tokenload_dtypes__": {prefix: "uint16"}``). megatron-core only ever looks its prefixes up
by name (``sequences_per_dataset[dataset_path]``), so it reads tokenload's file unchanged.

A token file opened with counts from this file (``TokenFile(prefix, sequences=..., dtype=...)``)
trusts no header it did not read: on first use the ``.idx`` size must be the one the counts
imply, and the header bytes already in the mapping must agree, else a FormatError names the
file and the sequences JSON.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import ConfigError, FormatError
from ..storage.remote import is_url
from .atomic import require_folder, write_bytes_atomic
from .idx import MAGIC, MEGATRON_CODES, NEOX_CODES, IndexHeader, dtype_code

#: The top-level key that holds tokenload's dtypes; Megatron never looks it up.
DTYPES_KEY = "__tokenload_dtypes__"
_HEADER = struct.Struct("<9sQBQQ")
_TOKEN_DTYPES = {str(d) for d in MEGATRON_CODES.values()}


@dataclass(frozen=True)
class SequenceCounts:
    """One prefix's entry: the counts of its ``.idx`` header and, when recorded, its dtype."""

    sequence_count: int
    """N, sequences in the file."""
    document_count: int
    """D + 1, the length of ``document_indices`` (as the header stores it)."""
    dtype: np.dtype | None
    """The token dtype, or None in a file Megatron's tool wrote (then the header is read)."""


@dataclass(frozen=True)
class SequencesFile:
    """A parsed sequences JSON: ``entry(prefix)`` gives what a reader needs for one prefix."""

    path: str
    entries: Mapping[str, SequenceCounts]

    def entry(self, prefix: str) -> SequenceCounts:
        """The counts of ``prefix`` (the exact string of the blend, as Megatron looks it up)."""
        try:
            return self.entries[prefix]
        except KeyError:
            raise ConfigError(
                f"prefix {prefix!r} is not in the sequences file ({len(self.entries)} prefixes)",
                path=self.path,
                hint="write the file for this job's blend: tokenload sequences --data-path ..."
                f" --per-dataset-sequences-path {self.path} (prefixes as the blend spells them)",
            ) from None


def sequences_json(entries: Mapping[str, SequenceCounts]) -> dict[str, Any]:
    """The JSON object for ``entries``: Megatron's counts, then tokenload's dtypes."""
    if DTYPES_KEY in entries:
        raise ConfigError(
            f"a prefix is named {DTYPES_KEY!r}, the key that holds the dtypes",
            hint="rename the token file",
        )
    out: dict[str, Any] = {p: [e.sequence_count, e.document_count] for p, e in entries.items()}
    dtypes = {p: str(e.dtype) for p, e in entries.items() if e.dtype is not None}
    if dtypes:
        out[DTYPES_KEY] = dtypes
    return out


def write_sequences(path: str | os.PathLike[str], entries: Mapping[str, SequenceCounts]) -> None:
    """Write the sequences JSON atomically (a killed run leaves no file a job could read); a URL
    (``s3://...``) with one PUT, which appears whole or not at all."""
    data = (json.dumps(sequences_json(entries)) + "\n").encode("utf-8")
    path = os.fspath(path)
    if is_url(path):
        from ..storage.upload import upload_bytes

        upload_bytes(data, path)
    else:
        require_folder(path)
        write_bytes_atomic(path, data)


class _Headed(Protocol):
    """A token file whose header is known (``reader.TokenFile``)."""

    @property
    def header(self) -> IndexHeader: ...


def counts_of(token_file: _Headed) -> SequenceCounts:
    """The entry of an opened ``TokenFile``: its header's counts verbatim, and its dtype."""
    header = token_file.header
    return SequenceCounts(header.sequence_count, header.document_count, header.dtype)


def unique_prefixes(blends: Iterable[Iterable[str] | None]) -> list[str]:
    """Every prefix of ``blends`` once, in first-seen order (as Megatron's tool lists them)."""
    seen: dict[str, None] = {}
    for blend in blends:
        for prefix in blend or ():
            seen.setdefault(prefix, None)
    return list(seen)


def read_sequences(path: str | os.PathLike[str]) -> SequencesFile:
    """Parse a sequences JSON written by ``tokenload sequences`` or Megatron's tool.

    A file that is not JSON, not an object, or holds an entry that is not two counts, is a
    ConfigError naming the file."""
    path = os.fspath(path)
    try:
        with open(_local_copy(path), encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(
            "the sequences file does not exist",
            path=path,
            hint="write it with tokenload sequences --data-path ... --per-dataset-sequences-path"
            f" {path}",
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _malformed(path, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _malformed(
            path, f"holds a {type(data).__name__}, expected an object {{prefix: [N, D]}}"
        )
    dtypes = _dtypes(path, data.pop(DTYPES_KEY, {}))
    entries = {}
    for prefix, value in data.items():
        n, d = _counts(path, prefix, value)
        entries[prefix] = SequenceCounts(n, d, dtypes.pop(prefix, None))
    if dtypes:
        raise _malformed(path, f"{DTYPES_KEY} names prefixes without counts: {sorted(dtypes)}")
    return SequencesFile(path, entries)


def _local_copy(path: str) -> str:
    """``path``, or for a URL the node's copy of the object (``FileNotFoundError`` when there is
    no such object; any other failure is the storage layer's ``StorageError``)."""
    if not is_url(path):
        return path
    from ..storage.upload import copy_or_none

    copy = copy_or_none(path)
    if copy is None:
        raise FileNotFoundError(path)
    return copy


def _counts(path: str, prefix: str, value: Any) -> tuple[int, int]:
    ok = (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        and value[1] >= 1
    )
    if not ok:
        raise _malformed(
            path,
            f"{prefix!r} is {value!r}, expected [sequence_count, document_count] (counts >= 0,"
            " document_count >= 1)",
        )
    return value[0], value[1]


def _dtypes(path: str, value: Any) -> dict[str, np.dtype]:
    if not isinstance(value, dict) or not all(v in _TOKEN_DTYPES for v in value.values()):
        raise _malformed(
            path,
            f"{DTYPES_KEY} is {value!r}, expected {{prefix: dtype}} with dtypes"
            f" among {sorted(_TOKEN_DTYPES)}",
        )
    return {p: np.dtype(v) for p, v in value.items()}


def _malformed(path: str, message: str) -> ConfigError:
    return ConfigError(
        message,
        path=path,
        hint='rewrite it with tokenload sequences (Megatron\'s format: {"PREFIX": [N, D + 1], '
        "...})",
    )


def header_from_counts(
    head: bytes,
    file_size: int,
    idx_path: str,
    counts: tuple[int, int],
    dtype: np.dtype,
    *,
    multimodal: bool | None,
    source: str | None,
) -> IndexHeader:
    """The header of an ``.idx`` opened with given counts and dtype, checked against the file.

    The size must be the one the counts imply (34 + the arrays); the header bytes, already in
    memory with the arrays, must agree too (same magic and counts, a code of that dtype). Either
    mismatch means the token file changed after ``source`` (the sequences JSON) was written."""
    n, d = counts
    dtype = np.dtype(dtype)
    fitting = check_index_size(
        file_size, idx_path, counts, dtype, multimodal=multimodal, source=source
    )
    magic, _version, stored_code, stored_n, stored_d = _HEADER.unpack_from(head)
    stored_dtypes = {MEGATRON_CODES.get(stored_code), NEOX_CODES.get(stored_code)}
    if magic != MAGIC or (stored_n, stored_d) != (n, d) or dtype not in stored_dtypes:
        raise _stale(
            idx_path,
            source,
            f"header holds {stored_n} sequences, document count {stored_d}, dtype code "
            f"{stored_code}"
            f" (magic {magic!r}), expected {n}, {d} and a code of {dtype}",
        )
    return fitting[0]


def check_index_size(
    file_size: int,
    idx_path: str,
    counts: tuple[int, int],
    dtype: np.dtype,
    *,
    multimodal: bool | None,
    source: str | None,
) -> list[IndexHeader]:
    """The headers the counts imply that fit an ``.idx`` of ``file_size`` bytes (one ``stat`` of
    the file, no read); a ``FormatError`` naming the ``.idx`` and ``source`` when none does."""
    n, d = counts
    code = dtype_code(dtype)
    candidates = [
        IndexHeader(dtype, code, n, d, m)
        for m in ([False, True] if multimodal is None else [multimodal])
    ]
    fitting = [h for h in candidates if h.size == file_size]
    if not fitting:
        expected = " or ".join(str(h.size) for h in candidates)
        raise _stale(
            idx_path,
            source,
            f"index is {file_size} bytes, expected {expected} for the {n} sequences and {d - 1}"
            " documents",
        )
    return fitting


def check_counts(
    header: IndexHeader, counts: tuple[int, int], idx_path: str, source: str | None
) -> None:
    """A header read from the file must hold the counts given for it (no dtype recorded)."""
    if (header.sequence_count, header.document_count) != tuple(counts):
        raise _stale(
            idx_path,
            source,
            f"header holds {header.sequence_count} sequences and document count"
            f" {header.document_count}, expected {counts[0]} and {counts[1]}",
        )


def _stale(idx_path: str, source: str | None, message: str) -> FormatError:
    given = f"as {source} records them" if source else "as given"
    rerun = f" --per-dataset-sequences-path {source}" if source else ""
    return FormatError(
        f"{message} ({given})",
        path=idx_path,
        hint="the token file changed after its sequences JSON was written; rewrite it: tokenload"
        f" sequences --data-path ...{rerun}",
    )


__all__ = [
    "DTYPES_KEY",
    "SequenceCounts",
    "SequencesFile",
    "check_counts",
    "check_index_size",
    "counts_of",
    "header_from_counts",
    "read_sequences",
    "sequences_json",
    "unique_prefixes",
    "write_sequences",
]
