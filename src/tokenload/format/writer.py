"""Write Megatron-LM token files (``PREFIX.bin`` + ``PREFIX.idx``), byte-identical to
megatron-core's ``IndexedDatasetBuilder`` for the same documents, plus the ``PREFIX.json`` sidecar.

Tokens stream to a temporary ``.bin`` as they arrive (hashed on the way with xxh3-64, so nothing is
read twice); sequence lengths and document boundaries stay in compact typed arrays (4 bytes per
sequence, 8 per document). A token that the file's dtype cannot hold is refused, never wrapped.
``finalize`` writes the ``.idx`` and the sidecar to temporaries too, and only when all three are on
disk replaces the old output, in the order that never shows a ``.bin`` and an ``.idx`` of different
writes as a pair (docs/FORMAT.md, "Writing", lists what a kill at each step leaves). A full disk or
an unwritable folder is a StorageError, and the temporaries are removed.

A *staged* writer (``staged=PATH``) writes its ``.bin`` at a name its caller chose instead
(preprocess: the output written once, in its work folder), which ``abort`` keeps, so that a caller
that recorded how much of it is finished can reopen it (``kept=``: the index of the finished part;
the rest is cut off and the kept bytes hashed again). ``mark``/``rollback`` take it back to an
earlier point, ``sync`` makes what is written durable, ``index_since`` gives the index of what came
after a mark. ``finalize`` moves it beside the output under a temporary name just before the usual
publish, so the output appears exactly as from any other writer.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import xxhash

from ..errors import ConfigError, FormatError
from ..storage.os_errors import read_error, write_error
from .atomic import (
    close_quietly,
    create_temp,
    discard,
    fsync_dir,
    ready_path,
    replace,
    require_folder,
    sync_file,
    temp_path,
    write_temp,
)
from .idx import check_arrays, dtype_code, encode_index, prefix_of
from .sidecar import Sidecar, sidecar_path

if TYPE_CHECKING:
    from .reader import TokenFile

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
        staged: str | os.PathLike[str] | None = None,
        kept: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """``staged``: write the ``.bin`` at this path (see the module docstring); ``kept``:
        (sequence lengths, document indices) of the tokens the staged file holds already and
        keeps (the rest is cut off); without it a staged file starts empty."""
        self.prefix = prefix_of(prefix)
        self.dtype = np.dtype(dtype)
        dtype_code(self.dtype)  # reject dtypes Megatron has no code for, before writing anything
        self.multimodal = multimodal
        self.tokenizer = tokenizer
        self.metadata = dict(metadata or {})
        require_folder(self.prefix)
        if kept is not None and (staged is None or multimodal):
            raise ValueError("kept= needs staged= (and no multimodal modes)")
        self._staged = None if staged is None else Path(staged)
        self._bin_tmp = temp_path(self.prefix + ".bin") if staged is None else Path(staged)
        self._closed = True  # until the temporary exists, there is nothing to abort
        self._hash = xxhash.xxh3_64()
        self._lengths = array("i")
        self._documents = array("q", [0])
        self._modes = array("b")
        self._tokens = 0
        if staged is None:
            self._bin = create_temp(self._bin_tmp, self.prefix + ".bin")
        else:
            self._bin = self._open_staged(kept)
        self._adopted: str | None = None  # the .bin digest of a file adopted whole (see adopt)
        self._closed = False
        self._unlinked_old = False  # _publish removed the old .idx: the ready files must stay

    def _open_staged(self, kept: tuple[np.ndarray, np.ndarray] | None) -> BinaryIO:
        """Open the staged ``.bin`` (created when missing), cut to the ``kept`` tokens, which are
        hashed again and whose index is taken over."""
        path = self._bin_tmp
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise write_error(exc, path, "the token file") from None
        f = os.fdopen(fd, "r+b")
        try:
            lengths = np.zeros(0, np.int32) if kept is None else np.asarray(kept[0], np.int32)
            documents = np.zeros(1, np.int64) if kept is None else np.asarray(kept[1], np.int64)
            if not (documents.size and documents[0] == 0 and documents[-1] == lengths.size):
                raise ValueError("kept document indices must run from 0 to the sequence count")
            tokens = int(lengths.sum(dtype=np.int64))
            size = tokens * self.dtype.itemsize
            if kept is not None:
                self._rehash(f, size)
            try:
                f.truncate(size)
                f.seek(size)
            except OSError as exc:
                raise write_error(exc, path, "the token file") from None
        except BaseException:
            close_quietly(f)
            raise
        self._lengths.frombytes(lengths.tobytes())
        self._documents = array("q")
        self._documents.frombytes(documents.tobytes())
        self._tokens = tokens
        return f

    def _rehash(self, f: BinaryIO, size: int) -> None:
        """Hash the first ``size`` bytes of the staged file (FormatError when it is shorter)."""
        path = os.fspath(self._bin_tmp)
        try:
            have = os.fstat(f.fileno()).st_size
            if have < size:
                raise FormatError(
                    f"the staged token file is {have} bytes, expected at least {size}",
                    path=path,
                    hint="it was cut short outside tokenload; rerun with a fresh start",
                )
            left = size
            while left:
                chunk = f.read(min(_COPY_CHUNK, left))
                if not chunk:
                    raise FormatError(
                        f"the staged token file ended {left} bytes early",
                        path=path,
                        hint="it was cut short outside tokenload; rerun with a fresh start",
                    )
                self._hash.update(chunk)
                left -= len(chunk)
        except OSError as exc:
            raise read_error(exc, path, "token data") from None

    # -- writing -------------------------------------------------------------------------------
    def _finals(self) -> tuple[str, str, str]:
        """The three files this writer publishes: ``.bin``, ``.idx`` and the sidecar."""
        return self.prefix + ".bin", self.prefix + ".idx", sidecar_path(self.prefix)

    def _write(self, tokens: np.ndarray) -> None:
        self._write_bytes(self._file_tokens(tokens).data)

    def _write_bytes(self, data: bytes | memoryview) -> None:
        if self._adopted is not None:
            raise FormatError(
                "cannot add tokens after adopt(): the .bin is another file's",
                path=self.prefix,
                hint="adopt a file only when the output is exactly that file",
            )
        try:
            self._bin.write(data)
        except OSError as exc:
            self.abort()
            raise write_error(exc, self.prefix + ".bin", "the token file") from None
        self._hash.update(data)

    def _file_tokens(self, tokens: np.ndarray) -> np.ndarray:
        """``tokens`` in the file's dtype; FormatError for a value that dtype cannot hold.

        A cast would wrap silently (uint16: 70000 -> 4464, -1 -> 65535), so integers are checked
        with two reductions unless their dtype always fits."""
        arr = np.asarray(tokens)
        if arr.dtype == self.dtype or arr.size == 0:
            return np.ascontiguousarray(arr, dtype=self.dtype)
        if self.dtype.kind in "iu":
            if arr.dtype.kind not in "iub":
                raise FormatError(
                    f"tokens are {arr.dtype}, expected integers for this {self.dtype} token file",
                    path=self.prefix,
                    hint="pass token ids as an integer array",
                )
            if not np.can_cast(arr.dtype, self.dtype):
                self._check_range(arr)
        return np.ascontiguousarray(arr, dtype=self.dtype)

    def _check_range(self, arr: np.ndarray) -> None:
        info = np.iinfo(self.dtype)
        low, high = int(arr.min()), int(arr.max())
        if info.min <= low and high <= info.max:
            return
        bad = (arr < info.min) | (arr > info.max)
        first = int(arr.ravel()[int(np.argmax(bad.ravel()))])
        raise FormatError(
            f"token {first} does not fit this file's {self.dtype} tokens [{info.min}, {info.max}]"
            f" ({int(np.count_nonzero(bad))} of {arr.size} tokens in this call are outside;"
            " nothing of it was written)",
            path=self.prefix,
            hint=self._range_hint(low),
        )

    def _range_hint(self, low: int) -> str:
        if low < 0:
            return "a negative id is never a valid token: check the tokenizer's output"
        if self.dtype.itemsize < 4:
            return "write with dtype=np.int32 (Megatron: uint16 only for vocabularies below 65,500)"
        return "no tokenizer has ids this large: check the tokenizer's output"

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
        self._documents.frombytes(
            np.arange(start + 1, start + 1 + lens.size, dtype=np.int64).tobytes()
        )
        self._tokens += tokens.size
        if self.multimodal:
            self._modes.extend([0] * lens.size)

    def append(self, source: str | os.PathLike[str] | TokenFile) -> None:
        """Append every document of another token file (Megatron ``add_index``); same dtype only."""
        from .reader import TokenFile

        self._check_open()
        other = source if isinstance(source, TokenFile) else TokenFile(source, mode="pread")
        if other.dtype != self.dtype:
            raise ConfigError(
                f"cannot append {other.prefix!r}: its dtype is {other.dtype}, this file's is "
                f"{self.dtype}",
                path=self.prefix,
                hint="merge only token files made with the same tokenizer (same vocabulary size)",
            )
        # the structure `tokenload verify` checks: a damaged input is never copied into a file
        # that then looks sound (its pointers are not copied, its lengths are)
        problems = check_arrays(
            other.header,
            other.sequence_lengths,
            other.sequence_pointers,
            other.document_indices,
            other.bin_bytes,
        )
        if problems:
            raise FormatError(
                f"cannot append a damaged token file: {problems[0]}"
                + (f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""),
                path=other.idx_path,
                hint=f"run `tokenload verify {other.prefix}`; rewrite it from its source, or leave"
                " it out",
            )
        offset = len(self._lengths)
        self._lengths.frombytes(np.ascontiguousarray(other.sequence_lengths).tobytes())
        docs = np.asarray(other.document_indices[1:], dtype=np.int64) + offset
        self._documents.frombytes(docs.tobytes())
        if self.multimodal:
            modes = other.sequence_modes
            self._modes.frombytes(
                (np.zeros(other.num_sequences, np.int8) if modes is None else modes).tobytes()
            )
        self._copy_bin(other.bin_path)
        self._tokens += other.num_tokens

    def adopt(self, source: str) -> bool:
        """Make this (empty) writer's output exactly the token file ``source`` by hard-linking its
        ``.bin`` instead of copying it: no copy, no second hash, no second fsync of the tokens.

        Taken only when ``source`` has a sidecar whose ``.bin`` size and xxh3-64 are recorded and
        the size matches, and the link succeeds (same filesystem); otherwise returns False with
        nothing changed, and the caller appends as usual. Both names then share one inode, so the
        source must never be written in place afterwards (preprocess parts never are: each is
        published once by rename and later only deleted). Nothing may be added after it."""
        self._check_open()
        if self._tokens or len(self._lengths):
            return False
        from .reader import TokenFile
        from .sidecar import read_sidecar

        sidecar = read_sidecar(source)
        digest = None if sidecar is None else sidecar.hashes.get("bin", {}).get("xxh3_64")
        if sidecar is None or digest is None or self.multimodal:
            return False
        other = TokenFile(source, mode="pread")
        if other.dtype != self.dtype or other.num_tokens * self.dtype.itemsize != sidecar.bin_bytes:
            return False
        close_quietly(self._bin)  # the empty temporary gives its name to the link
        try:
            os.unlink(self._bin_tmp)
            os.link(other.bin_path, self._bin_tmp)
            self._bin = open(self._bin_tmp, "rb")  # noqa: SIM115 (held until finalize)
        except OSError:  # another filesystem, no hard links: copy instead
            self._bin = create_temp(self._bin_tmp, self.prefix + ".bin")
            return False
        self._lengths.frombytes(np.ascontiguousarray(other.sequence_lengths).tobytes())
        self._documents.frombytes(np.asarray(other.document_indices[1:], dtype=np.int64).tobytes())
        self._tokens = other.num_tokens
        self._adopted = digest
        return True

    def _copy_bin(self, path: str) -> None:
        try:
            src = open(path, "rb")  # noqa: SIM115 (an open error is named apart from a read's)
        except OSError as exc:
            self.abort()
            raise read_error(exc, path, "token data") from None
        with src:
            while True:
                try:
                    chunk = src.read(_COPY_CHUNK)
                except OSError as exc:
                    self.abort()
                    raise read_error(exc, path, "token data") from None
                if not chunk:
                    return
                self._write_bytes(chunk)

    # -- points to come back to (staged writers) -------------------------------------------------
    def mark(self) -> WriterMark:
        """Where the writer is now, for ``rollback`` and ``index_since``."""
        self._check_open()
        return WriterMark(
            self._tokens,
            len(self._lengths),
            len(self._documents),
            len(self._modes),
            self._hash.copy(),
        )

    def rollback(self, mark: WriterMark) -> None:
        """Forget everything written after ``mark``: the ``.bin`` is cut back to it."""
        self._check_open()
        if self._adopted is not None or mark.tokens > self._tokens:
            raise FormatError(
                "cannot roll back to a point this writer has not passed",
                path=self.prefix,
                hint="pass a mark taken from this writer",
            )
        size = mark.tokens * self.dtype.itemsize
        try:
            self._bin.flush()
            self._bin.truncate(size)
            self._bin.seek(size)
        except OSError as exc:
            self.abort()
            raise write_error(exc, os.fspath(self._bin_tmp), "the token file") from None
        del self._lengths[mark.sequences :]
        del self._documents[mark.documents :]
        del self._modes[mark.modes :]
        self._tokens = mark.tokens
        self._hash = mark.digest.copy()

    def sync(self) -> None:
        """Make every token written so far durable (flush and fsync the ``.bin``)."""
        self._check_open()
        try:
            sync_file(self._bin, self.prefix + ".bin")
        except BaseException:
            self.abort()
            raise

    def index_since(self, mark: WriterMark) -> list[bytes]:
        """The ``.idx`` (as chunks) of the documents written after ``mark``, as if they were a token
        file of their own; ``mark`` must fall between documents."""
        lengths = np.frombuffer(self._lengths, dtype=np.int32)[mark.sequences :]
        documents = np.frombuffer(self._documents, dtype=np.int64)[mark.documents - 1 :]
        if documents[0] != mark.sequences:
            raise FormatError(
                "the mark falls inside a document",
                path=self.prefix,
                hint="take marks between documents (after end_document or add_document)",
            )
        modes = np.frombuffer(self._modes, dtype=np.int8)[mark.modes :] if self.multimodal else None
        return encode_index(self.dtype, lengths, documents - mark.sequences, modes)

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
        temps = [self._bin_tmp]
        try:
            sync_file(self._bin, self.prefix + ".bin")
            self._bin.close()
            chunks = self._index_chunks()
            sidecar = self._sidecar(chunks)
            _, idx_path, json_path = self._finals()
            temps.append(write_temp(idx_path, lambda f: f.writelines(chunks)))
            temps.append(write_temp(json_path, lambda f: f.write(sidecar.to_json().encode())))
            if self._staged is not None:  # beside the output now, under a temporary name
                temps[0] = temp_path(self.prefix + ".bin")
                replace(self._staged, temps[0])
            self._publish(temps)
            return sidecar
        except BaseException:
            close_quietly(self._bin)
            if not self._unlinked_old:  # after that the ready files are the output: kept
                if self._staged is not None and temps[0] != self._staged:
                    _put_back(temps[0], self._staged)
                for tmp in temps[1:] if self._staged is not None else temps:
                    discard(tmp)
            raise

    def _index_chunks(self) -> list[bytes]:
        modes = np.frombuffer(self._modes, dtype=np.int8) if self.multimodal else None
        return encode_index(
            self.dtype,
            np.frombuffer(self._lengths, dtype=np.int32),
            np.frombuffer(self._documents, dtype=np.int64),
            modes,
        )

    def _sidecar(self, idx_chunks: list[bytes]) -> Sidecar:
        idx_hash = xxhash.xxh3_64()
        for chunk in idx_chunks:
            idx_hash.update(chunk)
        return Sidecar.describe(
            dtype=self.dtype,
            sequences=self.num_sequences,
            documents=self.num_documents,
            tokens=self._tokens,
            bin_bytes=self._tokens * self.dtype.itemsize,
            idx_bytes=sum(len(c) for c in idx_chunks),
            bin_xxh3=self._adopted or self._hash.hexdigest(),
            idx_xxh3=idx_hash.hexdigest(),
            tokenizer=self.tokenizer,
            metadata=self.metadata,
        )

    def _publish(self, temps: list[Path]) -> None:
        """Replace the old output by the complete new one (every temporary is fsynced).

        No rename swaps two files at once, so the new ``.idx`` is the commit point. First the
        new ``.idx`` and sidecar are renamed to their ready names (``ready_path``: the ``.bin``
        temporary's suffix plus ``.ready``), which mark the three as one complete replacement;
        then the old sidecar and ``.idx`` go, the new ``.bin`` comes, the new ``.idx`` and
        sidecar last. A reader that finds no ``.idx`` in between waits for a live writer or,
        when the writer was killed, finishes the renames itself (``finish_publish``): it reads
        the old pair or the new one, never a ``.bin`` and ``.idx`` of different writes, and
        never loses both (docs/FORMAT.md, "Writing")."""
        bin_tmp, idx_tmp, json_tmp = temps
        bin_path, idx_path, json_path = self._finals()
        for i, (tmp, final) in enumerate(((idx_tmp, idx_path), (json_tmp, json_path)), start=1):
            temps[i] = ready_path(bin_tmp, final)
            replace(tmp, temps[i])
        fsync_dir(Path(self.prefix).parent)
        _unlink(json_path)
        self._unlinked_old = True  # from here on a reader finishes what a failure leaves
        _unlink(idx_path)
        replace(bin_tmp, bin_path)
        replace(temps[1], idx_path)
        replace(temps[2], json_path)
        fsync_dir(Path(self.prefix).parent)

    def abort(self) -> None:
        """Discard everything written; no file appears. A staged ``.bin`` is closed and kept
        (its caller knows what of it is finished)."""
        if not self._closed:
            self._closed = True
            close_quietly(self._bin)
            if self._staged is None:
                discard(self._bin_tmp)

    def _check_open(self) -> None:
        if self._closed:
            raise FormatError(
                "the writer is already finalized or aborted",
                path=self.prefix,
                hint="create a new TokenFileWriter for another file",
            )

    def __enter__(self) -> TokenFileWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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


@dataclass(frozen=True)
class WriterMark:
    """A point of a writer's output (``TokenFileWriter.mark``)."""

    tokens: int
    sequences: int
    documents: int
    """Entries of the document indices (documents + 1)."""
    modes: int
    digest: Any
    """The xxh3-64 state of the ``.bin`` up to here."""


def _put_back(tmp: Path, staged: Path) -> None:
    """Return a staged ``.bin`` moved beside the output to its own name (best effort), so a
    publish that failed leaves the caller's finished tokens where it keeps them."""
    try:
        os.replace(tmp, staged)
    except OSError:
        discard(tmp)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise write_error(exc, path, "over the old file") from None
