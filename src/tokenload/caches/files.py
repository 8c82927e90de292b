"""Writing, loading and checking index cache files (names and identity: ``names``).

Writes are atomic per file and durable per group (``format.atomic.WriteGroup``): each file goes
to a hidden temporary name in the cache folder; a ``CacheWriter`` holds the temporaries of every
cache a build writes, makes their data durable in one step (one ``syncfs`` of the folder's
filesystem where Linux supports it; an fsync per file for a group of a few files, or while other
writers hold many dirty pages; elsewhere an fsync of each file as it is written), then renames
them in order -- per cache the ``.npy`` arrays, the tokenload sidecar, Megatron's description
last -- and fsyncs each folder once. Megatron counts a cache as complete when the description
and the arrays exist, so a build killed at any point never leaves a cache that Megatron or
tokenload would take for complete, and two builders racing for one cache leave one valid cache
(their bytes are identical). Arrays are written with ``numpy.save`` as Megatron writes them, so
each side loads the other's cache. A cache folder in object storage (``s3://bucket/cache``) is
written locally and uploaded in the same order, and read and checked through the node's local
copies of its files (``bucket``).

Power loss: no file is renamed into place before the data of every temporary of the group is
durable (``syncfs`` returned without error, or each file's fsync did), so after a crash each
cache file is absent, old, or complete with its final bytes; never a zeroed or partial array
under a final name. A rename lost with the crash (the folder fsync comes after all renames)
leaves a cache without some of its files: without the description or an array it is a miss;
without the sidecar it is checked as a Megatron-written cache (``datasets.megatron.cache_match``
against the token file's lengths); a sidecar kept from an earlier build of the same name records
its arrays' xxh3-64, which the new arrays would have to match. Temporaries are never read.

The sidecar ``{md5}-{Class}-{split}-tokenload.json`` records what Megatron's hash forgets
(``add_extra_token``, the validation drop-last flag, the surplus, fingerprints of the token
files -- whatever the caller passes as ``fields``) and the arrays' shapes, dtypes and an xxh3-64
of each array's data bytes. ``check_cache`` compares it, the description and the ``.npy`` headers
with what the caller expects, and the content of every array up to ``VERIFY_AT_CHECK_BYTES``.
Given a listing of the folder (``list_folder``, one per build and folder), it learns which files
exist from the listing instead of one stat per file. ``map_array`` verifies the content of an
array the first time a process maps it (unless this process verified the same file already), so
a value damaged in range (a duplicated shuffle entry) is a ``CacheError`` before any batch reads
through it. xxh3 hashes at tens of GB/s: the cost is reading the array once per process
(``benchmarks/integrity.py``). The arrays' values are also range-checked where they are used
(per batch, ``datasets.megatron.gpt_dataset``), which covers caches without a sidecar
(Megatron's) and damage after the first use.

A damaged ``.npy`` header can make NumPy raise almost anything (``ValueError``, ``SyntaxError``,
``tokenize.TokenError``, ``EOFError``); ``check_cache`` reports it as a stale cache and
``map_array`` as a ``CacheError`` naming the file.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import logging
import math
import os
import re
import threading
import tokenize
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt
import xxhash

from tokenload.caches import jsontext
from tokenload.caches.names import BLENDED_ARRAYS, GPT_ARRAYS, PACKED_ARRAYS, CacheFiles
from tokenload.errors import CacheError, FormatError, StorageError
from tokenload.format.atomic import WriteGroup
from tokenload.format.descriptors import map_readonly
from tokenload.storage import is_url

__all__ = [
    "CacheCheck",
    "CacheState",
    "CacheWriter",
    "DAMAGED_HINT",
    "array_digests",
    "check_cache",
    "list_folder",
    "load_cache",
    "map_array",
    "recorded_digest",
    "write_cache",
    "write_failure",
]

logger = logging.getLogger(__name__)

SIDECAR_FORMAT = "tokenload-index-cache"
SIDECAR_VERSION = 1

VERIFY_AT_CHECK_BYTES = 256 << 20
"""Arrays up to this size have their content hash verified by ``check_cache`` (so ``auto``
rebuilds a damaged cache instead of failing at its first batch); larger ones when first mapped."""

DAMAGED_HINT = (
    "delete the cache files of this hash (same name up to '-{array}.npy'), then build them"
    " again: a build_policy other than 'none' rebuilds them at the next start; under 'none', run"
    " the `tokenload prepare-cache` command that prepared them (a load under 'none' prints it"
    " once they are missing)"
)
"""What to do about a damaged cache array, whichever build policy finds it."""

_VERIFIED: set[tuple[int, int, int, int]] = set()
"""``(device, inode, size, mtime)`` of the array files whose content this process verified."""

_HEADER_LOCK = threading.Lock()
"""One ``.npy`` header parsed at a time in a process: numpy parses it with ``ast.literal_eval``,
and CPython 3.11's AST validator counts its recursion depth per interpreter, not per thread, so
two build threads checking caches at once could fail with "SystemError: AST constructor
recursion depth mismatch" (seen in test runs of many cache checks, Python 3.11)."""

