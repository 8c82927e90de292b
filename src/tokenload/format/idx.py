"""The ``.idx`` index of a Megatron-LM token file (``MMIDIDX`` version 1), bytes in and out.

Layout (little-endian, no alignment padding): a 34-byte header (9-byte magic, u64 version = 1,
u8 dtype code, u64 sequence count N, u64 document count D+1), then int32 ``sequence_lengths[N]``,
int64 ``sequence_pointers[N]`` (byte offsets into ``.bin``), int64 ``document_indices[D+1]``, and
for multimodal files int8 ``sequence_modes[N]``. The arrays are exposed as zero-copy views of
whatever buffer holds the file (an mmap, or bytes read into memory).

Opening checks only what is O(1) (header fields and the file size the header implies), so a rank
at scale pays nothing per sequence; ``check_arrays`` does the O(N) structural checks for ``verify``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..errors import FormatError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = 34
_HEADER = struct.Struct("<9sQBQQ")

DtypeCodes = Literal["auto", "megatron", "neox"]
"""Which dtype-code table a header is read with. "auto": megatron-core's, except that a float code
(6 or 7, the only codes the tables disagree on) takes the float type whose item size fits the
``.bin`` size, so GPT-NeoX's files read right too."""

#: megatron-core's DType enum (since Sep 2023). GPT-NeoX swaps 6 and 7 (float32/float64).
MEGATRON_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
NEOX_CODES: dict[int, np.dtype] = {
    **MEGATRON_CODES,
    6: np.dtype(np.float32),
    7: np.dtype(np.float64),
}
_TABLES = {"auto": MEGATRON_CODES, "megatron": MEGATRON_CODES, "neox": NEOX_CODES}
FLOAT_CODES = (6, 7)


def prefix_of(path: str | os.PathLike[str]) -> str:
    """The token file prefix named by ``path``: ``PREFIX``, ``PREFIX.bin`` and ``PREFIX.idx`` all
    name the same pair, so every command accepts whichever a user tab-completes."""
    text = os.fspath(path)
    for ext in (".bin", ".idx"):
        if text.endswith(ext):
            return text[: -len(ext)]
    return text


def code_table(dtype_codes: DtypeCodes) -> dict[int, np.dtype]:
    """The dtype-code table of ``dtype_codes`` ("auto" starts from megatron-core's)."""
    try:
        return _TABLES[dtype_codes]
    except KeyError:
        raise ValueError(
            f"dtype_codes must be 'auto', 'megatron' or 'neox', got {dtype_codes!r}"
        ) from None


def dtype_code(dtype: np.dtype | type | str) -> int:
    """Megatron's dtype code for ``dtype`` (the code a writer puts in the header)."""
    dt = np.dtype(dtype)
    for code, known in MEGATRON_CODES.items():
        if known == dt:
            return code
    raise ValueError(f"no Megatron dtype code for {dt}; token files hold uint16 or int32 tokens")


def optimal_dtype(vocab_size: int) -> np.dtype:
    """Megatron's writer rule: uint16 when ``vocab_size < 65500``, else int32."""
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


@dataclass(frozen=True)
class IndexHeader:
    """The fixed fields of an ``.idx`` file and the sizes they imply."""

    dtype: np.dtype
    """Token dtype of the ``.bin`` file."""
    code: int
    """The dtype code byte as stored."""
    sequence_count: int
    """N, the number of sequences."""
    document_count: int
    """D + 1, the length of ``document_indices`` (includes the leading 0)."""
    multimodal: bool
    """Whether an int8 ``sequence_modes`` array follows the document indices."""
    index_format: str = "MMIDIDX"
    """"MMIDIDX", or "TNTIDX" for the legacy fairseq cached/lazy index (``legacy.py``)."""

    @property
    def size(self) -> int:
        """Exact size in bytes of the MMIDIDX ``.idx`` these counts make (for a TNTIDX file: the
        size ``tokenload convert`` writes)."""
        n, d = self.sequence_count, self.document_count
        return HEADER_SIZE + 12 * n + 8 * d + (n if self.multimodal else 0)


