"""Worker processes that make micro-batches ahead of the training loop, and replace themselves.

Worker w of N makes micro-batches k = w, w + N, w + 2N, ... of the sampler's sequence by itself
(``worker_main.py``): the order is a pure function of the sampler, so the consumer sends no
indices, only credits. A worker stays at most ``prefetch`` batches ahead of the consumer, writes
each batch into a free slot of its ring (``ring.py``) and sends the slot's layout; the consumer
takes batch k from worker k mod N, so batches arrive in the sampler's order whatever the workers'
speeds. Per batch the consumer reads one small message, hands out tensors over the slot (aliases
of views made once per slot: ``ring.py``), and sends one small message back (a credit, plus the
worker's slots that nothing refers to any more). A batch that finds no free slot (the training
loop still holds earlier ones) travels through the pipe instead, so holding batches never blocks
the workers.

Why not torch's DataLoader workers: they send every batch's indices through a queue and every
tensor through its own shared-memory segment; measured in a gVisor sandbox, that fixed cost per
batch (0.1-1 ms) is more than the whole vectorized read of a batch, so 2 workers were slower than
none. Workers here do not import torch (the consumer makes the tensors); only the cyclic
sampler's ``torch.randperm`` does, to reproduce Megatron's permutations.

Iterations are numbered; a new one (``start``) makes the workers drop what they were doing, and
messages of older iterations are discarded (their slots freed). An exception in a worker's read
ends that iteration and is raised in the consumer with the worker's traceback.

Nothing here waits without a bound. Writes to a worker never block (``Channel.unblock``: what a
full pipe cannot take is written while the consumer waits anyway); a wait for a batch wakes every
second to check that the worker lives; ``close`` kills what does not stop in time. A worker that
exits (any signal or exit code, at start or mid-epoch), or that sends nothing for
``worker_timeout`` seconds while the training loop waits for its batch (stopped, stuck in a read;
one still starting progresses while it uses the CPU), is killed and replaced (``health.py``): the
new process starts at the first micro-batch the lost one still owed, so the loop receives the
same batches as without the fault. A warning at half the
timeout names the slow worker and what it is reading. An exception raised in the training
process while it waits (its own signal handler's ``TimeoutError``, a ``KeyboardInterrupt``)
propagates as itself.
"""

from __future__ import annotations

import collections
import multiprocessing
import pickle
import select
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from ..contract import LoaderDataset
from .channel import Channel
from .collate import PACKING_COUNTS
from .health import (
    Fault,
    WorkerError,
    WorkerHealth,
    cpu_time,
    doing,
    logger,
    read_budget,
    stack_of,
)
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
from .plan_folders import PlanFolder, make_plan_folder, remove_plan_folder
from .ring import ConsumerRing
from .sampler import BatchSampler
from .worker_main import WorkerStart, group_size, worker_main

__all__ = ["Worker", "WorkerError", "WorkerPool", "WorkerProcess"]

_LIVENESS_S = 1.0  # how often a waiting consumer checks that the worker is still there
_STOP_S = 5.0  # how long close() waits for workers to stop before it kills them


@dataclass(eq=False, slots=True)
class WorkerProcess:
    """One worker process and what the training process holds of it. A replacement is a new
    record, made whole by ``WorkerPool._start``: nothing of the lost process is carried over."""

    process: BaseProcess
    commands: Channel[Command]
    results: Channel[Result]
    heard: float
    """When bytes last went to the worker (its dataset, a command), or a starting worker was
    last seen using the CPU (``time.monotonic``)."""
    ring: ConsumerRing | None = None
    """Its shared-memory slots, once it has said where (``RingMapped``)."""
    lent: list[int] = field(default_factory=list)
    """Its slots in batches handed to the training loop, maybe still referenced."""
    freed: list[int] = field(default_factory=list)
    """Its slots that nothing refers to any more, given back with the next credit."""
    pending: collections.deque[Entry] = field(default_factory=collections.deque)
    """Micro-batches received, not yet handed out."""
    credits: int = 0
    """Batches taken from it since its last credit."""
    started: bool = False
    """It said "ready": its dataset is loaded."""
    cpu: int | None = None
    """CPU time of a starting worker, last seen (``health.cpu_time``)."""


@dataclass(eq=False, slots=True)
class Worker:
    """Worker w of a pool: the process serving it ``now`` (replaced in one assignment) and what
    outlives a replacement."""

    now: WorkerProcess
    failed_starts: int = 0
    """Starts of worker w ended by its own error before "ready" (``health.Fault``)."""
    delivered: int | None = None
    """Its last micro-batch of this iteration handed out."""
    lost: tuple[Fault, float] | None = None
    """The fault being repaired and when the loop began to wait, until the replacement's first
    batch arrives."""


