"""Packed blocks shared by the worker processes of one loader (``packing="best-fit"``, computed
order).

Every process that reads rows of a block needs the block's plan, and packing it is most of what a
packed row costs beyond its tokens (21 ms for a block of 131,072 web-text documents at
S = 2,048, 51 ms at S = 8,192). A loader's N workers all read rows of the same blocks (worker w
makes micro-batches w, w + N, ...), so without sharing each block is packed N times. With a
folder given by the loader (``share_plans``), the first worker that needs a block packs it under
an exclusive lock and publishes it; the others wait for the lock, then read it. A block's row
count is published too, so a resume's search for its first row (``PackedRows.locate``) packs
each earlier block once among all the workers.

Nothing here can change what is served: a block read back is checked (magic, length, xxh64 of
its bytes, then its arrays' shapes and offsets) and anything else is packed again; a row count
carries an xxh64 of its block's key and itself, and any other is counted again; a block is
written to a temporary name and renamed, so a half-written block is never seen; a process that
waited past ``WAIT_S`` for another one (stuck, or killed with the lock held: the lock dies with
it) packs the block itself; and every failure to write (a full or read-only folder) leaves the
process packing on its own. The folder is the loader's, made when its workers start and removed
when they stop; blocks two behind the one being read are removed as the workers move on.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import struct
import time
from typing import NamedTuple

import numpy as np
import xxhash

__all__ = ["WAIT_S", "PlanArrays", "SharedPlans"]

WAIT_S = 10.0
"""How long a process waits for another one to publish a block before packing it itself."""

_MAGIC = b"TLPLAN1\0"
_HEADER = struct.Struct("<8sQQ")  # magic, payload bytes, xxh64 of the payload
_ROWS = struct.Struct("<8sqQ")  # magic, a block's row count, xxh64 of its key and the count
_POLL_S = 0.001


class PlanArrays(NamedTuple):
    """A packed block as served: CSR offsets over its pieces, rows in serving order, and each
    piece's sequence, first token and tokens."""

    offsets: np.ndarray
    sequence: np.ndarray
    start: np.ndarray
    length: np.ndarray


class SharedPlans:
    """One loader's folder of published blocks (module docstring)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def _path(self, key: str, kind: str) -> str:
        name = hashlib.sha256(key.encode()).hexdigest()[:32]
        return os.path.join(self.folder, f"{name}.{kind}")

    # -- blocks -----------------------------------------------------------------------------------
    def _read(self, key: str, kind: str) -> bytes | None:
        try:
            with open(self._path(key, kind), "rb") as f:
                return f.read()
        except OSError:
            return None

    def load(self, key: str) -> PlanArrays | None:
        """The block published under ``key``, or None (missing, or not a whole valid block)."""
        data = self._read(key, "plan")
        return None if data is None else _decode(data)

    def store(self, key: str, plan: PlanArrays) -> None:
        """Publish ``plan`` under ``key`` and its row count (nothing on a write failure)."""
        buffer = io.BytesIO()
        for array in plan:
            np.save(buffer, array, allow_pickle=False)
        payload = buffer.getvalue()
        header = _HEADER.pack(_MAGIC, len(payload), xxhash.xxh64_intdigest(payload))
        self._publish(self._path(key, "plan"), header + payload)
        self.store_rows(key, len(plan.offsets) - 1)

    def drop(self, key: str) -> None:
        """Remove the block published under ``key`` (its row count stays)."""
        try:
            os.unlink(self._path(key, "plan"))
        except OSError:
            pass

    # -- row counts -------------------------------------------------------------------------------
    def rows(self, key: str) -> int | None:
        """The row count published for block ``key``, or None (missing, or not a whole count
        published for this key: its xxh64 over the key and the count)."""
        data = self._read(key, "rows")
        if data is None or len(data) != _ROWS.size:
            return None
        magic, count, digest = _ROWS.unpack(data)
        if magic != _MAGIC or count < 0 or digest != _rows_digest(key, count):
            return None
        return int(count)

    def store_rows(self, key: str, rows: int) -> None:
        self._publish(self._path(key, "rows"), _ROWS.pack(_MAGIC, rows, _rows_digest(key, rows)))

    # -- who packs --------------------------------------------------------------------------------
    def claim(self, key: str) -> int | None:
        """Wait until this process may pack block ``key``: a locked file descriptor (pass it to
        ``release``), or None when the block was published meanwhile or no lock can be had
        within ``WAIT_S`` (then this process packs it unlocked)."""
        try:
            fd = os.open(self._path(key, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return None
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                pass
            except OSError:
                break
            if os.path.exists(self._path(key, "plan")) or time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        os.close(fd)
        return None

    @staticmethod
    def release(fd: int | None) -> None:
        if fd is not None:
            os.close(fd)  # and with it the lock

    def _publish(self, path: str, data: bytes) -> None:
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "wb") as f:
                f.write(data)
            os.replace(temporary, path)
        except OSError:
            try:
                os.unlink(temporary)
            except OSError:
                pass


def _rows_digest(key: str, rows: int) -> int:
    return xxhash.xxh64_intdigest(key.encode() + struct.pack("<q", rows))


def _decode(data: bytes) -> PlanArrays | None:
    """A block from its published bytes, or None unless they are whole and consistent."""
    if len(data) < _HEADER.size:
        return None
    magic, size, digest = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if magic != _MAGIC or size != len(payload) or xxhash.xxh64_intdigest(payload) != digest:
        return None
    buffer = io.BytesIO(payload)
    try:
        arrays = [np.load(buffer, allow_pickle=False) for _ in range(4)]
    except (ValueError, OSError, EOFError):
        return None
    offsets, sequence, start, length = arrays
    pieces = sequence.shape
    if (
        any(a.ndim != 1 or a.dtype.kind != "i" for a in arrays)
        or start.shape != pieces
        or length.shape != pieces
        or offsets.size < 1
        or int(offsets[0]) != 0
        or int(offsets[-1]) != sequence.size
        or bool((np.diff(offsets) < 1).any())
    ):
        return None
    return PlanArrays(offsets, sequence, start, length)
