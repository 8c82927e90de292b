"""Preprocess: raw text (JSONL, parquet, plain text; local or fsspec URLs) -> Megatron token files.

``preprocess(PreprocessConfig(...))`` runs a job; see ``pipeline`` for how it parallelises,
stays deterministic and resumes, ``records`` for Megatron-LM's document rules and the bad-record
reasons, ``tokenizer``/``backends`` for the tokenizer kinds, and ``corpus`` for the sample corpus.
"""

from __future__ import annotations

from .config import PreprocessConfig, TokenizerSpec, canonical_kind, shard_from_environment
from .corpus import CorpusSummary, write_stdlib_corpus
from .inputs import InputFile, expand_inputs, shard_files
from .load import load_tokenizer
from .pipeline import PreprocessResult, preprocess
from .tokenizer import ByteTokenizer, TextTokenizer

__all__ = [
    "ByteTokenizer",
    "CorpusSummary",
    "InputFile",
    "PreprocessConfig",
    "PreprocessResult",
    "TextTokenizer",
    "TokenizerSpec",
    "canonical_kind",
    "expand_inputs",
    "load_tokenizer",
    "preprocess",
    "shard_files",
    "shard_from_environment",
    "write_stdlib_corpus",
]
