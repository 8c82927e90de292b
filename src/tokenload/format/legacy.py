"""The legacy fairseq "cached/lazy" index (magic ``TNTIDX``), read as the arrays of an MMIDIDX one.

GPT-NeoX's ``data_impl`` ``cached``/``lazy`` (and pre-2023 Megatron) write this format. Layout,
little-endian, no padding: the 8-byte magic ``TNTIDX\\x00\\x00``, u64 version = 1, u64 dtype code,
u64 element size, u64 item count N, u64 size count S, u64 document count D + 1; then int64
``dim_offsets[N + 1]``, int64 ``data_offsets[N + 1]`` (in **elements** of ``.bin``, not bytes),
int64 ``sizes[S]`` (the shape of every item, flattened) and int64 ``doc_idx[D + 1]``. The ``.bin``
is the items' elements back to back, exactly as an MMIDIDX ``.bin``.

The index holds int64 arrays where MMIDIDX has int32 lengths and byte pointers, so it is read
into memory and converted at open: O(N), as GPT-NeoX's own reader reads it. Since the cost is
paid anyway, every structural invariant is checked here (``verify``'s O(N) checks for MMIDIDX).
"""

from __future__ import annotations

import struct

import numpy as np

from ..errors import FormatError
from .idx import MEGATRON_CODES, NEOX_CODES, DtypeCodes, IndexHeader

LEGACY_MAGIC = b"TNTIDX\x00\x00"
LEGACY_HEADER = struct.Struct("<8sQQQQQQ")
LEGACY_HEADER_SIZE = LEGACY_HEADER.size  # 56
_MAX_LENGTH = np.iinfo(np.int32).max
_NAME = "legacy fairseq index (TNTIDX)"
_REWRITE = "the legacy index is corrupt; rewrite it from the source data, or from a sound copy"


def is_legacy(head: bytes | memoryview) -> bool:
    """Whether an index starts with the legacy magic (GPT-NeoX's ``data_impl="infer"`` sniff)."""
    return bytes(head[: len(LEGACY_MAGIC)]) == LEGACY_MAGIC


def legacy_size(items: int, sizes: int, documents: int) -> int:
    """Exact size in bytes of a legacy index with these counts."""
    return LEGACY_HEADER_SIZE + 8 * (2 * (items + 1) + sizes + documents)


def read_legacy(
    buffer: bytes | memoryview,
    path: str,
    *,
    dtype_codes: DtypeCodes | str = "auto",
    multimodal: bool | None = None,
) -> tuple[IndexHeader, np.ndarray, np.ndarray, np.ndarray]:
    """The header and the MMIDIDX-shaped arrays (int32 lengths, int64 byte pointers, int64
    document indices) of a legacy index held in ``buffer``; every array is a fresh copy.

    Raises FormatError naming what was found and expected for any inconsistency."""
    if multimodal:
        raise FormatError(
            f"the {_NAME} has no sequence modes, but multimodal=True was asked",
            path=path,
            hint="open it with multimodal=None or False; only MMIDIDX files carry modes",
        )
    size = len(buffer)
    if size < LEGACY_HEADER_SIZE:
        raise _error(f"is {size} bytes, shorter than its {LEGACY_HEADER_SIZE}-byte header", path)
    _, version, code, element_size, n, s, d = LEGACY_HEADER.unpack_from(buffer)
    if version != 1:
        raise _error(f"version is {version}, expected 1", path)
    dtype = _legacy_dtype(code, element_size, dtype_codes, path)
    expected = legacy_size(n, s, d)
    if d < 1:
        raise _error("document count is 0, expected at least 1 (the leading 0 of doc_idx)", path)
    if expected != size:
        state = "truncated" if size < expected else "longer than its header says"
        raise _error(
            f"is {size} bytes, expected {expected} for {n} items, {s} sizes and {d - 1} documents "
            f"({state})",
            path,
        )
    dims, offsets, sizes, documents = _arrays(buffer, n, s, d)
    _check_flat_items(dims, n, s, path)
    lengths = _lengths(sizes, path)
    _check_offsets(offsets, lengths, path)
    _check_documents(documents, path)
    header = IndexHeader(dtype, int(code), n, d, False, index_format="TNTIDX")
    pointers = offsets[:-1] * element_size
    return header, lengths, pointers, documents.copy()


