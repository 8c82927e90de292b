"""Input files for preprocess: expand paths, folders, globs and fsspec URLs into described files.

Expansion keeps the order the inputs are given in and sorts what each glob or folder yields, so
the file list (and with it the output) is the same on every machine. Each file is described by
its format (from its extension or ``--input-format``), its compression and a stamp (size and
modification time or etag) that decides whether a finished part may be reused. Apart from
``sources`` (which reads a described file as chunks) because listing runs once, in the driver,
while reading runs in every worker and task. Hugging Face dataset folders and in-memory dataset
objects are listed by ``hf``.
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import ConfigError, StorageError, TokenloadError, require
from . import hf

WORK_SUFFIX = ".tokenload-work"  # preprocess's work folders, never inputs
_FORMAT_BY_EXT = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
}
_COMPRESSION_BY_EXT = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
T = TypeVar("T")


@dataclass(frozen=True)
class InputFile:
    """One input file and how to read it."""

    path: str
    format: str
    """jsonl, parquet, arrow (Arrow IPC stream or file, as ``datasets`` writes), text (the file is
    one document), lines (each line is one) or dataset (a piece of an in-memory dataset object)."""
    compression: str | None
    size: int | None
    stamp: str
    """Size and modification time (or etag): a finished part is reused only if it still matches."""
    source: Any = field(default=None, compare=False, repr=False)
    """format dataset: the piece's rows (``hf.RowRange`` or ``hf.Shard``)."""


def is_url(path: str) -> bool:
    return "://" in path


def expand_inputs(
    patterns: tuple[Any, ...] | list[Any], input_format: str = "auto", piece_bytes: int = 256 << 20
) -> list[InputFile]:
    """The input files ``patterns`` name, in order, each glob or folder sorted; a ``datasets``
    object becomes its pieces (row ranges of about ``piece_bytes``, or its shards)."""
    files: list[InputFile] = []
    for pattern in patterns:
        if hf.is_dataset_object(pattern):
            files.extend(
                InputFile(
                    path=name,
                    format=hf.DATASET_FORMAT,
                    compression=None,
                    size=size,
                    stamp=stamp,
                    source=piece,
                )
                for name, size, stamp, piece in hf.object_pieces(pattern, piece_bytes)
            )
            continue
        paths = _expand_url(pattern) if is_url(pattern) else _expand_local(pattern, input_format)
        files.extend(_describe(p, input_format) for p in paths)
    return files


def _expand_local(pattern: str, input_format: str) -> list[str]:
    if os.path.isdir(pattern):
        saved = hf.saved_dataset_files(pattern)
        if saved is not None:
            return saved
        found: list[str] = []
        for root, dirs, names in os.walk(pattern):
            dirs[:] = sorted(
                d for d in dirs if not d.startswith(".") and not d.endswith(WORK_SUFFIX)
            )
            found.extend(os.path.join(root, n) for n in names if not n.startswith("."))
        found = sorted(
            p
            for p in found
            if (input_format != "auto" or _format_of(p, "auto")) and not _is_token_file(p)
        )
        if hf.is_hub_snapshot(pattern):
            return hf.snapshot_files(pattern, found)
        if not found:
            raise ConfigError(
                f"folder {pattern!r} holds no input files",
                path=pattern,
                hint="inputs end in .jsonl/.json/.ndjson/.parquet/.arrow/.txt (optionally"
                " .gz/.zst), or the folder is a Hugging Face dataset (save_to_disk, Hub snapshot)",
            )
        return found
    if glob.has_magic(pattern):
        found = sorted(
            p
            for p in glob.glob(pattern, recursive=True)
            if os.path.isfile(p) and not _is_token_file(p) and WORK_SUFFIX not in p
        )
        if not found:
            raise ConfigError(
                f"no file matches {pattern!r}", hint="check the glob (quote it in the shell)"
            )
        return found
    if not os.path.isfile(pattern):
        raise ConfigError(f"input {pattern!r} does not exist", path=pattern, hint="check the path")
    return [pattern]


