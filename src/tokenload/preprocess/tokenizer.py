"""Tokenizers for preprocess: one batch interface over every kind, and their identity.

Every tokenizer encodes a batch of texts into one flat id array plus one length per text, so the
pipeline never holds a Python list per document longer than the encoder itself does. The
built-in byte-level tokenizer needs no files: ids are the UTF-8 bytes (0..255) and EOD is 256, so
its vocabulary of 257 fits uint16. The other kinds live in ``backends`` (native encoders) and
``fast`` (gigatoken in their place); ``load`` picks one. Imports run one way: ``tokenizer`` <-
``backends`` <- ``fast`` <- ``load``, so this module never imports the others.

A tokenizer's identity (kind, files and their xxh3-64 hashes, vocabulary size, EOD id, options
that change ids) goes into each output's sidecar; the engine that produced the ids does not,
since it never changes them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..format import file_xxh3, optimal_dtype

log = logging.getLogger(__name__)

#: Texts on which gigatoken must reproduce the native encoder exactly before it is used.
PROBE_TEXTS = (
    "",
    " ",
    "Hello, world! It's a test -- don't panic.",
    "  leading and trailing spaces  ",
    "line one\nline two\r\n\ttabbed\n\n\nblank lines",
    "numbers 1 12 123 1234 12345 3.14159 1e-9 0x1F",
    "héllo wörld ñ ß Æ ø; 日本語のテキスト; 中文; 한국어; Ελληνικά; русский",
    "emoji 🙂👍🏽 and symbols ©®™ € £ ¥ ← → ∑ ∫",
    "CamelCaseWord snake_case_word kebab-case-word UPPER lower MiXeD",
    "def f(x):\n    return x ** 2  # comment\n",
    "    deeply   spaced     words\u00a0nbsp\u2028sep",
    "a" * 300 + " " + "ab" * 200,
    "<|endoftext|> <s> </s> [CLS] special-looking text",
)


class TextTokenizer:
    """Batch text -> ids. Subclasses set the attributes and implement ``encode_batch``."""

    kind: str = ""
    engine: str = ""
    vocab_size: int = 0
    eod_id: int | None = None
    #: whether encode_batch spends its time outside the GIL (threads then scale)
    releases_gil: bool = True
    files: tuple[str, ...] = ()
    options: dict[str, Any] = {}  # noqa: RUF012 (a default each tokenizer replaces, never mutates)

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode ``texts``: (all ids concatenated, int64 length per text)."""
        raise NotImplementedError

    def encode_documents(
        self, texts: list[str], eod: int | None, dtype: np.dtype
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """One document per text, already laid out (tokens in ``dtype``, int32 sequence lengths,
        int32 sequences per document), exactly as ``encode.layout_documents`` lays out
        ``encode_batch``'s output; None where this tokenizer has no such path (the caller then
        takes the general one). An implementation may empty ``texts``, but only when it
        returns a result or raises."""
        return None

    @property
    def dtype(self) -> np.dtype:
        """Token dtype: Megatron's rule on the vocabulary size."""
        return optimal_dtype(self.vocab_size)

    def identity(self) -> dict[str, Any]:
        """What the sidecar records about this tokenizer (deterministic; no engine, no time)."""
        files = [{"path": f, "xxh3_64": _path_hash(f)} for f in self.files]
        out: dict[str, Any] = {
            "name": self.kind if not self.files else f"{self.kind}:{Path(self.files[0]).name}",
            "kind": self.kind,
            "vocab_size": int(self.vocab_size),
            "eod_id": None if self.eod_id is None else int(self.eod_id),
        }
        if files:
            out["file"] = files[0]["path"]
            out["xxh3_64"] = files[0]["xxh3_64"]
            out["files"] = files
        if self.options:
            out["options"] = dict(self.options)
        return out


class ByteTokenizer(TextTokenizer):
    """UTF-8 bytes as ids (0..255), EOD 256, vocabulary 257 (uint16); needs no files."""

    kind = "byte"
    engine = "numpy"
    vocab_size = 257

    def __init__(self, eod_id: int | None = None) -> None:
        self.eod_id = 256 if eod_id is None else eod_id
        if self.eod_id < 256:
            raise ConfigError(
                f"the byte tokenizer's EOD id {self.eod_id} collides with a byte value",
                hint="use an EOD id of 256 or more (default 256)",
            )
        self.vocab_size = max(257, self.eod_id + 1)
        self.options = {} if eod_id is None else {"eod_id": eod_id}

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encoded = [t.encode("utf-8") for t in texts]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        return np.frombuffer(b"".join(encoded), dtype=np.uint8), lengths


def id_beyond_dtype(top: int, dtype: np.dtype) -> ConfigError:
    """The error for a token id ``top`` the output dtype cannot hold."""
    return ConfigError(
        f"token id {top} does not fit the output dtype {dtype}",
        hint="the tokenizer produced an id beyond its stated vocabulary size",
    )


def _path_hash(path: str) -> str:
    """xxh3-64 of a file, or of a folder's tokenizer files (names and contents, sorted)."""
    p = Path(path)
    if not p.is_dir():
        return file_xxh3(path)
    import xxhash

    h = xxhash.xxh3_64()
    for entry in sorted(p.iterdir()):
        if entry.is_file() and _is_tokenizer_file(entry.name):
            h.update(entry.name.encode() + b"\0" + file_xxh3(str(entry)).encode() + b"\0")
    return h.hexdigest()


def _is_tokenizer_file(name: str) -> bool:
    weights = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".gguf", ".ckpt")
    return not name.startswith(".") and not name.endswith(weights)