def _legacy_dtype(code: int, element_size: int, dtype_codes: str, path: str) -> np.dtype:
    """The element dtype: the code's entry in the table whose item size is the header's element
    size. Only codes 6 and 7 (floats) differ between megatron-core's and GPT-NeoX's tables, and
    there the element size tells them apart; fairseq's original 6 (float64) fits megatron-core's."""
    both = [MEGATRON_CODES, NEOX_CODES]
    tables = {"megatron": [MEGATRON_CODES], "neox": [NEOX_CODES]}.get(dtype_codes, both)
    if code not in MEGATRON_CODES:
        raise _error(f"dtype code is {code}, expected one of {sorted(MEGATRON_CODES)}", path)
    for table in tables:
        if table[code].itemsize == element_size:
            return table[code]
    names = " or ".join(f"{t[code]} ({t[code].itemsize} bytes)" for t in tables)
    raise _error(f"element size is {element_size} bytes, but dtype code {code} is {names}", path)


def _arrays(buffer: bytes | memoryview, n: int, s: int, d: int) -> tuple[np.ndarray, ...]:
    out, offset = [], LEGACY_HEADER_SIZE
    for count in (n + 1, n + 1, s, d):
        out.append(np.frombuffer(buffer, dtype="<i8", count=count, offset=offset))
        offset += 8 * count
    return tuple(out)


def _check_flat_items(dims: np.ndarray, n: int, s: int, path: str) -> None:
    """Every item must be one flat sequence (one size each): token files never hold more."""
    if s == n and np.array_equal(dims, np.arange(n + 1)):
        return
    steps = np.diff(dims)
    if s > n and int(dims[0]) == 0 and int(dims[-1]) == s and bool(np.all(steps >= 0)):
        i = int(np.flatnonzero(steps > 1)[0])
        raise FormatError(
            f"{_NAME}: item {i} has {int(steps[i])} dimensions, expected 1 (a flat token sequence)",
            path=path,
            hint="this legacy dataset holds multi-dimensional items, not token sequences; tokenload"
            " reads token files only",
        )
    raise _error(f"dim_offsets are not [0, 1, ..., {n}] for {n} items and {s} sizes", path)


def _lengths(sizes: np.ndarray, path: str) -> np.ndarray:
    """The sizes as MMIDIDX's int32 sequence lengths."""
    if sizes.size and int(sizes.min()) < 0:
        i = int(np.argmin(sizes))
        raise _error(f"sequence {i} has length {int(sizes[i])}, expected a length >= 0", path)
    if sizes.size and int(sizes.max()) > _MAX_LENGTH:
        i = int(np.argmax(sizes))
        raise _error(
            f"sequence {i} has length {int(sizes[i])}, expected at most {_MAX_LENGTH} (int32)", path
        )
    return sizes.astype(np.int32)


def _check_offsets(offsets: np.ndarray, lengths: np.ndarray, path: str) -> None:
    """Items are stored back to back: ``data_offsets`` is the running sum of the lengths."""
    expected = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, dtype=np.int64, out=expected[1:])
    bad = np.flatnonzero(offsets != expected)
    if bad.size:
        i = int(bad[0])
        raise _error(
            f"data_offsets[{i}] is {int(offsets[i])}, expected {int(expected[i])} (the sum of the"
            f" sizes before item {i}; {bad.size} offsets disagree)",
            path,
        )


def _check_documents(documents: np.ndarray, path: str) -> None:
    """``doc_idx`` never decreases (its two ends are checked by the reader, as for MMIDIDX)."""
    steps = np.diff(documents)
    if steps.size and bool(np.any(steps < 0)):
        i = int(np.flatnonzero(steps < 0)[0])
        raise _error(
            f"doc_idx decreases at document {i} ({int(documents[i])} then {int(documents[i + 1])})",
            path,
        )


def _error(message: str, path: str) -> FormatError:
    text = f"{_NAME} {message}" if message.startswith("is ") else f"{_NAME}: {message}"
    return FormatError(text, path=path, hint=_REWRITE)