class WorkerPool:
    """``num_workers`` processes making micro-batches of ``dataset`` for one consumer."""

    def __init__(
        self,
        dataset: LoaderDataset,
        *,
        num_workers: int,
        prefetch: int,
        context: str | None,
        shared_memory: bool = True,
        health: WorkerHealth | None = None,
    ) -> None:
        self._ctx = multiprocessing.get_context(context)
        self.health = health if health is not None else WorkerHealth(context=context)
        self.prefetch = prefetch
        # in flight, plus the batch in use and the one before it; none: every batch by pipe
        self.slots = prefetch + 2 if shared_memory else 0
        self._group = group_size(prefetch)  # credits a worker waits for before it reads
        fork = self._ctx.get_start_method() == "fork"
        self._dataset = dataset if fork else None  # inherited by a forked worker
        self._payload = None if fork else pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL)
        self._changes: list[SetWeights] = []  # sent after the payload to a worker started later
        self.num_workers = num_workers
        self._workers: list[Worker] = []  # worker w: its process now, what outlives it
        self._abandoned: list[BaseProcess] = []  # killed, not ended in time (a stuck kernel read)
        self._ever_started = False  # some worker of this pool has said "ready"
        self._backlog = False  # some worker's pipe has bytes waiting to be written
        self._generation = 0
        self._sampler: BatchSampler | None = None
        folder = make_plan_folder(dataset)
        self._plans = None if folder is None else folder.path
        self._finalizer = weakref.finalize(self, _stop, self._workers, self._abandoned, folder)
        for w in range(num_workers):
            self._start(w)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def alive(self) -> bool:
        """Not closed, and every worker process still running."""
        return self._finalizer.alive and all(p.is_alive() for p in self.processes)

    @property
    def processes(self) -> list[BaseProcess]:
        """The worker processes now, worker w's at w."""
        return [worker.now.process for worker in self._workers]

    @property
    def _rings(self) -> list[ConsumerRing | None]:
        """Each worker's ring (None until it has mapped one); read by tests."""
        return [worker.now.ring for worker in self._workers]

    @property
    def _lent(self) -> list[list[int]]:
        """Each worker's slots handed out in batches; read by tests."""
        return [worker.now.lent for worker in self._workers]

    @property
    def generation(self) -> int:
        """Number of the latest iteration started."""
        return self._generation

    def batches(self, sampler: BatchSampler) -> Iterator[Any]:
        """Start an iteration (it ends the one before): the sampler's micro-batches, made by the
        workers, in order (dicts of tensors over slots, or whatever the dataset returned when a
        batch travelled through the pipe)."""
        self._generation += 1
        return self._batches(sampler, self._generation)

    def _batches(self, sampler: BatchSampler, generation: int) -> Iterator[Any]:
        n, workers = self.num_workers, self._workers
        self._sampler = sampler
        self._reclaim()
        for w, worker in enumerate(workers):
            now = worker.now
            # batches of an abandoned iteration that were received but never handed out
            now.freed.extend(slot for _, slot, _ in now.pending if slot is not None)
            now.pending.clear()
            now.credits = 0
            worker.delivered = None
            self._send(w, Start(generation, sampler, w, self.prefetch, self._take_freed(w)))
        for k in range(len(sampler)):
            if generation != self._generation:
                raise RuntimeError("a newer iteration of this loader has started; this one is over")
            w = k % n
            slot, batch = self._next(w, generation, k)
            now = workers[w].now  # after _next, which may have replaced the worker
            if slot is not None:
                ring = now.ring
                assert ring is not None
                batch = ring.tensors(slot, batch)
                now.lent.append(slot)
            now.credits += 1
            if now.credits >= self._group:  # enough for the worker's next read
                self._reclaim()
                self._flush(w, generation)
            yield batch
            del batch  # the slot is free once the training loop drops the batch

    def change_weights(self, start: int, weights: tuple[float, ...] | None) -> None:
        """Every worker changes its copy of the blend as the training process's changed
        (``loader.set_weights``); a worker started later from the pickled dataset, too. The
        next ``batches`` makes them drop the micro-batches made ahead and remake them."""
        change = SetWeights(start, weights)
        if self._payload is not None:  # fork: a replacement inherits the changed dataset
            self._changes.append(change)
        for w in range(self.num_workers):
            self._send(w, change)

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self._finalizer()

    # -- starting and replacing workers ---------------------------------------------------------
    def _start(self, w: int) -> None:
        """Start worker w, or its replacement (its dataset, under spawn and forkserver, follows
        through its pipe): one new ``WorkerProcess``, whatever the lost one left behind."""
        command_out, command_in = self._ctx.Pipe(duplex=False)
        result_out, result_in = self._ctx.Pipe(duplex=False)
        start = WorkerStart(
            worker=w,
            workers=self.num_workers,
            dataset=self._dataset,
            commands=Channel(command_out),
            results=Channel(result_in),
            slots=self.slots,
            read_budget=read_budget(self.health.timeout),
            plan_folder=self._plans,
        )
        process = self._ctx.Process(  # type: ignore[attr-defined]  # every context has it
            target=worker_main, args=(start,), name=f"tokenload-worker-{w}", daemon=True
        )
        process.start()
        command_out.close()
        result_in.close()
        commands: Channel[Command] = Channel(command_in)
        commands.unblock()
        now = WorkerProcess(process, commands, Channel(result_out), heard=time.monotonic())
        if w < len(self._workers):
            self._workers[w].now = now
        else:
            self._workers.append(Worker(now))
        if self._payload is not None:
            self._send(w, LoadDataset(self._payload))
            for change in self._changes:  # set_weights since the payload was made
                self._send(w, change)

    def _replace(self, w: int, k: int, cause: str, waited_since: float) -> None:
        """Worker w is lost while micro-batch k is awaited: count it (WorkerError past the budget),
        end it, and start a new worker w at micro-batch k."""
        worker = self._workers[w]
        process, started = worker.now.process, worker.now.started
        stack = stack_of(process.pid) if cause == "stalled" else None
        if process.is_alive():
            process.kill()  # SIGKILL ends a stopped process too
        process.join(_LIVENESS_S)
        fault = Fault(w, process.pid, cause, process.exitcode, worker.delivered, started)
        fault.stack = stack
        if started:
            worker.failed_starts = 0
        elif fault.own_start_error:  # not a signal (that counts against the budget only)
            worker.failed_starts += 1
        repeated = worker.failed_starts > 1 and not self._ever_started
        self.health.fault(fault, repeated_start=repeated)
        if process.is_alive():  # in a kernel read that even SIGKILL waits for: reaped at close
            self._abandoned.append(process)
        worker.now.commands.close()
        worker.now.results.close()
        lost = worker.lost
        worker.lost = (fault, lost[1] if lost is not None else waited_since)
        self._start(w)
        self._send(w, Start(self._generation, self._sampler, k, self.prefetch, []))

    # -- consumer side of the protocol -----------------------------------------------------------
    def _next(self, w: int, generation: int, k: int) -> tuple[int | None, Any]:
        """(slot, layout) or (None, batch) of micro-batch k, from worker w."""
        worker = self._workers[w]
        while not worker.now.pending:
            self._reclaim()
            if worker.now.credits or worker.now.freed:  # the worker may be waiting for these
                self._flush(w, generation)
            message = self._recv(w, k)
            now = worker.now  # after _recv, which may have replaced the worker
            if isinstance(message, Ready):
                now.started = self._ever_started = True
            elif isinstance(message, RingMapped):
                self._map_ring(w, k, message)
            elif message.generation != generation:  # left over from an abandoned iteration
                if isinstance(message, Batches):
                    now.freed.extend(slot for _, slot, _ in message.entries if slot is not None)
            elif isinstance(message, Failed):
                _raise_from_worker(w, message.step, message.error, message.traceback)
            else:
                now.pending.extend(message.entries)
                lost = worker.lost
                if lost is not None:  # a replacement's first batches
                    self.health.recovered(lost[0], time.monotonic() - lost[1])
                    worker.lost = None
        got, slot, batch = worker.now.pending.popleft()
        assert got == k, (got, k)
        worker.delivered = k
        return slot, batch

    def _recv(self, w: int, k: int) -> Result:
        """The next message of worker w, replacing the worker while it is lost (exited, or silent
        for ``worker_timeout`` seconds while micro-batch k is awaited)."""
        began = time.monotonic()
        warned = False
        worker = self._workers[w]
        while True:
            now = worker.now  # a new one after each replacement
            results = now.results
            try:
                if self._wait(w, _LIVENESS_S):
                    return results.recv()
            except EOFError:  # the worker's end of its pipe closed: it exited
                now.process.join(_LIVENESS_S)
            clock = time.monotonic()
            if not now.process.is_alive():
                self._replace(w, k, "exited", began)
                continue
            timeout = self.health.timeout
            if timeout is None:
                continue
            if not now.started and cpu_time(now.process.pid) != now.cpu:
                # still starting (imports, loading its dataset) and using the CPU: not stuck
                now.cpu, now.heard = cpu_time(now.process.pid), clock
            quiet = clock - max(began, results.heard, now.heard)
            if quiet >= timeout:
                self._replace(w, k, "stalled", began)
            elif quiet >= timeout / 2 and not warned:
                warned = True
                process = now.process
                stack = stack_of(process.pid)
                logger.warning(
                    "loader worker %d (pid %s) has sent nothing for %.0f s while the training loop"
                    " waits for its micro-batch %d (%s); it is replaced at worker_timeout=%g s%s",
                    w,
                    process.pid,
                    quiet,
                    k,
                    doing(process.pid) or "state unknown",
                    timeout,
                    f"; its stack now:\n{stack}" if stack else "",
                )

    def _wait(self, w: int, timeout: float) -> bool:
        """Whether a whole message of worker w has arrived, waiting up to ``timeout`` seconds,
        meanwhile writing what waits to be sent to any worker."""
        results = self._workers[w].now.results
        if not self._backlog:
            return results.poll(timeout)
        owed = [worker.now for worker in self._workers if worker.now.commands.pending]
        poller = select.poll()
        poller.register(results.fileno(), select.POLLIN)
        for now in owed:
            poller.register(now.commands.fileno(), select.POLLOUT)
        poller.poll(timeout * 1000)
        for now in owed:
            try:
                if now.commands.drain():
                    now.heard = time.monotonic()
            except BrokenPipeError:  # that worker is gone: noticed when its batch is awaited
                pass
        self._backlog = any(worker.now.commands.pending for worker in self._workers)
        return results.poll(0)

    def _map_ring(self, w: int, k: int, message: RingMapped) -> None:
        now = self._workers[w].now
        try:
            # the packing counts come as bytes (the loader adds them up itself: no tensor)
            now.ring = ConsumerRing(
                message.path, message.slot_bytes, message.slots, frozenset({PACKING_COUNTS})
            )
        except FileNotFoundError:  # its memory went with it: the worker died after naming it
            now.process.join(_LIVENESS_S)
            if now.process.is_alive():
                raise WorkerError(
                    f"cannot open loader worker {w}'s batch memory {message.path}",
                    hint="pass shared_memory=False to send batches through pipes instead",
                ) from None
            self._replace(w, k, "exited", time.monotonic())

    def _send(self, w: int, message: Command) -> None:
        commands = self._workers[w].now.commands
        try:
            commands.send(message)  # never blocks (Channel.unblock)
        except BrokenPipeError:  # the worker is gone: replaced when its next batch is awaited
            pass
        if commands.pending:
            self._backlog = True  # written by _wait

    def _reclaim(self) -> None:
        """Move lent slots that nothing refers to any more to the free lists."""
        for worker in self._workers:
            now = worker.now
            lent, ring = now.lent, now.ring
            if lent and ring is not None:
                busy = [s for s in lent if ring.in_use(s)]
                if len(busy) != len(lent):
                    now.freed.extend(s for s in lent if s not in busy)
                    now.lent = busy

    def _flush(self, w: int, generation: int) -> None:
        """Send worker w its credits and freed slots."""
        now = self._workers[w].now
        self._send(w, Credit(generation, now.credits, self._take_freed(w)))
        now.credits = 0

    def _take_freed(self, w: int) -> list[int]:
        now = self._workers[w].now
        freed, now.freed = now.freed, []
        return freed


