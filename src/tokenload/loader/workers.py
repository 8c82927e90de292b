"""Worker processes that make micro-batches ahead of the training loop.

Worker w of N makes micro-batches k = w, w + N, w + 2N, ... of the sampler's sequence by itself:
the order is a pure function of the sampler, so the consumer sends no indices, only credits. A
worker stays at most ``prefetch`` batches ahead of the consumer, writes each batch into a free
slot of its ring (``ring.py``) and sends the slot's layout; the consumer takes batch k from worker
k mod N, so batches arrive in the sampler's order whatever the workers' speeds. Per batch the
consumer reads one small message, hands out tensors over the slot (aliases of views made once
per slot: ``ring.py``), and sends one small message back (a credit, plus the worker's slots that
nothing refers to any more). A batch that finds no free slot (the training loop still holds
earlier ones) travels through the pipe instead, so holding batches never blocks the workers.

Why not torch's DataLoader workers: they send every batch's indices through a queue and every
tensor through its own shared-memory segment; measured in a gVisor sandbox, that fixed cost per
batch (0.1-1 ms) is more than the whole vectorized read of a batch, so 2 workers were slower than
none. Workers here do not import torch (the consumer makes the tensors); only the cyclic
sampler's ``torch.randperm`` does, to reproduce Megatron's permutations.

Iterations are numbered; a new one (``start``) makes the workers drop what they were doing, and
messages of older iterations are discarded (their slots freed). An exception in a worker ends
that iteration and is raised in the consumer with the worker's traceback; a worker that dies is
noticed within a second and raised as ``WorkerError``. Workers ignore SIGINT (Ctrl-C belongs to
the training process) and exit when told to, when their pipe closes, or when their parent
process is gone.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import os
import pickle
import signal
import traceback
import weakref
from typing import Any, Iterator

from ..errors import TokenloadError
from .channel import Channel
from .collate import fetch
from .ring import ConsumerRing, WorkerRing, batch_bytes

_LIVENESS_S = 1.0  # how often a waiting side checks that the other one is still there
_STOP_S = 5.0
_GROUP = 4  # most micro-batches a worker reads at once (one vectorized read; measured per batch
# of 16 at S = 2048: 113 us alone, 87 us in twos, 75 us in fours)


class WorkerError(TokenloadError, RuntimeError):
    """A loader worker process died or could not deliver a batch."""


class WorkerPool:
    """``num_workers`` processes making micro-batches of ``dataset`` for one consumer."""

    def __init__(
        self, dataset: Any, *, num_workers: int, prefetch: int, context: str | None, shared_memory: bool = True
    ) -> None:
        ctx = multiprocessing.get_context(context)
        self.prefetch = prefetch
        # in flight, plus the batch in use and the one before it; none: every batch by pipe
        self.slots = prefetch + 2 if shared_memory else 0
        self._group = _group_size(prefetch)  # credits a worker waits for before it reads
        self.processes: list = []
        self._commands: list = []
        self._results: list = []
        for w in range(num_workers):
            command_out, command_in = ctx.Pipe(duplex=False)
            result_out, result_in = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=_worker_main,
                args=(w, num_workers, dataset, Channel(command_out), Channel(result_in), self.slots),
                name=f"tokenload-worker-{w}",
                daemon=True,
            )
            process.start()
            command_out.close()
            result_in.close()
            self.processes.append(process)
            self._commands.append(Channel(command_in))
            self._results.append(Channel(result_out))
        self._rings: list[ConsumerRing | None] = [None] * num_workers
        self._lent: list[list[int]] = [[] for _ in range(num_workers)]
        self._freed: list[list[int]] = [[] for _ in range(num_workers)]
        self._pending: list[collections.deque] = [collections.deque() for _ in range(num_workers)]
        self._credits = [0] * num_workers  # batches taken from each worker since its last credit
        self._generation = 0
        self._finalizer = weakref.finalize(self, _stop, self.processes, self._commands, self._results)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def alive(self) -> bool:
        """Not closed, and every worker process still running."""
        return self._finalizer.alive and all(p.is_alive() for p in self.processes)

    @property
    def generation(self) -> int:
        """Number of the latest iteration started."""
        return self._generation

    def batches(self, sampler: Any) -> Iterator[Any]:
        """Start an iteration (it ends the one before): the sampler's micro-batches, made by the
        workers, in order (dicts of tensors over slots, or whatever the dataset returned when a
        batch travelled through the pipe)."""
        self._generation += 1
        return self._batches(sampler, self._generation)

    def _batches(self, sampler: Any, generation: int) -> Iterator[Any]:
        n = len(self.processes)
        self._reclaim()
        for w in range(n):
            # batches of an abandoned iteration that were received but never handed out
            self._freed[w].extend(slot for _, slot, _ in self._pending[w] if slot is not None)
            self._pending[w].clear()
            self._credits[w] = 0
            self._send(w, ("start", generation, sampler, self.prefetch, self._take_freed(w)))
        for k in range(len(sampler)):
            if generation != self._generation:
                raise RuntimeError("a newer iteration of this loader has started; this one is over")
            w = k % n
            slot, batch = self._next(w, generation, k)
            if slot is not None:
                ring = self._rings[w]
                assert ring is not None
                batch = ring.tensors(slot, batch)
                self._lent[w].append(slot)
            self._credits[w] += 1
            if self._credits[w] >= self._group:  # enough for the worker's next read
                self._reclaim()
                self._flush(w, generation)
            yield batch
            del batch  # the slot is free once the training loop drops the batch

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self._finalizer()

    # -- consumer side of the protocol -----------------------------------------------------------
    def _next(self, w: int, generation: int, k: int) -> tuple:
        """(slot, layout) or (None, batch) of micro-batch k, from worker w."""
        pending = self._pending[w]
        while not pending:
            self._reclaim()
            if self._credits[w] or self._freed[w]:  # the worker may be waiting for these
                self._flush(w, generation)
            message = self._recv(w)
            kind = message[0]
            if kind == "ring":
                self._rings[w] = ConsumerRing(*message[1:])
            elif message[1] != generation:  # left over from an abandoned iteration
                if kind == "batches":
                    self._freed[w].extend(slot for _, slot, _ in message[2] if slot is not None)
            elif kind == "error":
                _raise_from_worker(w, message[2], message[3], message[4])
            else:
                pending.extend(message[2])
        got, slot, batch = pending.popleft()
        assert got == k, (got, k)
        return slot, batch

    def _recv(self, w: int) -> tuple:
        results, process = self._results[w], self.processes[w]
        try:
            while not results.poll(_LIVENESS_S):
                if not process.is_alive():
                    raise _died(w, process)
            return results.recv()
        except (EOFError, OSError):
            process.join(_LIVENESS_S)
            raise _died(w, process) from None

    def _send(self, w: int, message: tuple) -> None:
        try:
            self._commands[w].send(message)
        except OSError:
            raise _died(w, self.processes[w]) from None

    def _reclaim(self) -> None:
        """Move lent slots that nothing refers to any more to the free lists."""
        for w, lent in enumerate(self._lent):
            ring = self._rings[w]
            if lent and ring is not None:
                busy = [s for s in lent if ring.in_use(s)]
                if len(busy) != len(lent):
                    self._freed[w].extend(s for s in lent if s not in busy)
                    self._lent[w] = busy

    def _flush(self, w: int, generation: int) -> None:
        """Send worker w its credits and freed slots."""
        self._send(w, ("credit", generation, self._credits[w], self._take_freed(w)))
        self._credits[w] = 0

    def _take_freed(self, w: int) -> list[int]:
        freed, self._freed[w] = self._freed[w], []
        return freed


def _group_size(prefetch: int) -> int:
    """Micro-batches a worker reads at once: half its prefetch, so it reads while the consumer
    still has the other half to take."""
    return max(1, min(_GROUP, prefetch // 2))


def _died(w: int, process) -> WorkerError:
    code = process.exitcode
    return WorkerError(
        f"loader worker {w} (pid {process.pid}) exited unexpectedly with exit code {code}",
        hint="a negative code is the signal that killed it (-9: often the out-of-memory killer); see its log above",
    )


def _raise_from_worker(w: int, k: int, exc: BaseException | None, text: str) -> None:
    where = f"in loader worker {w}, reading micro-batch {k} of this iteration:\n{text}"
    if exc is None:
        raise WorkerError(f"the dataset raised an exception that cannot be pickled {where}")
    if hasattr(exc, "add_note"):
        exc.add_note(where)
    raise exc


def _stop(processes: list, commands: list, results: list) -> None:
    for c in commands:
        try:
            c.send(("stop",))
        except OSError:
            pass
    for p in processes:
        p.join(_STOP_S)
        if p.is_alive():
            p.terminate()
            p.join(_STOP_S)
    for c in (*commands, *results):
        c.close()


# -- worker side -----------------------------------------------------------------------------------
def _worker_main(w: int, n: int, dataset: Any, commands, results, slots: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _no_wakeup_preemption()
    parent = os.getppid()  # the training process, or the forkserver that forked this worker
    worker = _Worker(w, n, dataset, results, slots)
    try:
        while True:
            count = worker.ready()
            if count:
                worker.make(count)
                continue
            message = _wait(commands, parent)
            if message is None or message[0] == "stop":
                return
            worker.handle(message)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return
    finally:
        if worker.ring is not None:
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

    def __init__(self, w: int, n: int, dataset: Any, results, slots: int) -> None:
        self.w, self.n, self.dataset, self.results, self.slots = w, n, dataset, results, slots
        self.ring: WorkerRing | None = None
        self.free = list(range(slots))
        self.generation, self.credits, self.target, self.work = -1, 0, 1, None
        self.two_stage = hasattr(dataset, "read_batch") and hasattr(dataset, "finish_batch")

    def handle(self, message: tuple) -> None:
        self.free.extend(message[-1])
        if message[0] == "start":
            _, self.generation, sampler, self.credits, _ = message
            self.target = _group_size(self.credits)  # the prefetch, at the start
            self.work = itertools.islice(enumerate(sampler), self.w, None, self.n)
        elif message[1] == self.generation:
            self.credits += message[2]

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
            self.results.send(("error", self.generation, first, _picklable(exc), traceback.format_exc()))
            self.work = None
            return
        if self.ring is None and self.slots:
            size = batch_bytes(batches[0])
            if size is not None:
                self.ring = WorkerRing(size, self.slots)
                self.results.send(("ring", self.ring.path, self.ring.slot_bytes, self.slots))
        entries = []
        for i, ((k, _), batch) in enumerate(zip(steps, batches)):
            slot = slots[i] if i < len(slots) else None
            layout = None if slot is None or self.ring is None else self.ring.write(slot, batch)
            if layout is None:
                entries.append((k, None, batch))
            else:
                self.free.remove(slot)
                entries.append((k, slot, layout))
        try:
            self.results.send(("batches", self.generation, entries))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # a batch that cannot travel
            # The builtin type varies with the Python version (AttributeError up to 3.13).
            error = WorkerError(
                f"a batch cannot be sent to the training process: {exc}",
                hint="make __getitems__ return arrays, numbers or strings (nothing unpicklable)",
            )
            self.results.send(("error", self.generation, first, error, traceback.format_exc()))
            self.work = None

    def _read(self, index_lists: list, slots: list[int]) -> list:
        """The batches of ``index_lists``; with several, one ``read_batch`` reads them all and
        each is finished into its own slot."""
        allocs = [self.ring.allocator(s) for s in slots] if self.ring is not None else []
        allocs += [None] * (len(index_lists) - len(allocs))
        if len(index_lists) == 1 or not self.two_stage:
            return [fetch(self.dataset, idx, alloc) for idx, alloc in zip(index_lists, allocs)]
        sizes = [len(idx) for idx in index_lists]
        raw = self.dataset.read_batch([i for idx in index_lists for i in idx])
        parts = _split_rows(raw, sizes)
        return [self.dataset.finish_batch(part, alloc) for part, alloc in zip(parts, allocs)]


def _split_rows(raw: dict, sizes: list[int]) -> list[dict]:
    """``read_batch`` output of several micro-batches, cut back into one per micro-batch (arrays
    with a row per sample are sliced, other values shared)."""
    total = sum(sizes)
    parts = []
    begin = 0
    for size in sizes:
        end = begin + size
        parts.append({
            k: v[begin:end] if getattr(v, "ndim", 0) >= 1 and len(v) == total else v for k, v in raw.items()
        })
        begin = end
    return parts


def _wait(commands, parent: int):
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