_NPY_ERRORS = (OSError, ValueError, SyntaxError, EOFError, OverflowError, tokenize.TokenError)
"""What ``numpy.load`` and its header readers raise on a damaged or vanished ``.npy`` file."""


class CacheState(str, enum.Enum):
    """Outcome of ``check_cache``."""

    HIT = "hit"
    """Complete, and nothing recorded contradicts the expected settings."""
    MISS = "miss"
    """At least one of Megatron's files is missing: build."""
    STALE = "stale"
    """Complete for Megatron, but built with other settings or damaged: rebuild."""


@dataclass(frozen=True, kw_only=True)
class CacheCheck:
    """What ``check_cache`` found."""

    state: CacheState
    """Hit, miss or stale."""
    reasons: tuple[str, ...]
    """Why (missing files, differing fields, truncated arrays); empty for a verified hit."""
    has_sidecar: bool
    """False when the cache carries no tokenload sidecar (e.g. Megatron built it): a hit is
    then checked on the description and array shapes only."""
    arrays: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The array files checked, by name: the cache's own, or the local copies of a cache in
    object storage (map these: they are the bytes the check saw)."""
    digests: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The xxh3-64 the sidecar records per array (a build manifest carries them on), by name;
    empty without a sidecar."""


def _array_facts(dtype: np.dtype, shape: tuple[int, ...]) -> dict[str, Any]:
    """What the sidecar records of an array's header, in the form it is written and compared in."""
    return {"dtype": np.lib.format.dtype_to_descr(dtype), "shape": list(shape)}


def _recorded_header(facts: Any) -> Any:
    """The header part of a sidecar's record of an array (its hash left out)."""
    if not isinstance(facts, dict):
        return facts
    return {k: facts.get(k) for k in ("dtype", "shape")}


def _digest(data: Any) -> str:
    """xxh3-64 (hex) of an array's data bytes as ``numpy.save`` writes them (C order); an empty
    array's are no bytes (a memoryview of a shape with a 0 cannot be cast to bytes)."""
    array = np.ascontiguousarray(data)
    return xxhash.xxh3_64_hexdigest(array.data.cast("B") if array.size else b"")


def array_digests(arrays: Mapping[str, npt.NDArray[Any]]) -> dict[str, str]:
    """The xxh3-64 (hex) of each array's data bytes, as a sidecar records it and ``map_array``
    verifies it."""
    return {name: _digest(array) for name, array in arrays.items()}


def _canonical_fields(fields: Mapping[str, Any] | None) -> dict[str, Any]:
    """``fields`` as they read back from the sidecar's JSON (tuples become lists)."""
    plain: dict[str, Any] = jsontext.plain_copy(dict(fields or {}))
    return plain


