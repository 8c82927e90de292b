"""What the loader knows of its workers' faults: the restart budget, the counters ``metrics()``
reports, and the words of the warning and the error (``WorkerError``).

A worker process that exits (any signal, any exit code, at start or mid-epoch) or makes no
progress for ``worker_timeout`` seconds while the training loop waits for its batch is a fault
of the process, not of the data: ``workers.py`` replaces it, and the replacement makes exactly
the micro-batches the lost one still owed (the order is a pure function of the sampler), so the
training loop receives the batches of a run without the fault. Each loader may replace at most
``max_worker_restarts`` workers; the fault after that raises ``WorkerError`` naming the worker,
its pid, how it ended and the last micro-batch it delivered. An exception raised by the
dataset's own read is not a fault of the process: it is raised in the training process, typed.

A worker killed by a signal while it starts (before it has loaded its dataset) was killed, like
any other: it counts against the budget, its replacement too. Only a start that ends with the
worker's *own* error (it exits with a code before it is ready: a spawned worker that cannot
import the main module, a main module that exits) fails fast, the second time the same worker's
start fails so before any worker of the loader has started, since every start would fail the same
way; its hint says which of these cases it saw.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import platform
import signal
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import cast

from ..errors import TokenloadError
from .report import FaultReport, WorkersReport

logger = logging.getLogger("tokenload.loader.workers")

_KEEP = 20  # faults kept in metrics()


class WorkerError(TokenloadError, RuntimeError):
    """A loader worker process died or could not deliver a batch."""


@dataclass
class Fault:
    """One worker process lost: which one, how, and when."""

    worker: int
    pid: int | None
    cause: str  # "exited", "stalled", "ring" (died before its memory was mapped)
    exitcode: int | None
    delivered: int | None  # last micro-batch of the iteration it delivered (None: none)
    started: bool  # whether it had finished starting (loaded the dataset)
    at: float = field(default_factory=time.monotonic)
    recovered_s: float | None = None  # from detection to the replacement's first batch
    stack: str | None = None  # a stalled worker's main thread when it was killed (stack_of)

    @property
    def own_start_error(self) -> bool:
        """Whether the worker ended its start itself: it exited with an exit code (not a
        signal) before it had loaded its dataset. A start that cannot succeed fails so every time
        (a spawned worker that cannot import the main module exits with code 1); a worker killed
        by a signal while it starts (by someone, or the out-of-memory killer) was killed."""
        return (
            not self.started
            and self.cause == "exited"
            and self.exitcode is not None
            and self.exitcode >= 0
        )

    def as_dict(self) -> FaultReport:
        """Its fields, less its clock reading ``at``."""
        return cast(FaultReport, {k: v for k, v in asdict(self).items() if k != "at"})

    def how(self) -> str:
        if self.cause == "stalled":
            return "made no progress while a batch was owed and was killed"
        ended = describe_exit(self.exitcode)
        return ended if self.started else f"{ended} while starting"


class WorkerHealth:
    """Restart budget and fault counters of one loader (all its worker pools)."""

    def __init__(
        self,
        *,
        worker_timeout: float | None = 120.0,
        max_worker_restarts: int = 3,
        context: str | None = None,
    ) -> None:
        self.timeout = worker_timeout
        self.budget = max_worker_restarts
        self.context = context
        self.restarts = 0
        self.stalls = 0
        self.time_lost_s = 0.0
        self.faults: list[Fault] = []

    def fault(self, fault: Fault, *, repeated_start: bool = False) -> None:
        """Count a lost worker; WorkerError once the budget is spent, or at once when the
        worker's start ended with its own error again (``repeated_start``: twice, before any
        worker ever started; not transient: a main module that spawn cannot import fails every
        start the same way). A start ended by a signal counts like any fault."""
        self.faults = [*self.faults[-(_KEEP - 1) :], fault]
        self.stalls += fault.cause == "stalled"
        if repeated_start:
            raise self.error(
                fault,
                "its start ended with its own error twice (an exit code, not a signal) and no"
                " worker has started yet: a start that fails so is not retried",
            )
        if self.restarts >= self.budget:
            raise self.error(fault)
        self.restarts += 1
        logger.warning(
            "loader worker %d (pid %s) %s; replaced (restart %d of max_worker_restarts"
            "=%d), it makes the micro-batches the lost one owed%s",
            fault.worker,
            fault.pid,
            fault.how(),
            self.restarts,
            self.budget,
            f"; its stack when it was killed:\n{fault.stack}" if fault.stack else "",
        )

    def recovered(self, fault: Fault, waited_s: float) -> None:
        """The replacement of ``fault``'s worker delivered; the loop waited ``waited_s`` for it."""
        fault.recovered_s = time.monotonic() - fault.at
        self.time_lost_s += waited_s

    def error(self, fault: Fault, why: str = "") -> WorkerError:
        last = "none yet" if fault.delivered is None else f"micro-batch {fault.delivered}"
        hint = (
            "a negative exit code is the signal that ended it (-9: often the out-of-memory"
            " killer, see the kernel log); see the worker's log above; raise"
            " max_worker_restarts to replace more workers"
        )
        if fault.cause == "stalled":
            hint = (
                "the worker was stopped or stuck (a hung read, a debugger, a frozen file"
                " system); raise worker_timeout if its reads are legitimately that slow"
            )
            if fault.stack:
                main = fault.stack.split("\nother thread", 1)[0]
                why = "; ".join(w for w in (why, f"its stack when it was killed:\n{main}") if w)
        elif fault.own_start_error and self.context in ("spawn", "forkserver"):
            hint = (
                f"the worker exited with code {fault.exitcode} before it loaded its dataset (its"
                f" own error, not a signal): under multiprocessing_context={self.context!r} each"
                " worker imports the main module: run the script from a file (not standard input"
                " or a notebook) with its code under `if __name__ == '__main__':`, or use 'fork';"
                " see the worker's traceback in the log above"
            )
        elif fault.own_start_error:
            hint = (
                f"the worker exited with code {fault.exitcode} before it loaded its dataset (its"
                " own error, not a signal): see the worker's traceback in the log above"
            )
        elif not fault.started:
            hint = (
                "the worker was killed by a signal while it started (not an error of its own:"
                " such a start counts against max_worker_restarts like any fault); -9 is often"
                " the out-of-memory killer, see the kernel log; raise max_worker_restarts to"
                " replace more workers"
            )
        return WorkerError(
            f"loader worker {fault.worker} (pid {fault.pid}) {fault.how()}"
            f" (exit code {fault.exitcode}); last micro-batch it delivered in this iteration:"
            f" {last}; {self.restarts} worker(s) already replaced, max_worker_restarts is"
            f" {self.budget}" + (f"; {why}" if why else ""),
            hint=hint,
        )

    def as_dict(self) -> WorkersReport:
        return {
            "restarts": self.restarts,
            "stalls": self.stalls,
            "time_lost_s": self.time_lost_s,
            "max_worker_restarts": self.budget,
            "worker_timeout": self.timeout,
            "faults": [f.as_dict() for f in self.faults],
        }


