"""Slots of shared memory that carry finished batches from a loader worker to its consumer.

Why: moving a batch between processes the usual way (one shared-memory segment per tensor,
created, passed as a file descriptor over a socket and unmapped again, as torch's DataLoader
does) costs more than reading the batch when reads are vectorized: measured ~1 ms of IPC per
batch on the 2-core development VM against ~0.2 ms for the read. Here each worker owns one
region of ``slots`` fixed-size slots, created once and mapped by both sides; a worker builds a
batch's fields straight into a free slot (``allocator``) and only its layout (names, dtypes,
shapes, offsets: a few hundred bytes) crosses the pipe. The consumer hands out zero-copy tensors
over the slot, and a slot is reused only when nothing refers to it any more.

Tensors over a slot are made once per slot and layout (a uint8 tensor over the slot's memory and
one typed view per field), so a hand-over is one ``detach`` per field: a fresh alias the training
loop may reshape in place without touching the cached view. Measured CPU per hand-over of 4
fields of 16 x 2048 (layout unpickled, tensors made, idle slots found), 2-core VM: after a 2 ms
sleep (a training step) 67 us for arrays plus ``torch.from_numpy`` against 48 us; back to back
8.2 against 4.6 us. Handing out the cached views themselves would save ~15 us more after a sleep,
but a loop's in-place reshape or ``.data =`` would then reach later batches. A loop's
``share_memory_()`` (or a tensor pickled for a ``torch.multiprocessing`` queue) moves the data of
the slot's one storage, and so of every alias, into a segment of its own: the consumer sees the
storage's data pointer leave the slot and makes the slot's views again (``_SlotTensors.moved``).
Every tensor, view or NumPy array made from an alias keeps a reference to the slot's storage, so
the storage's use count (and the reference count of its Python object, which is what a loop
holding only ``untyped_storage()`` keeps) says whether any of them is still alive. ``arrays``
lends NumPy arrays instead: every array over slot i is a view of one uint8 array per slot (NumPy
makes that array the ``base`` of all views of it), whose reference count says the same for them.
A batch that does not fit, or that is not a dict of numeric arrays, travels through the pipe
instead.

On Linux the region is an anonymous ``memfd`` that the consumer opens through the worker's
``/proc/<pid>/fd`` entry: it has no name, so nothing is left behind when either side dies,
whatever the signal. Elsewhere it is a file on tmpfs (``/dev/shm`` when writable), unlinked as
soon as the consumer has mapped it. The mapping lives as long as the processes that hold it. All
of this is local to one loader on one host: nothing in it grows with the number of ranks.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import sys
import tempfile
from typing import Any

import numpy as np

from ..contract import Allocator

_ALIGN = 64  # every field starts on a cache line
_SHM = "/dev/shm"

Layout = tuple[tuple[str, str, tuple[int, ...], int], ...]
"""(name, dtype string, shape, byte offset) of every field of a batch in its slot."""


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def batch_bytes(batch: Any) -> int | None:
    """Bytes a batch takes in a slot, or None when it cannot go into one (not a dict of numeric
    arrays)."""
    if not isinstance(batch, dict):
        return None
    total = 0
    for value in batch.values():
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
            return None
        total += _aligned(value.nbytes)
    return total


class WorkerRing:
    """The worker's side: creates the slot file and writes batches into slots."""

    def __init__(self, slot_bytes: int, slots: int) -> None:
        self.slot_bytes = -(-max(slot_bytes, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.slots = slots
        if hasattr(os, "memfd_create"):
            # Linux: memory with no name anywhere, so nothing can be left behind when processes
            # die; the consumer opens it through this process's /proc entry.
            self._fd: int | None = os.memfd_create("tokenload-ring", os.MFD_CLOEXEC)
            self.path = f"/proc/{os.getpid()}/fd/{self._fd}"
            fd = self._fd
        else:
            folder = _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK) else None
            fd, self.path = tempfile.mkstemp(prefix="tokenload-ring-", dir=folder)
            self._fd = None
        try:
            os.ftruncate(fd, self.slot_bytes * slots)
            self._map = mmap.mmap(fd, self.slot_bytes * slots)
        finally:
            if self._fd is None:
                os.close(fd)

        self._memory = np.frombuffer(self._map, dtype=np.uint8)
        self._address = self._memory.ctypes.data
        self._used = [0] * slots  # bytes handed out by each slot's allocator
        # the arrays each slot's allocator handed out, by id: (the array, its offset), so that
        # ``write`` finds them without asking NumPy for their address (~0.8 us a field)
        self._made: list[dict[int, tuple[np.ndarray, int]]] = [{} for _ in range(slots)]

    def allocator(self, slot: int) -> Allocator:
        """An allocator (``items.Allocator``) that places arrays in ``slot`` while they fit (then
        in ordinary memory), so a batch built with it needs no copy into the slot."""
        self._used[slot] = 0
        made = self._made[slot]
        made.clear()
        begin = slot * self.slot_bytes

        def alloc(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            dt = np.dtype(dtype)
            count = math.prod(shape)
            at = self._used[slot]
            if at + count * dt.itemsize > self.slot_bytes:
                return np.empty(shape, dtype=dt)
            nbytes = count * dt.itemsize
            self._used[slot] = at + _aligned(nbytes)
            out = self._memory[begin + at : begin + at + nbytes].view(dt).reshape(shape)
            made[id(out)] = (out, at)
            return out

        return alloc

    def write(self, slot: int, batch: dict[str, np.ndarray]) -> Layout | None:
        """Place ``batch`` in ``slot`` (arrays made by its allocator stay where they are, others
        are copied after them); its layout, or None when it does not fit."""
        if batch_bytes(batch) is None:
            return None
        begin = slot * self.slot_bytes
        layout = []
        for name, value in batch.items():
            offset = self._offset(slot, value)
            if offset is None:
                offset = self._used[slot]
                if offset + value.nbytes > self.slot_bytes:
                    return None
                self._used[slot] = offset + _aligned(value.nbytes)
                if value.size:
                    target = self._memory[begin + offset : begin + offset + value.nbytes].view(
                        value.dtype
                    )
                    np.copyto(target.reshape(value.shape), value, casting="no")
            layout.append((name, value.dtype.str, value.shape, offset))
        self._used[slot] = 0
        self._made[slot].clear()
        return tuple(layout)

    def _offset(self, slot: int, value: np.ndarray) -> int | None:
        """Where ``value`` lies in ``slot`` when its allocator made it (contiguous, inside), else
        None."""
        if not value.size or not value.flags.c_contiguous:  # (strides set in place, say)
            return None
        made = self._made[slot].get(id(value))
        if made is not None and made[0] is value:
            return made[1]
        # else a view of an array it made (NumPy names the ring's memory as every view's base),
        # found by its address; an array of other memory is copied
        if value.base is not self._memory:
            return None
        at = value.ctypes.data - self._address - slot * self.slot_bytes
        return at if at >= 0 and at + value.nbytes <= self.slot_bytes else None

    def unlink(self) -> None:
        """Remove the file's name, if it has one (the consumer does this once it has mapped it;
        a worker does it when it stops, in case the consumer never got that far)."""
        if _named(self.path):
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


class ConsumerRing:
    """The consumer's side: maps a worker's slot file and lends tensors or arrays over its slots."""

    def __init__(
        self, path: str, slot_bytes: int, slots: int, raw: frozenset[str] = frozenset()
    ) -> None:
        """``raw``: fields that ``tensors`` gives as a copy of their bytes, not as a tensor (a
        field the loader consumes itself, such as the packing counts: no tensor to make, and
        nothing of the slot held)."""
        self._raw = raw
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), slot_bytes * slots)
        if _named(path):
            os.unlink(path)
        self._slot_bytes = slot_bytes
        self._slots = [
            np.frombuffer(self._map, dtype=np.uint8, count=slot_bytes, offset=i * slot_bytes)
            for i in range(slots)
        ]
        # references held by this object alone (the list entry and getrefcount's argument)
        self._idle = sys.getrefcount(self._slots[0])
        self._tensors: list[_SlotTensors | None] = [None] * slots

    def arrays(self, slot: int, layout: Layout) -> dict[str, np.ndarray]:
        """Writable arrays over ``slot``; the slot stays lent while any of them (or anything
        made from them without copying) is alive."""
        whole = self._slots[slot]
        out = {}
        for name, dtype, shape, offset in layout:
            dt = np.dtype(dtype)
            size = dt.itemsize * math.prod(shape)
            out[name] = whole[offset : offset + size].view(dt).reshape(shape)
        return out

    def tensors(self, slot: int, layout: Layout) -> dict[str, Any]:
        """Writable torch tensors over ``slot`` (fresh aliases of views made once per slot and
        layout); the slot stays lent while any of them, or anything made from them without
        copying, is alive. Arrays (``arrays``) where torch cannot count references to a storage
        or has no dtype for a field."""
        made = self._tensors[slot]
        begin = slot * self._slot_bytes
        if made is None or made.layout != layout or made.moved():
            made = _SlotTensors.make(self._map, begin, self._slot_bytes, layout, self._raw)
            if made is None:
                return self.arrays(slot, layout)
            made.settle()
            self._tensors[slot] = made
        out: dict[str, Any] = {name: view.detach() for name, view in made.fields.items()}
        for name, (offset, nbytes) in made.raw.items():
            out[name] = self._map[begin + offset : begin + offset + nbytes]
        return out

    def in_use(self, slot: int) -> bool:
        if sys.getrefcount(self._slots[slot]) > self._idle:
            return True
        made = self._tensors[slot]
        # tensors whose storage was moved out of the slot (``moved``) no longer refer to it
        return made is not None and not made.moved() and made.in_use()


