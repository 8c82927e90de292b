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
from multiprocessing.process import BaseProcess
from typing import Any

from ..contract import LoaderDataset
from .channel import Channel
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
from .ring import ConsumerRing
from .sampler import BatchSampler
from .worker_main import group_size, worker_main

__all__ = ["WorkerError", "WorkerPool"]

_LIVENESS_S = 1.0  # how often a waiting consumer checks that the worker is still there
_STOP_S = 5.0  # how long close() waits for workers to stop before it kills them


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
        n = num_workers
        self.processes: list[BaseProcess] = [None] * n  # type: ignore[list-item]
        self._commands: list[Channel[Command]] = [None] * n  # type: ignore[list-item]
        self._results: list[Channel[Result]] = [None] * n  # type: ignore[list-item]
        self._abandoned: list[BaseProcess] = []  # killed, not ended in time (a stuck kernel read)
        self._rings: list[ConsumerRing | None] = [None] * n
        self._lent: list[list[int]] = [[] for _ in range(n)]
        self._freed: list[list[int]] = [[] for _ in range(n)]
        self._pending: list[collections.deque[Entry]] = [collections.deque() for _ in range(n)]
        self._credits = [0] * n  # batches taken from each worker since its last credit
        self._started = [False] * n  # said "ready": its dataset is loaded
        self._heard = [0.0] * n  # when bytes last went to the worker (its dataset, a command)
        self._cpu: list[int | None] = [None] * n  # CPU time of a starting worker, last seen
        self._failed_starts = [0] * n  # starts of worker w ended by its own error before "ready"
        self._ever_started = False  # some worker of this pool has said "ready"
        self._delivered: list[int | None] = [None] * n  # its last micro-batch of this iteration
        self._lost: list[tuple[Fault, float] | None] = [None] * n  # fault replaced, wait began
        self._backlog = False  # some worker's pipe has bytes waiting to be written
        self._generation = 0
        self._sampler: BatchSampler | None = None
        self._finalizer = weakref.finalize(
            self, _stop, self.processes, self._commands, self._results, self._abandoned
        )
        for w in range(n):
            self._start(w)

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

    def batches(self, sampler: BatchSampler) -> Iterator[Any]:
        """Start an iteration (it ends the one before): the sampler's micro-batches, made by the
        workers, in order (dicts of tensors over slots, or whatever the dataset returned when a
        batch travelled through the pipe)."""
        self._generation += 1
        return self._batches(sampler, self._generation)

    def _batches(self, sampler: BatchSampler, generation: int) -> Iterator[Any]:
        n = len(self.processes)
        self._sampler = sampler
        self._reclaim()
        for w in range(n):
            # batches of an abandoned iteration that were received but never handed out
            self._freed[w].extend(slot for _, slot, _ in self._pending[w] if slot is not None)
            self._pending[w].clear()
            self._credits[w] = 0
            self._delivered[w] = None
            self._send(w, Start(generation, sampler, w, self.prefetch, self._take_freed(w)))
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

    def change_weights(self, start: int, weights: tuple[float, ...] | None) -> None:
        """Every worker changes its copy of the blend as the training process's changed
        (``loader.set_weights``); a worker started later from the pickled dataset, too. The
        next ``batches`` makes them drop the micro-batches made ahead and remake them."""
        change = SetWeights(start, weights)
        if self._payload is not None:  # fork: a replacement inherits the changed dataset
            self._changes.append(change)
        for w in range(len(self.processes)):
            self._send(w, change)

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self._finalizer()

    # -- starting and replacing workers ---------------------------------------------------------
    def _start(self, w: int) -> None:
        """Start worker w (its dataset, under spawn and forkserver, follows through its pipe)."""
        command_out, command_in = self._ctx.Pipe(duplex=False)
        result_out, result_in = self._ctx.Pipe(duplex=False)
        commands: Channel[Command] = Channel(command_out)
        results: Channel[Result] = Channel(result_in)
        args = (
            w,
            len(self.processes),
            self._dataset,
            commands,
            results,
            self.slots,
            read_budget(self.health.timeout),
        )
        process = self._ctx.Process(  # type: ignore[attr-defined]  # every context has it
            target=worker_main, args=args, name=f"tokenload-worker-{w}", daemon=True
        )
        process.start()
        command_out.close()
        result_in.close()
        self.processes[w] = process
        self._commands[w], self._results[w] = Channel(command_in), Channel(result_out)
        self._commands[w].unblock()
        self._rings[w], self._lent[w], self._freed[w] = None, [], []
        self._pending[w].clear()
        self._credits[w], self._started[w], self._heard[w] = 0, False, time.monotonic()
        self._cpu[w] = None
        if self._payload is not None:
            self._send(w, LoadDataset(self._payload))
            for change in self._changes:  # set_weights since the payload was made
                self._send(w, change)

    def _replace(self, w: int, k: int, cause: str, waited_since: float) -> None:
        """Worker w is lost while micro-batch k is awaited: count it (WorkerError past the budget),
        end it, and start a new worker w at micro-batch k."""
        process = self.processes[w]
        stack = stack_of(process.pid) if cause == "stalled" else None
        if process.is_alive():
            process.kill()  # SIGKILL ends a stopped process too
        process.join(_LIVENESS_S)
        fault = Fault(w, process.pid, cause, process.exitcode, self._delivered[w], self._started[w])
        fault.stack = stack
        if self._started[w]:
            self._failed_starts[w] = 0
        elif fault.own_start_error:  # not a signal (that counts against the budget only)
            self._failed_starts[w] += 1
        repeated = self._failed_starts[w] > 1 and not self._ever_started
        self.health.fault(fault, repeated_start=repeated)
        if process.is_alive():  # in a kernel read that even SIGKILL waits for: reaped at close
            self._abandoned.append(process)
        self._commands[w].close()
        self._results[w].close()
        lost = self._lost[w]
        self._lost[w] = (fault, lost[1] if lost is not None else waited_since)
        self._start(w)
        self._send(w, Start(self._generation, self._sampler, k, self.prefetch, []))

    # -- consumer side of the protocol -----------------------------------------------------------
    def _next(self, w: int, generation: int, k: int) -> tuple[int | None, Any]:
        """(slot, layout) or (None, batch) of micro-batch k, from worker w."""
        while not self._pending[w]:
            self._reclaim()
            if self._credits[w] or self._freed[w]:  # the worker may be waiting for these
                self._flush(w, generation)
            message = self._recv(w, k)
            if isinstance(message, Ready):
                self._started[w] = self._ever_started = True
            elif isinstance(message, RingMapped):
                self._map_ring(w, k, message)
            elif message.generation != generation:  # left over from an abandoned iteration
                if isinstance(message, Batches):
                    self._freed[w].extend(
                        slot for _, slot, _ in message.entries if slot is not None
                    )
            elif isinstance(message, Failed):
                _raise_from_worker(w, message.step, message.error, message.traceback)
            else:
                self._pending[w].extend(message.entries)
                lost = self._lost[w]
                if lost is not None:  # a replacement's first batches
                    self.health.recovered(lost[0], time.monotonic() - lost[1])
                    self._lost[w] = None
        got, slot, batch = self._pending[w].popleft()
        assert got == k, (got, k)
        self._delivered[w] = k
        return slot, batch

    def _recv(self, w: int, k: int) -> Result:
        """The next message of worker w, replacing the worker while it is lost (exited, or silent
        for ``worker_timeout`` seconds while micro-batch k is awaited)."""
        began = time.monotonic()
        warned = False
        while True:
            results = self._results[w]
            try:
                if self._wait(w, _LIVENESS_S):
                    return results.recv()
            except EOFError:  # the worker's end of its pipe closed: it exited
                self.processes[w].join(_LIVENESS_S)
            now = time.monotonic()
            if not self.processes[w].is_alive():
                self._replace(w, k, "exited", began)
                continue
            timeout = self.health.timeout
            if timeout is None:
                continue
            if not self._started[w] and cpu_time(self.processes[w].pid) != self._cpu[w]:
                # still starting (imports, loading its dataset) and using the CPU: not stuck
                self._cpu[w], self._heard[w] = cpu_time(self.processes[w].pid), now
            quiet = now - max(began, results.heard, self._heard[w])
            if quiet >= timeout:
                self._replace(w, k, "stalled", began)
            elif quiet >= timeout / 2 and not warned:
                warned = True
                process = self.processes[w]
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
        results = self._results[w]
        if not self._backlog:
            return results.poll(timeout)
        owed = [v for v, c in enumerate(self._commands) if c.pending]
        poller = select.poll()
        poller.register(results.fileno(), select.POLLIN)
        for v in owed:
            poller.register(self._commands[v].fileno(), select.POLLOUT)
        poller.poll(timeout * 1000)
        for v in owed:
            try:
                if self._commands[v].drain():
                    self._heard[v] = time.monotonic()
            except BrokenPipeError:  # that worker is gone: noticed when its batch is awaited
                pass
        self._backlog = any(c.pending for c in self._commands)
        return results.poll(0)

    def _map_ring(self, w: int, k: int, message: RingMapped) -> None:
        try:
            self._rings[w] = ConsumerRing(message.path, message.slot_bytes, message.slots)
        except FileNotFoundError:  # its memory went with it: the worker died after naming it
            self.processes[w].join(_LIVENESS_S)
            if self.processes[w].is_alive():
                raise WorkerError(
                    f"cannot open loader worker {w}'s batch memory {message.path}",
                    hint="pass shared_memory=False to send batches through pipes instead",
                ) from None
            self._replace(w, k, "exited", time.monotonic())

    def _send(self, w: int, message: Command) -> None:
        commands = self._commands[w]
        try:
            commands.send(message)  # never blocks (Channel.unblock)
        except BrokenPipeError:  # the worker is gone: replaced when its next batch is awaited
            pass
        if commands.pending:
            self._backlog = True  # written by _wait

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
        self._send(w, Credit(generation, self._credits[w], self._take_freed(w)))
        self._credits[w] = 0

    def _take_freed(self, w: int) -> list[int]:
        freed, self._freed[w] = self._freed[w], []
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
    processes: list[BaseProcess],
    commands: list[Channel[Command]],
    results: list[Channel[Result]],
    abandoned: list[BaseProcess],
) -> None:
    """Ask every worker to stop; kill those still running after ``_STOP_S`` (a stopped or stuck
    worker cannot answer); close the pipes. Bounded whatever the workers do."""
    for p, c in zip(processes, commands):
        if p is None:  # its start failed
            continue
        try:
            c.send(Stop())
        except OSError:
            pass
        if c.pending:  # still reading its dataset (or stuck): nothing to stop gracefully
            p.kill()
    processes = [p for p in processes if p is not None]
    deadline = time.monotonic() + _STOP_S
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in (*processes, *abandoned):
        if p.is_alive():
            p.kill()
            p.join(_LIVENESS_S)
    for channels in (commands, results):
        for channel in channels:
            if channel is not None:
                channel.close()