def _raise_from_worker(w: int, k: int | None, exc: BaseException | None, text: str) -> None:
    what = "loading the dataset" if k is None else f"reading micro-batch {k} of this iteration"
    where = f"in loader worker {w}, {what}:\n{text}"
    if exc is None:
        raise WorkerError(f"the dataset raised an exception that cannot be pickled {where}")
    if hasattr(exc, "add_note"):
        exc.add_note(where)
    raise exc


def _stop(
    workers: list[Worker], abandoned: list[BaseProcess], plans: PlanFolder | None = None
) -> None:
    """Ask every worker to stop; kill those still running after ``_STOP_S`` (a stopped or stuck
    worker cannot answer); close the pipes and remove the plans' folder. Bounded whatever the
    workers do."""
    current = [worker.now for worker in workers]
    for now in current:
        try:
            now.commands.send(Stop())
        except OSError:
            pass
        if now.commands.pending:  # still reading its dataset (or stuck): nothing to stop gracefully
            now.process.kill()
    deadline = time.monotonic() + _STOP_S
    for now in current:
        now.process.join(max(0.0, deadline - time.monotonic()))
    for p in (*(now.process for now in current), *abandoned):
        if p.is_alive():
            p.kill()
            p.join(_LIVENESS_S)
    for now in current:
        now.commands.close()
        now.results.close()
    remove_plan_folder(plans)