def parse_header(
    head: bytes,
    file_size: int,
    path: str,
    *,
    dtype_codes: DtypeCodes = "megatron",
    multimodal: bool | None = None,
) -> IndexHeader:
    """Decode and check the 34-byte header against the file size.

    ``multimodal=None`` infers the presence of the modes array from the file size.
    Raises FormatError for a short file, wrong magic or version, unknown dtype code, or a size
    that disagrees with the counts.
    """
    if len(head) < HEADER_SIZE:
        raise FormatError(
            f"index is {file_size} bytes, shorter than the {HEADER_SIZE}-byte MMIDIDX header",
            path=path,
            hint="the file is truncated or not a Megatron .idx; rewrite it (tokenload preprocess "
            "or merge)",
        )
    magic, version, code, n, d = _HEADER.unpack_from(head)
    if magic != MAGIC:
        raise FormatError(
            f"index magic is {magic!r}, expected {MAGIC!r} (Megatron MMIDIDX)",
            path=path,
            hint="this is not a Megatron/GPT-NeoX mmap .idx file; check the path prefix",
        )
    if version != VERSION:
        raise FormatError(
            f"index version is {version}, expected {VERSION}",
            path=path,
            hint="only MMIDIDX version 1 exists; the header is corrupt, rewrite the file",
        )
    table = code_table(dtype_codes)
    if code not in table:
        raise FormatError(
            f"dtype code is {code}, expected one of {sorted(table)}",
            path=path,
            hint="the header is corrupt; rewrite the file",
        )
    return _sized_header(table[code], code, n, d, file_size, path, multimodal)


def _sized_header(
    dtype: np.dtype,
    code: int,
    n: int,
    d: int,
    file_size: int,
    path: str,
    multimodal: bool | None,
) -> IndexHeader:
    if d < 1:
        raise FormatError(
            "document count is 0, expected at least 1 (the leading 0 of document_indices)",
            path=path,
            hint="the header is corrupt; rewrite the file",
        )
    plain = IndexHeader(dtype, code, n, d, False)
    modal = IndexHeader(dtype, code, n, d, True)
    if multimodal is None:
        candidates = [plain, modal] if n else [plain]
    else:
        candidates = [modal if multimodal else plain]
    for header in candidates:
        if header.size == file_size:
            return header
    expected = " or ".join(str(h.size) for h in candidates)
    state = "truncated" if file_size < candidates[0].size else "longer than its header says"
    raise FormatError(
        f"index is {file_size} bytes, expected {expected} for {n} sequences and {d - 1} documents"
        f" ({state})",
        path=path,
        hint="the .idx was cut short or corrupted; rewrite it from the source data",
    )


def resolve_float_dtype(header: IndexHeader, lengths: np.ndarray, bin_size: int) -> IndexHeader:
    """For "auto": the header with the float type (32 or 64 bits) whose item size makes the
    lengths fill ``bin_size`` exactly; unchanged when neither or both do (no tokens at all).

    Codes 6 and 7 mean float64 and float32 in megatron-core and the reverse in GPT-NeoX; no token
    file uses them, so the O(N) sum of lengths this costs is paid only by such unusual files."""
    if header.code not in FLOAT_CODES:
        return header
    tokens = int(lengths.sum(dtype=np.int64))
    if tokens <= 0 or bin_size % tokens:
        return header
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        if dtype.itemsize * tokens == bin_size:
            return replace(header, dtype=dtype)
    return header


def code_note(header: IndexHeader) -> str | None:
    """Which table a float code was read with, when the two tables disagree on it."""
    if header.code not in FLOAT_CODES:
        return None
    table = "megatron-core's" if MEGATRON_CODES[header.code] == header.dtype else "GPT-NeoX's"
    return (
        f"dtype code {header.code} read as {header.dtype} ({table} table; code {header.code} is"
        f" {MEGATRON_CODES[header.code]} in megatron-core's and {NEOX_CODES[header.code]} in "
        "GPT-NeoX's); not a token file: verify fails it and the loaders refuse it"
    )


TOKEN_CODES = tuple(code for code, dtype in MEGATRON_CODES.items() if dtype.kind in "iu")
"""The dtype codes of token files: the integer types (a float is never a token id)."""