def _is_token_file(path: str) -> bool:
    """A token file or its sidecar (e.g. earlier outputs in the input folder): never an input."""
    root, ext = os.path.splitext(path)
    if ext in (".bin", ".idx"):
        return True
    return ext == ".json" and (os.path.exists(root + ".idx") or os.path.exists(root + ".bin"))


def _remote(url: str, action: str, fn: Callable[[], T]) -> T:
    """Run an object-storage call; any failure of the storage or its client is a StorageError."""
    try:
        return fn()
    except TokenloadError:
        raise
    except Exception as exc:  # botocore/aiohttp errors are not OSErrors, and s3fs wraps only some
        raise StorageError(
            f"cannot {action} ({type(exc).__name__}:"
            f" {str(exc).splitlines()[0] if str(exc) else ''})",
            path=url,
            hint="check the URL, the endpoint (e.g. AWS_ENDPOINT_URL for S3-compatible servers) and"
            " the credentials; the storage must be reachable from this machine, then rerun the same"
            " command: input files already finished are resumed",
        ) from None


def _expand_url(pattern: str) -> list[str]:
    fsspec = require("fsspec", "s3", f"reading {pattern}")
    fs, _, paths = _remote(
        pattern, "resolve the URL", lambda: fsspec.core.get_fs_token_paths(pattern)
    )
    found: list[str] = []
    for p in sorted(paths):
        if _remote(pattern, "list it", functools.partial(fs.isdir, p)):
            listing = _remote(pattern, "list it", functools.partial(fs.find, p))
            found.extend(sorted(x for x in listing if not os.path.basename(x).startswith(".")))
        else:
            found.append(p)
    if not found:
        raise ConfigError(f"no file matches {pattern!r}", hint="check the URL and its credentials")
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return [p if is_url(p) else f"{protocol}://{p}" for p in found]


def _format_of(path: str, input_format: str) -> str | None:
    name = path.lower()
    root, ext = os.path.splitext(name)
    if ext in _COMPRESSION_BY_EXT:
        root, ext = os.path.splitext(root)
    if input_format != "auto":
        return input_format
    return _FORMAT_BY_EXT.get(ext)


def _describe(path: str, input_format: str) -> InputFile:
    fmt = _format_of(path, input_format)
    if fmt is None:
        raise ConfigError(
            f"cannot tell the format of {path!r} from its extension",
            path=path,
            hint="pass `input_format=` (jsonl, parquet, arrow, text or lines)",
        )
    ext = os.path.splitext(path.lower())[1]
    compression = _COMPRESSION_BY_EXT.get(ext)
    if fmt in ("parquet", "arrow") and compression:
        raise ConfigError(
            f"{fmt} files compress internally; a compressed .{fmt} file is not supported",
            path=path,
            hint="decompress it first",
        )
    size, stamp = _stat(path)
    return InputFile(path=path, format=fmt, compression=compression, size=size, stamp=stamp)


def _stat(path: str) -> tuple[int | None, str]:
    if not is_url(path):
        try:
            st = os.stat(path)
        except OSError as exc:
            raise StorageError(
                f"cannot stat ({exc.strerror})", path=path, hint="check the file"
            ) from None
        # the change time and the inode too: an edit in place that keeps the size and sets the
        # modification time back (`touch -r`, `cp -p`, `rsync -a` onto it) still changes them,
        # and a resume then encodes the file again rather than keeping its old tokens
        return st.st_size, f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    fsspec = require("fsspec", "s3", f"reading {path}")
    fs, fs_path = _remote(path, "resolve the URL", lambda: fsspec.core.url_to_fs(path))
    info = _remote(path, "read its size", lambda: fs.info(fs_path))
    tag = (
        info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or ""
    )
    return info.get("size"), f"{info.get('size')}:{tag}"


def shard_files(files: list[InputFile], num_shards: int, shard_index: int) -> list[InputFile]:
    """Contiguous block ``shard_index`` of ``num_shards``: concatenating shards in order gives back
    the full list, so merging the shards' outputs in shard order equals a one-machine run."""
    n = len(files)
    return files[shard_index * n // num_shards : (shard_index + 1) * n // num_shards]