class _SlotTensors:
    """The tensors over one slot for one layout: a view per field, and the slot storage's Python
    object with the reference counts they leave when nothing else refers to the slot."""

    def __init__(
        self,
        layout: Layout,
        fields: dict[str, Any],
        storage: Any,
        use_count: Any,
        raw: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.layout, self.fields, self.storage, self._use_count = layout, fields, storage, use_count
        self.raw = raw or {}
        """Fields given as bytes: (offset in the slot, bytes)."""
        self._address = storage._cdata
        self._data = storage.data_ptr()
        self._idle_uses = self._idle_refs = 0

    def moved(self) -> bool:
        """Whether the storage's data left the slot: ``share_memory_()`` on any of its tensors
        (which pickling one for a ``torch.multiprocessing`` queue does) copies the data into a
        shared segment of its own and points the storage, so every view of it, there. These views
        would then show that copy, frozen, and never the slot's later batches: they are made
        again."""
        return bool(self.storage.data_ptr() != self._data)

    def settle(self) -> None:
        """Take the counts of the idle slot (called once the frames that made these are gone)."""
        self._idle_uses = self._use_count(self._address)
        self._idle_refs = sys.getrefcount(self.storage)

    @classmethod
    def make(
        cls,
        buffer: mmap.mmap,
        begin: int,
        size: int,
        layout: Layout,
        raw: frozenset[str] = frozenset(),
    ) -> _SlotTensors | None:
        """Views over ``buffer[begin : begin + size]`` per field of ``layout`` but the ``raw``
        ones (their offsets and sizes); None when torch cannot count a storage's references or
        has no dtype for a field."""
        import torch

        use_count = getattr(torch._C, "_storage_Use_Count", None)
        dtypes = [_torch_dtype(dtype) for _, dtype, _, _ in layout]
        if use_count is None or None in dtypes:
            return None
        whole = torch.frombuffer(buffer, dtype=torch.uint8, count=size, offset=begin)
        fields, spans = {}, {}
        for (name, dtype, shape, offset), dt in zip(layout, dtypes):
            nbytes = np.dtype(dtype).itemsize * math.prod(shape)
            if name in raw:
                spans[name] = (offset, nbytes)
            else:
                fields[name] = whole[offset : offset + nbytes].view(dt).view(shape)
        return cls(layout, fields, whole.untyped_storage(), use_count, spans)

    def in_use(self) -> bool:
        """Whether a tensor, view, array or storage object besides these views refers to the
        slot."""
        uses = self._use_count(self._address)
        return uses > self._idle_uses or sys.getrefcount(self.storage) > self._idle_refs


@functools.cache
def _torch_dtype(dtype: str) -> Any:
    """The torch dtype of a NumPy dtype string, or None when torch has none (as ``from_numpy``)."""
    import torch

    try:
        return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype
    except (TypeError, ValueError):
        return None


def _named(path: str) -> bool:
    """Whether the slot memory is a file with a name (not a worker's anonymous memfd)."""
    return not path.startswith("/proc/")
