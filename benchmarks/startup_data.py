"""The blend of benchmarks/startup.py: many prefixes of real ``.idx`` files over sparse ``.bin``s.

Building Megatron's indices needs only the sequence lengths, so each token file is a complete
``.idx`` (encoded by tokenload's writer, ``format.idx.encode_index``: megatron-core's bytes) with
lognormal document lengths (sigma 1, mean about 600 tokens, one sequence per document), a sparse
``.bin`` of the right size (``truncate``: reads give zeros, no gigabytes written) and the sidecar
tokenload's writer leaves next to its files (hashes of the ``.idx`` bytes and of the ``.bin``'s
zeros). Prefix sizes vary (0.5x to 1.5x of the mean, seeded); blend weights are the prefixes'
token counts. Made once per (prefixes, documents) in ``DATA/blend_{P}x{D}/`` and reused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import xxhash

from tokenload.format import Sidecar, sidecar_path
from tokenload.format.atomic import write_bytes_atomic
from tokenload.format.idx import encode_index

MEAN_LEN = 600
DTYPE = np.dtype(np.uint16)
ZEROS = bytes(1 << 22)


def prefix_documents(prefixes: int, documents: int, seed: int = 0) -> list[int]:
    """Documents per prefix: shares drawn in [0.5, 1.5), summing to ``documents``."""
    shares = np.random.default_rng(seed).uniform(0.5, 1.5, size=prefixes)
    counts = np.floor(shares / shares.sum() * documents).astype(np.int64)
    counts[: documents - int(counts.sum())] += 1
    return [int(c) for c in counts]


def document_lengths(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mu = np.log(MEAN_LEN) - 0.5
    return np.maximum(rng.lognormal(mu, 1.0, size=n).astype(np.int64), 1).astype(np.int32)


def zeros_xxh3(nbytes: int) -> str:
    """xxh3-64 of ``nbytes`` zero bytes (the sparse ``.bin``'s content)."""
    h = xxhash.xxh3_64()
    full, rest = divmod(nbytes, len(ZEROS))
    for _ in range(full):
        h.update(ZEROS)
    h.update(ZEROS[:rest])
    return h.hexdigest()


def write_sparse_token_file(prefix: str, lengths: np.ndarray) -> None:
    """``.idx`` + sparse ``.bin`` + sidecar for single-sequence documents of ``lengths``."""
    chunks = encode_index(DTYPE, lengths, np.arange(len(lengths) + 1, dtype=np.int64))
    tokens = int(lengths.sum(dtype=np.int64))
    with open(prefix + ".bin.tmp", "wb") as f:
        f.truncate(tokens * DTYPE.itemsize)
    os.replace(prefix + ".bin.tmp", prefix + ".bin")
    idx_hash = xxhash.xxh3_64()
    for chunk in chunks:
        idx_hash.update(chunk)
    sidecar = Sidecar.describe(
        dtype=DTYPE, sequences=len(lengths), documents=len(lengths) + 1, tokens=tokens,
        bin_bytes=tokens * DTYPE.itemsize, idx_bytes=sum(len(c) for c in chunks),
        bin_xxh3=zeros_xxh3(tokens * DTYPE.itemsize), idx_xxh3=idx_hash.hexdigest(),
        tokenizer=None, metadata={"source": "benchmarks/startup_data.py (sparse .bin)"},
    )
    write_bytes_atomic(sidecar_path(prefix), sidecar.to_json().encode())
    write_bytes_atomic(prefix + ".idx", chunks)


def make_blend(data_dir: str, prefixes: int, documents: int) -> dict:
    """The blend's prefixes, weights (token counts) and Megatron sequences JSON; made once."""
    folder = Path(data_dir) / f"blend_{prefixes}x{documents}"
    manifest = folder / "blend.json"
    if manifest.exists():
        return json.loads(manifest.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    names, weights, sequences = [], [], {}
    for i, n in enumerate(prefix_documents(prefixes, documents)):
        prefix = str(folder / f"p{i:04d}")
        lengths = document_lengths(n, seed=1000 + i)
        write_sparse_token_file(prefix, lengths)
        names.append(prefix)
        weights.append(int(lengths.sum(dtype=np.int64)))
        sequences[prefix] = [n, n + 1]
    seq_path = folder / "sequences-megatron.json"
    seq_path.write_text(json.dumps(sequences))
    blend = {"prefixes": names, "weights": weights, "documents": documents,
             "tokens": int(sum(weights)), "megatron_sequences": str(seq_path)}
    manifest.write_text(json.dumps(blend))
    return blend
