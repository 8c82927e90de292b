"""The ``PREFIX.json`` sidecar: what a token file holds and how it was made.

Megatron's files carry no such record, so reading never requires it. When present it names the
tokenizer (for cache identity and ``verify --vocab-size``), the counts, and an xxh3-64 hash of
each file, so ``verify --hashes`` and stale-cache detection need not trust modification times.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import FormatError
from ..storage.os_errors import read_error
from .idx import prefix_of

logger = logging.getLogger(__name__)

FORMAT_NAME = "tokenload-token-file"
FORMAT_VERSION = 1


def sidecar_path(prefix: str | os.PathLike[str]) -> str:
    """Where the sidecar of ``prefix`` (or of ``PREFIX.bin``/``PREFIX.idx``) lives."""
    return prefix_of(prefix) + ".json"


@dataclass(frozen=True, kw_only=True)
class Sidecar:
    """Contents of a token file's sidecar."""

    format: str = FORMAT_NAME
    """Always ``tokenload-token-file``."""
    version: int = FORMAT_VERSION
    """Sidecar schema version."""
    dtype: str
    """Token dtype name (``uint16`` or ``int32``)."""
    sequences: int
    """Number of sequences."""
    documents: int
    """Number of documents."""
    tokens: int
    """Number of tokens."""
    bin_bytes: int
    """Size of ``.bin`` in bytes."""
    idx_bytes: int
    """Size of ``.idx`` in bytes."""
    hashes: dict[str, dict[str, str]]
    """``{"bin": {"xxh3_64": hex}, "idx": {"xxh3_64": hex}}``."""
    tokenizer: dict[str, Any] | None = None
    """Tokenizer identity (name, file hash, vocab size, eod id) when known."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Anything else the producer records (preprocess: inputs, skipped records by reason)."""

    @classmethod
    def describe(
        cls,
        *,
        dtype: np.dtype,
        sequences: int,
        documents: int,
        tokens: int,
        bin_bytes: int,
        idx_bytes: int,
        bin_xxh3: str,
        idx_xxh3: str,
        tokenizer: dict[str, Any] | None,
        metadata: dict[str, Any],
    ) -> Sidecar:
        return cls(
            dtype=np.dtype(dtype).name,
            sequences=sequences,
            documents=documents,
            tokens=tokens,
            bin_bytes=bin_bytes,
            idx_bytes=idx_bytes,
            hashes={"bin": {"xxh3_64": bin_xxh3}, "idx": {"xxh3_64": idx_xxh3}},
            tokenizer=tokenizer,
            metadata=metadata,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, path: str = "<sidecar>") -> Sidecar:
        """Parse a sidecar; FormatError when it claims to be one but is malformed."""
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT_NAME:
                raise ValueError(f"format is {data.get('format')!r}, expected {FORMAT_NAME!r}")
            return cls(**data)
        except (ValueError, TypeError, AttributeError) as exc:
            raise FormatError(
                f"sidecar is not a valid tokenload sidecar ({exc})",
                path=path,
                hint="delete the .json sidecar (reading never needs it) or rewrite the token file",
            ) from None


def read_sidecar(prefix: str | os.PathLike[str]) -> Sidecar | None:
    """The sidecar of ``prefix``, or None when there is none.

    A ``PREFIX.json`` that is not a tokenload sidecar (another tool's file of the same name) is
    ignored, since reading never needs a sidecar; one that says it is ours but is malformed
    raises FormatError.
    """
    path = sidecar_path(prefix)
    raw = _read_remote(path) if "://" in path else _read_local(path)
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
        claims_ours = json.loads(text).get("format") == FORMAT_NAME
    except (ValueError, AttributeError):
        claims_ours = False
    if not claims_ours:
        logger.debug("%s is not a tokenload sidecar; ignoring it", path)
        return None
    return Sidecar.from_json(text, path)


def _read_local(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise read_error(exc, path, "the sidecar") from None


def _read_remote(url: str) -> bytes | None:
    """The sidecar object's bytes (one GET, retried), or None when the bucket has none."""
    from ..storage.upload import read_object

    return read_object(url)
