"""The worker process's side of ``workers.py``: load the dataset, then make this worker's
micro-batches k = w, w + N, ... (from the one the consumer asks for) while credits allow.

Under fork the dataset is inherited; under spawn and forkserver it arrives pickled as the first
message on the worker's command pipe (not as a ``Process`` argument: CPython writes those into the
child's pipe before it closes its own copy of the child's end, so a child that dies at start
would hang ``process.start()`` on a payload larger than a pipe buffer). The worker then says
"ready". A dataset that cannot be loaded is an error of the data, not of the process: it is
reported at the next iteration's start and raised in the training process, typed. Workers ignore
SIGINT (Ctrl-C belongs to the training process) and exit when told to, when their pipe closes,
or when their parent process is gone.
"""

from __future__ import annotations

import gc
import itertools
import os
import pickle
import signal
import traceback
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from ..contract import PIECE_FIRST, PIECE_KEYS, PIECE_LENGTH, Allocator, Batch, LoaderDataset
from ..storage.options import retry_reads_for
from .channel import Channel
from .collate import fetch, finish
from .health import WorkerError, record_stacks
from .messages import (
    Batches,
    Command,
    Credit,
    Entry,
    Failed,
    LoadDataset,
    Ready,
    Result,
    RingMapped,
    SetWeights,
    Start,
    Stop,
)
from .ring import WorkerRing, batch_bytes

_LIVENESS_S = 1.0  # how often a waiting worker checks that its parent is still there
_GROUP = 4  # most micro-batches a worker reads at once (one vectorized read; measured per batch
# of 16 at S = 2048: 113 us alone, 87 us in twos, 75 us in fours)


