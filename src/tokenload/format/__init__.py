"""Token files on disk: Megatron ``.bin/.idx`` (read and write; GPT-NeoX's legacy TNTIDX index
read and converted), flat nanoGPT ``.bin`` (read), the sidecar manifest, Megatron's sequences
JSON, merge, describe and verify."""

from __future__ import annotations

from typing import Any

from .bin import ReadMode, warmup_file
from .descriptors import max_open_files, set_max_open_files
from .flat_file import FlatTokenFile, write_flat
from .idx import IndexHeader, dtype_code, optimal_dtype
from .inspect import Verification, check_file, describe, document_token_counts, file_xxh3, verify
from .merge import convert_token_file, merge_token_files, prefixes_in
from .reader import TokenFile
from .sequences import SequenceCounts, SequencesFile, read_sequences, write_sequences
from .sidecar import Sidecar, read_sidecar, sidecar_path
from .writer import TokenFileWriter

__all__ = [
    "FlatTokenFile",
    "IndexHeader",
    "ReadMode",
    "SequenceCounts",
    "SequencesFile",
    "Sidecar",
    "TokenFile",
    "TokenFileWriter",
    "Verification",
    "check_file",
    "convert_token_file",
    "describe",
    "document_token_counts",
    "dtype_code",
    "file_xxh3",
    "max_open_files",
    "merge_token_files",
    "open_token_file",
    "optimal_dtype",
    "prefixes_in",
    "read_sequences",
    "read_sidecar",
    "set_max_open_files",
    "sidecar_path",
    "verify",
    "warmup_file",
    "write_flat",
    "write_sequences",
]


def open_token_file(prefix: str, **options: Any) -> TokenFile:
    """Open ``prefix`` (lazily) with ``TokenFile`` options: mode, dtype_codes, multimodal, warmup,
    sequences, dtype, sequences_path."""
    return TokenFile(prefix, **options)