def read_budget(worker_timeout: float | None) -> float | None:
    """How long a worker's object-storage read may retry (``storage.options.retry_reads_for``):
    most of ``worker_timeout``, so that a server that stopped answering ends as a typed
    StorageError before the worker counts as stalled (a replacement would find it as dead)."""
    return None if worker_timeout is None else 0.8 * worker_timeout


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# -- what a slow worker is doing (Linux /proc, best effort) ----------------------------------------
_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in an uninterruptible wait (usually disk or network I/O)",
    "T": "stopped (SIGSTOP, a debugger or the scheduler)",
    "t": "stopped by a debugger",
    "Z": "dead",
}
# syscall numbers that read from a descriptor: name, and which argument is the file offset
_READS = {
    "x86_64": {
        0: ("read", None),
        17: ("pread64", 3),
        19: ("readv", None),
        295: ("preadv", 3),
        327: ("preadv2", 3),
        45: ("recvfrom", None),
        47: ("recvmsg", None),
    },
    "aarch64": {
        63: ("read", None),
        67: ("pread64", 3),
        65: ("readv", None),
        69: ("preadv", 3),
        286: ("preadv2", 3),
        207: ("recvfrom", None),
        212: ("recvmsg", None),
    },
}


def cpu_time(pid: int | None) -> int | None:
    """Clock ticks of CPU ``pid`` has used (user + system), None where /proc says nothing."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def doing(pid: int | None) -> str:
    """What process ``pid`` is doing, from /proc: its state, and the file and offset it reads
    when it is inside a read; "" where /proc says nothing."""
    state = None if pid is None else _state(pid)
    if state is None:
        return ""
    words = [_STATES.get(state, state)]
    try:
        with open(f"/proc/{pid}/syscall") as f:
            call = f.read().split()
    except OSError:
        call = []
    known = _READS.get(platform.machine(), {})
    if call and call[0].lstrip("-").isdigit() and int(call[0]) in known:
        name, at = known[int(call[0])]
        fd = int(call[1], 16)
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            target = f"descriptor {fd}"
        offset = f" at offset {int(call[1 + at], 16)}" if at is not None else ""
        words.append(f"reading {target}{offset} ({name})")
    return ", ".join(words)


# -- where a stuck worker is stuck (its Python stacks, on request) ---------------------------------
#: The signal that asks a worker for its Python stacks (``record_stacks``). A worker's dataset
#: code that handles SIGUSR2 itself loses it to this in loader workers.
STACK_SIGNAL = signal.SIGUSR2
_STACK_FILE = "tokenload-worker-stacks-"
_STACK_WAIT_S = 1.0  # how long the training process waits for a dump to be complete


def record_stacks() -> None:
    """In a worker process: on ``STACK_SIGNAL``, write every thread's Python stack (CPython's
    ``faulthandler``, from the signal handler: it works while the thread holds the GIL in C code or
    waits on a lock or a socket) to a temporary file that is unlinked at once, so that nothing is
    left behind; the training process reads it through ``/proc`` (``stack_of``). Best effort."""
    try:
        fd, path = tempfile.mkstemp(prefix=_STACK_FILE)
    except OSError:
        return
    try:
        os.unlink(path)
        main = f"main thread 0x{threading.main_thread().ident or 0:016x}\n"
        os.write(fd, main.encode())
        faulthandler.register(STACK_SIGNAL, file=fd, all_threads=True, chain=False)
    except (OSError, AttributeError, ValueError, RuntimeError):
        os.close(fd)


def stack_of(pid: int | None) -> str | None:
    """The Python stacks of worker ``pid`` now, main thread first (most recent call first), or
    None where they cannot be had: not Linux, a worker stopped or not yet set up
    (``record_stacks``), or one that does not answer within ``_STACK_WAIT_S``."""
    if pid is None or _state(pid) in (None, "T", "t", "Z", "X"):
        return None
    found = _stack_file(pid)
    if found is None:
        return None
    try:
        with open(found, "rb") as f:
            head = f.readline().decode(errors="replace")
            before = os.fstat(f.fileno()).st_size
            os.kill(pid, STACK_SIGNAL)
            deadline = time.monotonic() + _STACK_WAIT_S
            size = before
            while time.monotonic() < deadline:
                time.sleep(0.02)
                now = os.fstat(f.fileno()).st_size
                if now > before and now == size:  # written, and no longer growing
                    break
                size = now
            f.seek(before)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return _main_first(text, head.split()[-1]) if text.strip() else None


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _stack_file(pid: int) -> str | None:
    """``/proc/PID/fd/N`` of the worker's stack file (``record_stacks``), if it has one."""
    folder = f"/proc/{pid}/fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    for name in names:
        try:
            target = os.readlink(f"{folder}/{name}")
        except OSError:
            continue
        if os.path.basename(target).startswith(_STACK_FILE):
            return f"{folder}/{name}"
    return None


def _main_first(dump: str, main: str) -> str:
    """faulthandler's dump (a block per thread) with the main thread's block first, named."""
    blocks = [b for b in dump.strip("\n").split("\n\n") if b.strip()]
    ordered = sorted(blocks, key=lambda b: main not in b.split("\n", 1)[0].split())
    named = []
    for block in ordered:
        first, _, rest = block.partition("\n")
        ident = next((w for w in first.split() if w.startswith("0x")), "")
        label = "main thread" if ident == main else f"other thread {ident}"
        frames = rest.split("\n")
        # the frames under the worker's entry point are the process's start (multiprocessing)
        bottom = next((i for i, f in enumerate(frames) if f.endswith(" in worker_main")), None)
        if bottom is not None:
            frames = frames[: bottom + 1]
        named.append(f"{label} (most recent call first):\n" + "\n".join(frames))
    return "\n".join(named)