def check_token_dtype(header: IndexHeader, path: str) -> None:
    """A FormatError unless ``header``'s dtype is an integer type: a float code (6 or 7) is a data
    file of floats, or a damaged code byte over integer tokens (int32 data under code 7 has the
    right size for float32 and would be read as floats); either way not a token file."""
    if header.dtype.kind in "iu":
        return
    names = ", ".join(f"{c} {MEGATRON_CODES[c]}" for c in TOKEN_CODES)
    raise FormatError(
        f"dtype code {header.code} means {header.dtype}, which is not a token dtype; expected an"
        f" integer code ({names})",
        path=path,
        hint="token files hold integer token ids; if this file's tokens are integers its header"
        " is damaged (its sidecar, when there is one, records the dtype): rewrite it from the"
        " source data with `tokenload preprocess`; `tokenload info` still describes it",
    )


def index_arrays(
    buffer: bytes | memoryview, header: IndexHeader
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Zero-copy (lengths, pointers, document_indices, modes) views over the whole file buffer."""
    n, d = header.sequence_count, header.document_count
    off = HEADER_SIZE
    lengths = np.frombuffer(buffer, dtype=np.int32, count=n, offset=off)
    off += 4 * n
    pointers = np.frombuffer(buffer, dtype=np.int64, count=n, offset=off)
    off += 8 * n
    documents = np.frombuffer(buffer, dtype=np.int64, count=d, offset=off)
    off += 8 * d
    modes = np.frombuffer(buffer, dtype=np.int8, count=n, offset=off) if header.multimodal else None
    return lengths, pointers, documents, modes


def sequence_pointers(lengths: np.ndarray, itemsize: int) -> np.ndarray:
    """Byte offset of each sequence in ``.bin``: sequences are stored back to back."""
    pointers = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
    pointers *= itemsize
    return pointers


def encode_index(
    dtype: npt.DTypeLike,
    lengths: np.ndarray,
    documents: np.ndarray,
    modes: np.ndarray | None = None,
) -> list[bytes]:
    """The ``.idx`` file as a list of byte chunks; pointers are derived from the lengths."""
    dtype = np.dtype(dtype)
    lengths = np.ascontiguousarray(lengths, dtype=np.int32)
    documents = np.ascontiguousarray(documents, dtype=np.int64)
    pointers = sequence_pointers(lengths, dtype.itemsize)
    chunks = [
        _HEADER.pack(MAGIC, VERSION, dtype_code(dtype), len(lengths), len(documents)),
        lengths.tobytes(),
        pointers.tobytes(),
        documents.tobytes(),
    ]
    if modes is not None:
        chunks.append(np.ascontiguousarray(modes, dtype=np.int8).tobytes())
    return chunks


def check_arrays(
    header: IndexHeader,
    lengths: np.ndarray,
    pointers: np.ndarray,
    documents: np.ndarray,
    bin_size: int,
) -> list[str]:
    """The O(N) structural invariants; returns one message per violated invariant."""
    problems: list[str] = []
    n, itemsize = header.sequence_count, header.dtype.itemsize
    if n and int(lengths.min()) < 0:
        problems.append(
            f"sequence {int(np.argmin(lengths))} has negative length {int(lengths.min())}"
        )
    if n:
        expected = sequence_pointers(lengths, itemsize)
        bad = np.flatnonzero(pointers != expected)
        if bad.size:
            i = int(bad[0])
            problems.append(
                f"{bad.size} sequence pointers disagree with the lengths; first at sequence {i}:"
                f" {int(pointers[i])}, expected {int(expected[i])}"
            )
    total = int(lengths.sum(dtype=np.int64)) * itemsize
    if total != bin_size:
        problems.append(f".bin is {bin_size} bytes, the lengths sum to {total} bytes")
    if int(documents[0]) != 0:
        problems.append(f"document_indices[0] is {int(documents[0])}, expected 0")
    if int(documents[-1]) != n:
        problems.append(
            f"document_indices[-1] is {int(documents[-1])}, expected the sequence count {n}"
        )
    if documents.size > 1 and bool(np.any(np.diff(documents) < 0)):
        i = int(np.flatnonzero(np.diff(documents) < 0)[0])
        problems.append(f"document_indices decrease at document {i}")
    return problems
