"""Write Megatron-LM token files (``PREFIX.bin`` + ``PREFIX.idx``), byte-identical to
megatron-core's ``IndexedDatasetBuilder`` for the same documents, plus the ``PREFIX.json`` sidecar.

Tokens stream to a temporary ``.bin`` as they arrive (hashed on the way with xxh3-64, so nothing is
read twice); sequence lengths and document boundaries stay in compact typed arrays (4 bytes per
sequence, 8 per document). ``finalize`` writes the ``.idx`` and the sidecar, then renames in the
order that never shows a valid-looking pair before both are complete: old ``.idx`` removed, new
``.bin`` renamed, new ``.idx`` renamed, sidecar renamed last.
"""

from __future__ import annotations

import os
from array import array
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import xxhash

from ..errors import ConfigError, FormatError
from .atomic import require_folder, temp_path, write_bytes_atomic
from .idx import dtype_code, encode_index
from .sidecar import Sidecar, sidecar_path

_COPY_CHUNK = 64 << 20


class TokenFileWriter:
    """Builds one token file pair; use as a context manager or call ``finalize``/``abort``.

    ``add_document(tokens, lengths)`` writes a document of one or more sequences (``lengths``
    defaults to one sequence); ``add_item`` + ``end_document`` build one sequence at a time;
    ``add_documents`` writes many single-sequence documents from one flat array;
    ``append`` copies a whole existing token file (Megatron's ``add_index``).
    """

    def __init__(
        self,
        prefix: str | os.PathLike[str],
        dtype: np.dtype | type | str = np.int32,
        *,
        multimodal: bool = False,
        tokenizer: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.prefix = os.fspath(prefix)
        self.dtype = np.dtype(dtype)
        dtype_code(self.dtype)  # reject dtypes Megatron has no code for, before writing anything
        self.multimodal = multimodal
        self.tokenizer = tokenizer
        self.metadata = dict(metadata or {})
        require_folder(self.prefix)
        self._bin_tmp = temp_path(self.prefix + ".bin")
        self._bin = open(self._bin_tmp, "wb")
        self._hash = xxhash.xxh3_64()
        self._lengths = array("i")
        self._documents = array("q", [0])
        self._modes = array("b")
        self._tokens = 0
        self._closed = False

    # -- writing -------------------------------------------------------------------------------
    def _write(self, tokens: np.ndarray) -> None:
        data = np.ascontiguousarray(tokens, dtype=self.dtype).data
        self._bin.write(data)
        self._hash.update(data)

    def add_item(self, tokens: Iterable[int] | np.ndarray, mode: int = 0) -> None:
        """Write one sequence without closing the current document."""
        self._check_open()
        arr = np.asarray(tokens)
        self._write(arr)
        self._lengths.append(arr.size)
        self._tokens += arr.size
        if self.multimodal:
            self._modes.append(mode)

    def end_document(self) -> None:
        """Close the current document at the sequences written so far."""
        self._check_open()
        self._documents.append(len(self._lengths))

    def add_document(
        self,
        tokens: Iterable[int] | np.ndarray,
        lengths: Iterable[int] | None = None,
        modes: Iterable[int] | None = None,
    ) -> None:
        """Write one document: ``tokens`` split into sequences of ``lengths`` (default: one)."""
        self._check_open()
        arr = np.asarray(tokens)
        lens = np.array([arr.size] if lengths is None else list(lengths), dtype=np.int64)
        if int(lens.sum()) != arr.size or (lens.size and int(lens.min()) < 0):
            raise ConfigError(
                f"document has {arr.size} tokens but its sequence lengths {lens.tolist()} sum to"
                f" {int(lens.sum())}",
                path=self.prefix,
                hint="pass lengths that partition the document's tokens",
            )
        self._write(arr)
        self._lengths.frombytes(lens.astype(np.int32).tobytes())
        self._tokens += arr.size
        if self.multimodal:
            self._modes.extend([0] * lens.size if modes is None else list(modes))
        self._documents.append(len(self._lengths))

    def add_documents(self, tokens: np.ndarray, document_lengths: np.ndarray) -> None:
        """Write many documents of one sequence each: ``tokens`` is their concatenation."""
        self._check_open()
        tokens = np.asarray(tokens)
        lens = np.asarray(document_lengths, dtype=np.int64)
        if int(lens.sum()) != tokens.size:
            raise ConfigError(
                f"{tokens.size} tokens given but the document lengths sum to {int(lens.sum())}",
                path=self.prefix,
                hint="document_lengths must partition the token array",
            )
        self._write(tokens)
        start = len(self._lengths)
        self._lengths.frombytes(lens.astype(np.int32).tobytes())
        self._documents.frombytes(np.arange(start + 1, start + 1 + lens.size, dtype=np.int64).tobytes())
        self._tokens += tokens.size
        if self.multimodal:
            self._modes.extend([0] * lens.size)

    def append(self, source) -> None:
        """Append every document of another token file (Megatron ``add_index``); same dtype only."""
        from .reader import TokenFile

        self._check_open()
        other = source if isinstance(source, TokenFile) else TokenFile(source, mode="pread")
        if other.dtype != self.dtype:
            raise ConfigError(
                f"cannot append {other.prefix!r}: its dtype is {other.dtype}, this file's is {self.dtype}",
                path=self.prefix,
                hint="merge only token files made with the same tokenizer (same vocabulary size)",
            )
        offset = len(self._lengths)
        self._lengths.frombytes(np.ascontiguousarray(other.sequence_lengths).tobytes())
        docs = np.asarray(other.document_indices[1:], dtype=np.int64) + offset
        self._documents.frombytes(docs.tobytes())
        if self.multimodal:
            modes = other.sequence_modes
            self._modes.frombytes((np.zeros(other.num_sequences, np.int8) if modes is None else modes).tobytes())
        with open(other.bin_path, "rb") as src:
            while chunk := src.read(_COPY_CHUNK):
                self._bin.write(chunk)
                self._hash.update(chunk)
        self._tokens += other.num_tokens

    # -- finishing -----------------------------------------------------------------------------
    @property
    def num_sequences(self) -> int:
        return len(self._lengths)

    @property
    def num_documents(self) -> int:
        return len(self._documents) - 1

    @property
    def num_tokens(self) -> int:
        return self._tokens

    def finalize(self) -> Sidecar:
        """Write the ``.idx`` and sidecar and publish all three files; returns the sidecar."""
        self._check_open()
        self._closed = True
        try:
            self._bin.flush()
            os.fsync(self._bin.fileno())
            self._bin.close()
            modes = np.frombuffer(self._modes, dtype=np.int8) if self.multimodal else None
            chunks = encode_index(
                self.dtype,
                np.frombuffer(self._lengths, dtype=np.int32),
                np.frombuffer(self._documents, dtype=np.int64),
                modes,
            )
            idx_hash = xxhash.xxh3_64()
            for chunk in chunks:
                idx_hash.update(chunk)
            sidecar = Sidecar.describe(
                dtype=self.dtype,
                sequences=self.num_sequences,
                documents=self.num_documents,
                tokens=self._tokens,
                bin_bytes=self._tokens * self.dtype.itemsize,
                idx_bytes=sum(len(c) for c in chunks),
                bin_xxh3=self._hash.hexdigest(),
                idx_xxh3=idx_hash.hexdigest(),
                tokenizer=self.tokenizer,
                metadata=self.metadata,
            )
            self._publish(chunks, sidecar)
            return sidecar
        except BaseException:
            self._bin_tmp.unlink(missing_ok=True)
            raise

    def _publish(self, idx_chunks: list[bytes], sidecar: Sidecar) -> None:
        idx_path = self.prefix + ".idx"
        idx_tmp = temp_path(idx_path)
        try:
            with open(idx_tmp, "wb") as f:
                for chunk in idx_chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            # An old .idx beside a new .bin (or the reverse) could look valid: remove it first.
            Path(idx_path).unlink(missing_ok=True)
            Path(sidecar_path(self.prefix)).unlink(missing_ok=True)
            os.replace(self._bin_tmp, self.prefix + ".bin")
            os.replace(idx_tmp, idx_path)
        finally:
            idx_tmp.unlink(missing_ok=True)
        # renamed last; its folder sync also makes the .bin and .idx renames durable
        write_bytes_atomic(sidecar_path(self.prefix), sidecar.to_json().encode())

    def abort(self) -> None:
        """Discard everything written; no file appears."""
        if not self._closed:
            self._closed = True
            self._bin.close()
            self._bin_tmp.unlink(missing_ok=True)

    def _check_open(self) -> None:
        if self._closed:
            raise FormatError(
                "the writer is already finalized or aborted",
                path=self.prefix,
                hint="create a new TokenFileWriter for another file",
            )

    def __enter__(self) -> "TokenFileWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            if not self._closed:
                self.finalize()
        else:
            self.abort()

    def __del__(self) -> None:
        try:
            self.abort()
        except Exception:
            pass