def group_size(prefetch: int) -> int:
    """Micro-batches a worker reads at once: half its prefetch, so it reads while the consumer
    still has the other half to take."""
    return max(1, min(_GROUP, prefetch // 2))


class WorkerStart(NamedTuple):
    """What a worker process starts with (``worker_main``'s one argument)."""

    worker: int
    """Its number w: it makes micro-batches w, w + N, ..."""
    workers: int
    """N, the pool's number of workers."""
    dataset: LoaderDataset | None
    """Inherited under fork; None under spawn and forkserver (it follows through ``commands``)."""
    commands: Channel[Command]
    results: Channel[Result]
    slots: int
    """Slots of its shared-memory ring (0: every batch through ``results``)."""
    read_budget: float | None = None
    """How long its object-storage reads may retry (``health.read_budget``)."""
    plan_folder: str | None = None
    """Where the pool's workers share the plans they make (a dataset's ``share_plans``)."""


def worker_main(start: WorkerStart) -> None:
    # Forked, this process shares the training process's memory until either writes a page. A
    # garbage collection here would write to every object inherited (its GC header) and so copy
    # every page holding one: measured +43 MB of private memory per worker at one collection,
    # the training process holding torch's modules. Frozen, they are never scanned here (their
    # cycles are the training process's to collect); what this process makes is collected as
    # usual. Under spawn and forkserver nothing is inherited: only the imports are frozen.
    gc.freeze()
    dataset, commands, results = start.dataset, start.commands, start.results
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    record_stacks()  # where it is stuck, should the training process find it stalled
    _no_wakeup_preemption()
    # object-storage reads retry by time, and end as a StorageError before the watchdog
    # would take this worker for a stalled one
    retry_reads_for(start.read_budget)
    parent = os.getppid()  # the training process, or the forkserver that forked this worker
    worker = None
    try:
        failed = None
        if dataset is None:  # spawn, forkserver: the dataset is the first message
            message = _wait(commands, parent)
            if not isinstance(message, LoadDataset):
                return
            try:
                dataset = pickle.loads(message.payload)
            except Exception as exc:  # the data's fault: raised in the training process
                failed = (_picklable(exc), traceback.format_exc())
        share = getattr(dataset, "share_plans", None)
        if share is not None and start.plan_folder is not None and failed is None:
            share(start.plan_folder)
        worker = _Worker(start.worker, start.workers, dataset, results, start.slots, failed)
        results.send(Ready(os.getpid()))
        while True:
            count = worker.ready()
            if count:
                worker.make(count)
                continue
            message = _wait(commands, parent)
            if message is None or isinstance(message, Stop):
                return
            if isinstance(message, (Start, Credit)):
                worker.handle(message)
            elif isinstance(message, SetWeights) and worker.failed is None:
                mixture = worker.dataset.mixture_cursors()  # loader.set_weights: same change here
                assert mixture is not None
                mixture.change_weights(message.start, message.weights)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return
    finally:
        if worker is not None and worker.ring is not None:
            worker.ring.unlink()


def _no_wakeup_preemption() -> None:
    """Run this worker as SCHED_BATCH: the same share of the CPU, but woken by a credit it no
    longer preempts the training process that sent it. Where workers and the training loop share
    a core, the loop otherwise waited for the worker's whole read inside ``next()`` after every
    long step (a sleeping worker wakes with scheduler credit). Not available: left as it is."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        pass


class _Worker:
    """A worker's state: its iteration, credits and free slots, and how it makes batches."""

    def __init__(
        self,
        w: int,
        n: int,
        dataset: LoaderDataset | None,
        results: Channel[Result],
        slots: int,
        failed: tuple[BaseException | None, str] | None,
    ) -> None:
        self.w, self.n, self.results, self.slots = w, n, results, slots
        self.dataset: LoaderDataset = dataset  # type: ignore[assignment]  # None only if failed
        self.failed = failed  # (exception, traceback) of a dataset that could not be loaded
        self.ring: WorkerRing | None = None
        self.free = list(range(slots))
        self.generation, self.credits, self.target = -1, 0, 1
        self.work: Iterator[tuple[int, list[int]]] | None = None
        self.two_stage = dataset is not None and dataset.reads_in_groups
        self.packed = dataset is not None and self.two_stage and dataset.describe_sources().packed

    def handle(self, message: Start | Credit) -> None:
        self.free.extend(message.freed)
        if isinstance(message, Start):  # from micro-batch ``first`` (w, or one a lost worker owed)
            self.generation, self.credits = message.generation, message.credits
            self.target = group_size(self.credits)  # the prefetch, at the start
            if self.failed is not None:
                exc, text = self.failed
                self.results.send(Failed(self.generation, None, exc, text))
                return
            self.work = itertools.islice(enumerate(message.sampler), message.first, None, self.n)
        elif message.generation == self.generation:
            self.credits += message.credits

    def ready(self) -> int:
        """How many micro-batches to make now (0: wait for credits or a new iteration). Waiting
        for ``target`` credits lets one vectorized read serve several micro-batches."""
        if self.work is None or self.credits < self.target:
            return 0
        if not self.two_stage or (self.ring is None and self.slots):
            return 1  # the first batch sizes the slots
        room = len(self.free) if self.slots else _GROUP  # without slots every batch takes the pipe
        return max(1, min(self.credits, room, _GROUP))

    def make(self, count: int) -> None:
        """Make up to ``count`` of this worker's next micro-batches and send them in one message."""
        first = -1
        assert self.work is not None
        try:
            steps = list(itertools.islice(self.work, count))
            if len(steps) < count:
                self.work = None
            if not steps:
                return
            first = steps[0][0]
            self.credits -= len(steps)
            slots = self.free[::-1][: len(steps)] if self.ring is not None else []
            batches = self._read([indices for _, indices in steps], slots)
        except Exception as exc:  # delivered to the consumer, which raises it
            text = traceback.format_exc()
            self.results.send(Failed(self.generation, first, _picklable(exc), text))
            self.work = None
            return
        if self.ring is None and self.slots:
            size = batch_bytes(batches[0])
            if size is not None:
                self.ring = WorkerRing(size, self.slots)
                self.results.send(RingMapped(self.ring.path, self.ring.slot_bytes, self.slots))
        entries: list[Entry] = []
        for i, ((k, _), batch) in enumerate(zip(steps, batches)):
            slot = slots[i] if i < len(slots) else None
            layout = None if slot is None or self.ring is None else self.ring.write(slot, batch)
            if slot is None or layout is None:
                entries.append((k, None, batch))
            else:
                self.free.remove(slot)
                entries.append((k, slot, layout))
        try:
            self.results.send(Batches(self.generation, entries))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # cannot travel
            # The builtin type varies with the Python version (AttributeError up to 3.13).
            error = WorkerError(
                f"a batch cannot be sent to the training process: {exc}",
                hint="make __getitems__ return arrays, numbers or strings (nothing unpicklable)",
            )
            self.results.send(Failed(self.generation, first, error, traceback.format_exc()))
            self.work = None

    def _read(self, index_lists: list[list[int]], slots: list[int]) -> list[Any]:
        """The batches of ``index_lists``; with several, one ``read_batch`` reads them all and
        each is finished into its own slot."""
        ring = self.ring
        allocs: list[Allocator | None] = (
            [ring.allocator(s) for s in slots] if ring is not None else []
        )
        allocs += [None] * (len(index_lists) - len(allocs))
        if len(index_lists) == 1 or not self.two_stage:
            return [
                fetch(self.dataset, idx, alloc, packed=self.packed)
                for idx, alloc in zip(index_lists, allocs)
            ]
        sizes = [len(idx) for idx in index_lists]
        raw = self.dataset.read_batch([i for idx in index_lists for i in idx])
        parts = _split_rows(raw, sizes)
        return [finish(self.dataset, part, alloc) for part, alloc in zip(parts, allocs)]


def _split_rows(raw: Batch, sizes: list[int]) -> list[Batch]:
    """``read_batch`` output of several micro-batches, cut back into one per micro-batch (arrays
    with a row per sample are sliced, packed rows' pieces with their rows, other values
    shared). Which keys are which is found once per read, not once per micro-batch."""
    total = sum(sizes)
    rowwise, shared = [], {}
    for k, v in raw.items():
        if k in PIECE_KEYS or k == PIECE_FIRST:
            continue
        if isinstance(v, np.ndarray) and v.ndim >= 1 and len(v) == total:
            rowwise.append(k)
        else:
            shared[k] = v
    first = raw.get(PIECE_FIRST)
    pieces = [k for k in PIECE_KEYS if k in raw] if first is not None else []
    ends = list(itertools.accumulate(sizes, initial=0))
    if first is not None:  # each micro-batch's first piece, and where the last one ends
        firsts = first.tolist()
        firsts.append(int(raw[PIECE_LENGTH].size))
        lows = [firsts[e] for e in ends]
    parts = []
    for i in range(len(sizes)):
        begin, end = ends[i], ends[i + 1]
        part = dict(shared)
        for k in rowwise:
            part[k] = raw[k][begin:end]
        if first is not None:
            low, high = lows[i], lows[i + 1]
            part[PIECE_FIRST] = first[begin:end] - low
            for k in pieces:
                part[k] = raw[k][low:high]
        parts.append(part)
    return parts


def _wait(commands: Channel[Command], parent: int) -> Command | None:
    """The next command, or None once the consumer is gone."""
    try:
        while not commands.poll(_LIVENESS_S):
            if os.getppid() != parent:
                return None
        return commands.recv()
    except (EOFError, OSError):
        return None


def _picklable(exc: BaseException) -> BaseException | None:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return None
    return exc