def write_cache(
    files: CacheFiles,
    *,
    description: str,
    arrays: Mapping[str, npt.NDArray[Any]],
    fields: Mapping[str, Any] | None = None,
    digests: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Write a complete cache atomically: arrays, then the sidecar, then the description (a
    ``CacheWriter`` of one cache); returns the arrays' xxh3-64 (``CacheWriter.add``).

    ``arrays`` must hold exactly ``files.arrays``; ``fields`` are the sidecar's extra facts
    (JSON-serializable). A folder in object storage gets the files written locally first and
    uploaded in the same order (``bucket``). Raises ``CacheError`` when the folder cannot
    be created or written, ``StorageError`` when an upload fails.
    """
    writer = CacheWriter()
    try:
        digests = writer.add(
            files, description=description, arrays=arrays, fields=fields, digests=digests
        )
    except BaseException:
        writer.discard()
        raise
    writer.publish()
    return digests


class CacheWriter:
    """Caches written as one group (see the module docstring): ``add`` writes a cache's files
    under temporary names (a folder in object storage: staged and uploaded at once, as
    ``write_cache``), ``publish`` makes them durable together and puts them in place, arrays,
    sidecar and description in that order per cache; ``discard`` removes what ``add`` wrote
    (after a failed build). Threads may add caches to one writer. Nothing added is readable
    under its final name before ``publish`` returns."""

    def __init__(self) -> None:
        self._group = WriteGroup()
        self._keys: list[tuple[int, int, int, int]] = []
        self._lock = threading.Lock()
        self.added = 0
        """Caches added since the last publish."""

    def add(
        self,
        files: CacheFiles,
        *,
        description: str,
        arrays: Mapping[str, npt.NDArray[Any]],
        fields: Mapping[str, Any] | None = None,
        digests: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """Write the cache's files under temporary names (``CacheError`` when the folder cannot
        be created or written); they are put in place by ``publish``. Returns the arrays'
        xxh3-64 the sidecar records (``digests``: those of ``arrays`` when the caller has them:
        ``array_digests``)."""
        if set(arrays) != set(files.arrays):
            raise CacheError(f"arrays {sorted(arrays)}; expected exactly {list(files.arrays)}")
        digests = dict(digests) if digests is not None else array_digests(arrays)
        if is_url(files.directory):
            from .bucket import publish_cache, staged_cache

            with staged_cache(files) as local:
                write_cache(
                    local, description=description, arrays=arrays, fields=fields, digests=digests
                )
                publish_cache(local, files)
            logger.debug("published index cache %s", files.description)
            return digests
        text = _sidecar_text(files, arrays, fields, digests)
        keys = []
        try:
            for name in files.arrays:
                st = self._group.write(
                    files.array(name), _npy_writer(np.ascontiguousarray(arrays[name])), stat=True
                )
                assert st is not None  # asked for
                keys.append(_file_key(st))
            self._group.write(files.sidecar, lambda f: f.write(text))
            self._group.write(files.description, lambda f: f.write(description.encode("utf-8")))
        except OSError as exc:
            raise _write_failed(exc, files.directory) from None
        with self._lock:
            self._keys += keys  # written from these very arrays: verified once published
            self.added += 1
        return digests

    def write_last(self, path: str, data: bytes) -> None:
        """Write ``path`` (a build manifest naming the caches) to be put in place after every
        cache of the group is, and after their folders are fsynced; StorageError on failure."""
        self._group.write(path, lambda f: f.write(data), last=True)

    def publish(self) -> None:
        """Make every added file durable and put it in place (``CacheError`` on failure; the
        files not yet in place are removed)."""
        with self._lock:
            keys, self._keys, self.added = self._keys, [], 0
        try:
            self._group.publish()
        except OSError as exc:
            raise _write_failed(exc, getattr(exc, "path", None)) from None
        _VERIFIED.update(keys)

    def discard(self) -> None:
        """Remove the files added and not yet published."""
        with self._lock:
            self._keys, self.added = [], 0
        self._group.discard()


def _write_failed(exc: OSError, path: str | None) -> CacheError:
    return CacheError(
        f"cannot write the index cache ({write_failure(exc, path)}); expected a writable folder"
        " with room for it",
        path=path,
        hint="point the cache at a writable folder on a filesystem every rank can read "
        "(`path_to_cache=`, `--data-cache-path`), or build the indices in memory",
    )


def write_failure(exc: OSError, path: str | None) -> str:
    """What a failed write found: the OS's words, and when the filesystem has (next to) no room
    left, that (a short write, as ``numpy.save``'s, has no errno)."""
    reason = str(exc.strerror or exc)
    if exc.errno == errno.ENOSPC:
        return f"{reason}: the filesystem is full"
    where = os.path.abspath(path) if path else "."
    try:  # the folder written into, or the file's folder (a mount point is its own filesystem)
        stats = os.statvfs(where if os.path.isdir(where) else os.path.dirname(where))
    except OSError:
        return reason
    free = stats.f_bavail * stats.f_frsize
    return f"{reason}: the filesystem is full ({free:,} bytes free)" if free < 1 << 20 else reason


def _npy_writer(array: np.ndarray) -> Callable[[BinaryIO], None]:
    """Writes ``array`` as ``numpy.save`` does (Megatron's cache files), no pickled objects."""
    return lambda f: np.save(f, array, allow_pickle=False)


def _sidecar_text(
    files: CacheFiles,
    arrays: Mapping[str, npt.NDArray[Any]],
    fields: Mapping[str, Any] | None,
    digests: Mapping[str, str],
) -> bytes:
    """The sidecar's bytes (``json.dumps(indent=1, sort_keys=True)``, as ever)."""
    sidecar = {
        "format": SIDECAR_FORMAT,
        "version": SIDECAR_VERSION,
        "description_md5": files.hash,
        "class": files.class_name,
        "split": files.split,
        "arrays": {
            name: {
                **_array_facts(np.asarray(arrays[name]).dtype, np.shape(arrays[name])),
                "xxh3_64": digests[name],
            }
            for name in files.arrays
        },
        "fields": _canonical_fields(fields),
    }
    return jsontext.dumps(sidecar, indent=1, sort_keys=True).encode()


def map_array(path: str, digest: str | None = None) -> npt.NDArray[Any]:
    """One cached array, memory-mapped read-only from a single open of the file (``np.load``
    with ``mmap_mode`` opens it three times), as a plain ndarray view (``np.memmap``'s subclass
    hooks cost more than a batch's lookups); ``CacheError`` naming the file when it is not a
    whole ``.npy`` of plain numbers. A URL maps its local copy (downloaded once per node).
    The first map of a file in a process verifies its data against ``digest`` (a build
    manifest's record) or, without one, the xxh3-64 its cache's sidecar records."""
    shown = path
    try:
        if is_url(path):
            path = _array_copy(path)
        with open(path, "rb") as f:
            shape, fortran, dtype = _read_npy_header(f, path)
            offset, size = f.tell(), os.fstat(f.fileno()).st_size
            nbytes = math.prod(shape) * dtype.itemsize
            if dtype.hasobject or size < offset + nbytes:
                what = (
                    "Python objects"
                    if dtype.hasobject
                    else f"{size} bytes, {offset + nbytes} expected"
                )
                raise FormatError(f"{what} in a cached index array", path=path)
            key = _file_key(os.fstat(f.fileno()))
            if nbytes == 0:
                return np.empty(shape, dtype=dtype)
            buffer = map_readonly(f.fileno(), size)  # keeps no descriptor open
        if key not in _VERIFIED:
            _verify(shown, buffer.data[offset : offset + nbytes], key, digest)
        mapped: np.ndarray = np.ndarray(
            shape, dtype=dtype, buffer=buffer, offset=offset, order="F" if fortran else "C"
        )
        return mapped
    except (StorageError, CacheError):
        raise
    except (*_NPY_ERRORS, FormatError) as exc:
        raise CacheError(
            f"cannot load the cached index array ({type(exc).__name__}: {exc}); expected a .npy "
            "file as numpy.save writes it",
            path=shown,
            hint=DAMAGED_HINT,
        ) from None


def _file_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _verify(path: str, data: Any, key: tuple[int, int, int, int], digest: str | None) -> None:
    """Compare the array's data bytes with ``digest`` (a build manifest's record) or else the
    xxh3-64 its cache's sidecar recorded (nothing to compare without a sidecar or a recorded
    hash); ``CacheError`` naming the file on a mismatch."""
    recorded = digest if digest is not None else recorded_digest(path)
    if recorded is None:
        return
    where = "the build manifest" if digest is not None else "the cache's sidecar"
    found = xxhash.xxh3_64_hexdigest(data)
    if found != recorded:
        raise CacheError(
            f"{os.path.basename(path)} holds data whose xxh3-64 is {found}, expected {recorded} "
            f"(recorded in {where} when it was written): the index cache is damaged",
            path=path,
            hint=DAMAGED_HINT,
        )
    _VERIFIED.add(key)


def recorded_digest(path: str) -> str | None:
    """The xxh3-64 that the tokenload sidecar of the cache recorded for the array file ``path``
    (a URL: from its node-local copy); None without a sidecar (Megatron wrote the cache) or a
    recorded hash (a sidecar written before hashes were recorded)."""
    base = path.rsplit("/", 1)[-1]
    names = (*GPT_ARRAYS, *BLENDED_ARRAYS, *PACKED_ARRAYS)  # (a packed plan's too)
    name = next((n for n in names if base.endswith(f"-{n}.npy")), None)
    if name is None:
        return None
    sidecar = path[: -len(f"-{name}.npy")] + "-tokenload.json"
    local: str | None = sidecar
    if is_url(sidecar):
        from ..storage.upload import copy_or_none

        local = copy_or_none(sidecar)
    data = None if local is None else _read_sidecar(local)
    facts = ((data or {}).get("arrays") or {}).get(name)
    digest = facts.get("xxh3_64") if isinstance(facts, dict) else None
    return digest if isinstance(digest, str) else None


def _array_copy(url: str) -> str:
    """The local copy of a cached array in object storage; a missing object is a damaged cache."""
    from ..storage.upload import copy_or_none

    local = copy_or_none(url)
    if local is None:
        raise FormatError("the object does not exist", path=url)
    return local


def load_cache(files: CacheFiles) -> dict[str, npt.NDArray[Any]]:
    """Load the cache's arrays, memory-mapped read-only (``map_array`` each)."""
    return {name: map_array(files.array(name)) for name in files.arrays}


_NPY_V1 = b"\x93NUMPY\x01\x00"
_NPY_HEADER = re.compile(
    rb"\{'descr': '([<>|=][a-zA-Z][0-9]*)', 'fortran_order': (False|True), "
    rb"'shape': \(((?:[0-9]+, )*[0-9]+,?|)\), \} *\n"
)
"""The header ``numpy.save`` writes for plain numbers (format 1.0), exactly."""
_DTYPES: dict[bytes, np.dtype] = {}


def _read_npy_header(f: BinaryIO, path: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype of the ``.npy`` open in ``f``, left at its data.

    A header exactly as ``numpy.save`` writes it for plain numbers is read by one regular
    expression (~2 us; numpy's reader parses it with ``ast.literal_eval`` under a lock, ~60 us:
    a warm 1,000-prefix build checks 6,000 of them); anything else, damaged or not, is read by
    numpy's own reader as before, with its errors.
    """
    head = f.read(10)
    if len(head) == 10 and head[:8] == _NPY_V1:
        text = f.read(int.from_bytes(head[8:10], "little"))
        match = _NPY_HEADER.fullmatch(text)
        if match is not None:
            descr, fortran, dims = match.groups()
            dtype = _DTYPES.get(descr)
            if dtype is None:
                try:
                    dtype = _DTYPES.setdefault(descr, np.dtype(descr.decode("ascii")))
                except TypeError:
                    dtype = None
            if dtype is not None:
                return tuple(int(d) for d in dims.split(b",") if d), fortran == b"True", dtype
    f.seek(0)
    try:
        version = np.lib.format.read_magic(f)
        reader = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }.get(version)
        if reader is None:
            raise FormatError(f"npy version {version}; expected 1.0 or 2.0", path=path)
        with _HEADER_LOCK:  # numpy parses the header with ast.literal_eval; see _HEADER_LOCK
            shape, fortran, dtype = reader(f)
    except _NPY_ERRORS as exc:
        raise FormatError(f"not a .npy file ({exc})", path=path) from None
    return tuple(shape), bool(fortran), dtype


def _npy_header(path: str, digest: bool = False) -> tuple[Any, ...]:
    """Shape, dtype, whether the file is as long as its header says and, with ``digest`` for a
    whole file up to ``VERIFY_AT_CHECK_BYTES``, the xxh3-64 of its data (then this process counts
    the file as verified when the digest is the recorded one: ``_VERIFIED``)."""
    with open(path, "rb") as f:
        shape, _fortran, dtype = _read_npy_header(f, path)
        st = os.fstat(f.fileno())
        nbytes = math.prod(shape) * dtype.itemsize
        whole = st.st_size == f.tell() + nbytes
        found = None
        if digest and whole and nbytes <= VERIFY_AT_CHECK_BYTES:
            h = xxhash.xxh3_64()
            while chunk := f.read(16 << 20):
                h.update(chunk)
            found = h.hexdigest()
    return shape, dtype, whole, found, _file_key(st)


def _read_sidecar(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data = jsontext.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _check_arrays(
    files: CacheFiles,
    where: Mapping[str, str],
    recorded: Mapping[str, Any] | None,
    expected_shapes: Mapping[str, tuple[int, ...]] | None,
    reasons: list[str],
) -> None:
    for name in files.arrays:
        try:
            record = None if recorded is None else recorded.get(name)
            want_digest = record.get("xxh3_64") if isinstance(record, dict) else None
            shape, dtype, whole, found, key = _npy_header(
                where[f"{name}.npy"], want_digest is not None
            )
        except (OSError, FormatError) as exc:
            reasons.append(f"{name}: unreadable ({exc})")
            continue
        if dtype.kind not in "iu":
            reasons.append(f"{name}: cached dtype {dtype}, expected an integer dtype")
        if not whole:
            reasons.append(f"{name}: file length does not match its header (truncated?)")
        facts = _array_facts(dtype, shape)
        if recorded is not None and _recorded_header(record) != facts:
            reasons.append(f"{name}: cached {facts}, sidecar recorded {_recorded_header(record)}")
        elif found is not None and found != want_digest:
            reasons.append(
                f"{name}: data's xxh3-64 is {found}, the sidecar recorded {want_digest} "
                "(values damaged)"
            )
        elif found is not None:
            _VERIFIED.add(key)
        want = None if expected_shapes is None else expected_shapes.get(name)
        if want is not None and tuple(want) != shape:
            reasons.append(f"{name}: cached shape {shape}, expected {tuple(want)}")


def list_folder(folder: str) -> frozenset[str] | None:
    """The names in a local cache folder (one ``listdir``), for ``check_cache``'s ``listing``:
    empty when the folder does not exist; None for a folder in object storage or one that
    cannot be listed (then each file is looked up)."""
    if is_url(folder):
        return None
    try:
        return frozenset(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return frozenset()
    except OSError:
        return None


def _is_file(path: str | None, listing: Collection[str] | None) -> bool:
    if path is None:
        return False
    if listing is not None:
        return os.path.basename(path) in listing
    return os.path.isfile(path)


def _located(files: CacheFiles, listing: Collection[str] | None) -> dict[str, str | None]:
    """``{suffix: local path}`` of the cache's files: the files themselves, or for a folder in
    object storage their local copies (None for a missing object). With a ``listing``, a sidecar
    that it lacks is None (not probed)."""
    if is_url(files.directory):
        from .bucket import local_copies

        return local_copies(files)
    suffixes = ("description.txt", "tokenload.json", *(f"{name}.npy" for name in files.arrays))
    found: dict[str, str | None] = {suffix: files.path(suffix) for suffix in suffixes}
    if listing is not None and os.path.basename(files.sidecar) not in listing:
        found["tokenload.json"] = None
    return found


def check_cache(
    files: CacheFiles,
    *,
    description: str,
    fields: Mapping[str, Any] | None = None,
    expected_shapes: Mapping[str, tuple[int, ...]] | None = None,
    listing: Collection[str] | None = None,
) -> CacheCheck:
    """Say whether the cache at ``files`` can be used for a dataset with this description.

    MISS: one of Megatron's files is missing. STALE: the description differs, an array is
    truncated or has another shape than ``expected_shapes`` (e.g. from ``gpt.gpt_length``), or
    the sidecar records other ``fields`` or other array facts. HIT otherwise; without a sidecar
    the ``fields`` cannot be checked (``has_sidecar`` is False). A cache in object storage is
    checked on its local copies, the same way; ``CacheCheck.arrays`` names the files checked.
    ``listing``: the names in the folder (``list_folder``), which say what exists without a
    lookup per file (a file listed but gone since is unreadable: stale).
    """
    if is_url(files.directory):
        listing = None
    where = _located(files, listing)
    arrays = {name: where.get(f"{name}.npy") or files.array(name) for name in files.arrays}
    missing = [
        s
        for s in ("description.txt", *(f"{n}.npy" for n in files.arrays))
        if not _is_file(where.get(s), listing)
    ]
    sidecar_copy = where.get("tokenload.json")
    sidecar = None if sidecar_copy is None else _read_sidecar(sidecar_copy)
    has_sidecar = sidecar is not None
    if missing:
        names = ", ".join(os.path.basename(files.path(s)) for s in missing)
        return CacheCheck(
            state=CacheState.MISS,
            reasons=(f"missing {names}",),
            has_sidecar=has_sidecar,
            arrays=arrays,
        )
    found = {suffix: path for suffix, path in where.items() if path is not None}
    reasons: list[str] = []
    try:
        with open(found["description.txt"], "rb") as f:
            if f.read() != description.encode("utf-8"):
                reasons.append("description text differs from the expected one")
    except OSError as exc:
        reasons.append(f"description unreadable ({exc.strerror})")
    recorded = None
    digests: dict[str, str] = {}
    if sidecar is not None:
        if sidecar.get("format") != SIDECAR_FORMAT or sidecar.get("description_md5") != files.hash:
            reasons.append("sidecar is damaged or belongs to another description")
        else:
            recorded = sidecar.get("arrays") or {}
            digests = {
                name: record["xxh3_64"]
                for name, record in (recorded.items() if isinstance(recorded, dict) else ())
                if isinstance(record, dict) and isinstance(record.get("xxh3_64"), str)
            }
            want, have = _canonical_fields(fields), sidecar.get("fields") or {}
            for key in sorted(set(want) | set(have)):
                if want.get(key) != have.get(key):
                    reasons.append(f"{key}: cached {have.get(key)!r}, expected {want.get(key)!r}")
    _check_arrays(files, found, recorded, expected_shapes, reasons)
    state = CacheState.STALE if reasons else CacheState.HIT
    return CacheCheck(
        state=state, reasons=tuple(reasons), has_sidecar=has_sidecar, arrays=arrays, digests=digests
    )
