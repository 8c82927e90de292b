"""Small writers of the files GPT-NeoX produces, following the byte layouts of the spec
(../shared/spec/megatron.md §1.1 and §1.6), written independently of tokenload's writer so that
the reader is tested against the layout, not against itself.

``write_tntidx``: the legacy fairseq "cached/lazy" index (GPT-NeoX's ``IndexedDatasetBuilder``).
``write_neox_mmidx``: GPT-NeoX's MMIDIDX (dtype codes 6/7 swapped against megatron-core's).
A document is a list of sequences, a sequence a list of token ids.
"""

from __future__ import annotations

import struct

import numpy as np

NEOX_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float32: 6, np.float64: 7,
              np.uint16: 8}


def _flatten(documents, dtype):
    sequences = [np.asarray(seq, dtype=dtype) for doc in documents for seq in doc]
    ends = np.cumsum([0] + [len(doc) for doc in documents])
    return sequences, ends


def tntidx_bytes(documents, dtype=np.int32, *, doc_idx=None, code=None, element_size=None) -> tuple[bytes, bytes]:
    """(.idx, .bin) bytes of a legacy index: header, dim_offsets, data_offsets (elements), sizes, doc_idx."""
    sequences, ends = _flatten(documents, dtype)
    doc_idx = ends if doc_idx is None else np.asarray(doc_idx)
    n = len(sequences)
    sizes = np.array([s.size for s in sequences], dtype="<i8")
    data_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype("<i8")
    dim_offsets = np.arange(n + 1, dtype="<i8")
    item = np.dtype(dtype).itemsize
    head = b"TNTIDX\x00\x00" + struct.pack(
        "<QQQQQQ", 1, NEOX_CODES[dtype] if code is None else code, item if element_size is None else element_size,
        n, n, len(doc_idx)
    )
    arrays = (dim_offsets, data_offsets, sizes, np.asarray(doc_idx, "<i8"))
    idx = head + b"".join(a.tobytes() for a in arrays)
    data = b"".join(s.astype(np.dtype(dtype).newbyteorder("<")).tobytes() for s in sequences)
    return idx, data


def write_tntidx(prefix, documents, dtype=np.int32, **fields) -> str:
    idx, data = tntidx_bytes(documents, dtype, **fields)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(idx)
    with open(f"{prefix}.bin", "wb") as f:
        f.write(data)
    return str(prefix)


def write_neox_mmidx(prefix, documents, dtype, *, doc_idx=None) -> str:
    """GPT-NeoX's MMIDIDX: 34-byte header with NeoX's dtype code, int32 lengths, int64 byte
    pointers, int64 document indices (``[0]`` after NeoX's merge)."""
    sequences, ends = _flatten(documents, dtype)
    doc_idx = ends if doc_idx is None else np.asarray(doc_idx)
    lengths = np.array([s.size for s in sequences], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]) * np.dtype(dtype).itemsize
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, NEOX_CODES[dtype], len(sequences), len(doc_idx))
    with open(f"{prefix}.idx", "wb") as f:
        f.write(head + lengths.tobytes() + pointers[: len(sequences)].astype("<i8").tobytes()
                + np.asarray(doc_idx, "<i8").tobytes())
    with open(f"{prefix}.bin", "wb") as f:
        f.write(b"".join(s.tobytes() for s in sequences))
    return str(prefix)
