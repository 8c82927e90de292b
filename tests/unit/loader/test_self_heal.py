"""The self-healing loader (issue 24): a worker that dies or stalls is replaced and the training
loop receives the fault-free batches bit for bit; beyond ``max_worker_restarts`` a WorkerError
names the worker; no wait is unbounded (start, receive, close); the training process's own
exceptions come out of ``next()`` as themselves; ``metrics()`` reports restarts, stalls and time
lost. Faults come from ``benchmarks/chaos.py``'s FaultyDataset (one-shot tickets)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.errors import ConfigError, FormatError
from tokenload.format import write_flat
from tokenload.loader import build_dataloader
from tokenload.loader import workers as workers_module
from tokenload.loader.messages import LoadDataset
from tokenload.loader.workers import WorkerError

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import chaos  # spawned workers find it through sys.path
from chaos import FaultyDataset

MBS = 4


@pytest.fixture
def dataset(tmp_path):
    write_flat(tmp_path / "train.bin", np.arange(30_000) % 65_000)
    return FlatTokenDataset(tmp_path / "train.bin", FlatDatasetConfig(block_size=16, seed=3))


@pytest.fixture
def tickets(tmp_path):
    folder = tmp_path / "tickets"
    folder.mkdir()
    return str(folder)


def _want(dataset, steps: int) -> list[np.ndarray]:
    return [dataset.__getitems__(list(range(k * MBS, (k + 1) * MBS)))["tokens"]
            for k in range(steps)]


def _loader(dataset, **config):
    config = {"num_workers": 2, "dp_rank": 0, "dp_size": 1, "prefetch_factor": 2, **config}
    return build_dataloader(dataset, micro_batch_size=MBS, **config)


def _check(batches, want, first: int = 0) -> None:
    for k, batch in enumerate(batches, first):
        assert np.array_equal(batch["tokens"].numpy(), want[k]), k


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_killed_worker_is_replaced_and_the_loop_gets_the_same_batches(dataset, method):
    want = _want(dataset, 40)
    loader = _loader(dataset, multiprocessing_context=method)
    try:
        it = iter(loader)
        _check([next(it) for _ in range(3)], want)
        victim = loader.worker_processes[1]
        os.kill(victim.pid, signal.SIGKILL)
        _check([next(it) for _ in range(37)], want, 3)
        assert victim not in loader.worker_processes
        assert all(p.is_alive() for p in loader.worker_processes)
        health = loader.metrics()["workers"]
        assert (health["restarts"], health["stalls"]) == (1, 0)
        fault = health["faults"][0]
        got = (fault["worker"], fault["pid"], fault["exitcode"], fault["cause"])
        assert got == (1, victim.pid, -9, "exited")
        assert fault["recovered_s"] is not None and health["time_lost_s"] > 0
    finally:
        loader.close()


def test_a_stopped_worker_is_replaced_after_worker_timeout_with_a_warning(dataset, caplog):
    want = _want(dataset, 30)
    loader = _loader(dataset, worker_timeout=1.5)
    try:
        it = iter(loader)
        _check([next(it), next(it)], want)
        victim = loader.worker_processes[0]
        os.kill(victim.pid, signal.SIGSTOP)
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="tokenload.loader.workers"):
            _check([next(it) for _ in range(28)], want, 2)
        assert time.monotonic() - began < 10
        health = loader.metrics()["workers"]
        assert (health["restarts"], health["stalls"]) == (1, 1)
        slow = [r.getMessage() for r in caplog.records if "has sent nothing" in r.getMessage()]
        assert slow and f"loader worker 0 (pid {victim.pid})" in slow[0] and "stopped" in slow[0]
        assert "worker_timeout=1.5" in slow[0]
        # a stopped process cannot answer: no stack, and it is killed as it is
        assert "its stack" not in slow[0] and health["faults"][0]["stack"] is None
        victim.join(5)
        assert not victim.is_alive()  # killed, not left stopped
    finally:
        loader.close()


def test_a_worker_stopped_for_less_than_the_timeout_is_kept(dataset):
    want = _want(dataset, 20)
    loader = _loader(dataset, worker_timeout=5)
    try:
        it = iter(loader)
        _check([next(it)], want)
        pid = loader.worker_processes[1].pid
        os.kill(pid, signal.SIGSTOP)
        threading.Timer(0.5, os.kill, (pid, signal.SIGCONT)).start()
        _check([next(it) for _ in range(19)], want, 1)
        assert loader.metrics()["workers"]["restarts"] == 0
        assert [p.pid for p in loader.worker_processes][1] == pid
    finally:
        loader.close()


def test_a_read_that_blocks_for_ever_is_replaced(dataset, tickets):
    want = _want(dataset, 16)
    loader = _loader(FaultyDataset(dataset, tickets, block_at=9 * MBS + 2), worker_timeout=1.0)
    try:
        _check([b for _, b in zip(range(16), loader)], want)
        health = loader.metrics()["workers"]
        assert (health["restarts"], health["stalls"]) == (1, 1)
        assert health["faults"][0]["worker"] == 1 and health["faults"][0]["delivered"] == 7
    finally:
        loader.close()


def test_a_stall_beyond_the_budget_is_a_worker_error(dataset):
    loader = _loader(dataset, worker_timeout=1.0, max_worker_restarts=0)
    try:
        it = iter(loader)
        next(it), next(it)
        victim = loader.worker_processes[0]
        os.kill(victim.pid, signal.SIGSTOP)
        with pytest.raises(WorkerError, match=rf"worker 0 \(pid {victim.pid}\) made no progress"
                           r" while a batch was owed and was killed \(exit code -9\); last"
                           r" micro-batch it delivered in this iteration: micro-batch \d*[02468];"
                           r"(.|\n)*HINT:.*worker_timeout"):
            for _ in it:
                pass
    finally:
        loader.close()


class _WaitsForAThread(FaultyDataset):
    """The read of sample ``block_at`` waits for a helper thread that never ends (a lock or a
    client thread stuck), once."""

    def __getitems__(self, indices):
        if self.block_at in indices and chaos._claim(self.folder, "thread"):
            helper = threading.Thread(target=_helper_that_never_ends, daemon=True)
            helper.start()
            helper.join()
        return self.dataset.__getitems__(indices)


def _helper_that_never_ends() -> None:
    while True:
        time.sleep(3600)


def _stack_files() -> set[str]:
    import tempfile

    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("tokenload-worker-stack")}


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_stuck_worker_s_stack_is_in_the_warning_the_metrics_and_the_error(
    dataset, tickets, caplog, method
):
    """Where a stalled worker was stuck: its Python stacks (every thread, the main one first,
    cut at the worker's entry point), asked for before it is killed, in the half-timeout warning,
    the replacement's warning, ``metrics()`` and the WorkerError; no file is left behind."""
    before = _stack_files()
    stuck = _WaitsForAThread(dataset, tickets, block_at=9 * MBS + 2)
    want = _want(dataset, 16)
    loader = _loader(stuck, worker_timeout=1.5, multiprocessing_context=method)
    try:
        with caplog.at_level(logging.WARNING, logger="tokenload.loader.workers"):
            _check([b for _, b in zip(range(16), loader)], want)
        fault = loader.metrics()["workers"]["faults"][0]
        assert fault["cause"] == "stalled" and fault["worker"] == 1
        main, _, other = fault["stack"].partition("\nother thread")
        assert main.startswith("main thread (most recent call first):")
        assert "in join" in main and "in __getitems__" in main and "test_self_heal.py" in main
        assert main.rstrip().endswith("in worker_main")  # not multiprocessing's start
        assert "in _helper_that_never_ends" in other
        messages = [r.getMessage() for r in caplog.records]
        slow = [m for m in messages if "has sent nothing" in m]
        assert slow and "its stack now:" in slow[0] and "in _helper_that_never_ends" in slow[0]
        replaced = [m for m in messages if "replaced (restart 1" in m]
        assert replaced and "its stack when it was killed:\nmain thread" in replaced[0]
    finally:
        loader.close()
    assert _stack_files() == before

    error_tickets = Path(tickets) / "again"
    error_tickets.mkdir()
    loader = _loader(_WaitsForAThread(dataset, str(error_tickets), block_at=2), worker_timeout=1.5,
                     max_worker_restarts=0, multiprocessing_context=method)
    try:
        with pytest.raises(WorkerError, match=r"made no progress(.|\n)*its stack when it was killed:"
                           r"\nmain thread \(most recent call first\):\n(.|\n)*in __getitems__"
                           r"(.|\n)*in worker_main\nHINT") as info:
            next(iter(loader))
        assert "_helper_that_never_ends" not in str(info.value)  # the error keeps the main thread
    finally:
        loader.close()


def test_an_exception_in_the_dataset_read_is_raised_typed_not_restarted(dataset, tickets):
    want = _want(dataset, 12)
    loader = _loader(FaultyDataset(dataset, tickets, raise_at=5 * MBS + 1))
    try:
        got = []
        with pytest.raises(FormatError, match="planted fault") as info:
            for batch in loader:
                got.append(batch)
        assert "in loader worker 1, reading micro-batch 5" in "\n".join(info.value.__notes__)
        _check(got, want)
        loader.restart(loader.consumed_samples)
        _check([b for _, b in zip(range(7), loader)], want, 5)
        assert loader.metrics()["workers"]["restarts"] == 0
    finally:
        loader.close()


def _exit_if_armed(folder: str) -> None:
    FaultyDataset.__new__(FaultyDataset).__setstate__({"folder": folder})  # exits when armed


class _ExitOnLoad:
    """Unpickling it runs the armed exit: before the rest of the payload is read."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __reduce__(self):
        return (_exit_if_armed, (self.folder,))


class _Heavy(FaultyDataset):
    """A pickled dataset far larger than a pipe buffer (64 KiB); a worker armed to exit at start
    dies before it has read the 4 MiB that follow its trigger."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trigger = _ExitOnLoad(self.folder)
        self.ballast = np.ones(4 << 20, dtype=np.uint8)


def test_a_large_spawn_dataset_and_a_worker_dying_while_it_starts_does_not_hang(dataset, tickets):
    """CPython's spawn writes Process arguments into the child's pipe before closing its copy of
    the child's end: a child dying at start hung process.start() on a payload over 64 KiB."""
    heavy = _Heavy(dataset, tickets)
    heavy.arm_exit()
    heavy.arm_exit()
    want = _want(dataset, 10)
    loader = _loader(heavy, multiprocessing_context="spawn")
    try:
        began = time.monotonic()
        _check([b for _, b in zip(range(10), loader)], want)
        assert time.monotonic() - began < 40
        health = loader.metrics()["workers"]
        assert health["restarts"] == 2
        assert all(f["exitcode"] == 7 and not f["started"] for f in health["faults"])
    finally:
        loader.close()


def test_spawn_workers_stopped_while_they_start_are_replaced(dataset, tickets, monkeypatch):
    """Stopped before reading its 4 MiB dataset from its pipe: the loader's writes never block
    (a blocking write hung here for ever), and the silence is a stall like any other."""
    want = _want(dataset, 6)
    loader = _loader(_Heavy(dataset, tickets), multiprocessing_context="spawn", worker_timeout=2.0)
    original = workers_module.WorkerPool._send
    stopped = []

    def send_to_stopped(pool, w, message):
        if isinstance(message, LoadDataset) and not stopped:
            stopped.append(pool.processes[w].pid)
            os.kill(stopped[0], signal.SIGSTOP)
        original(pool, w, message)

    monkeypatch.setattr(workers_module.WorkerPool, "_send", send_to_stopped)
    try:
        _check([b for _, b in zip(range(6), loader)], want)
        health = loader.metrics()["workers"]
        assert health["stalls"] == 1 and health["faults"][0]["pid"] == stopped[0]
        assert not health["faults"][0]["started"]
    finally:
        loader.close()


def test_a_worker_dying_before_its_ring_is_mapped_is_replaced(dataset, monkeypatch):
    """Issue 25 (4): the consumer opened /proc/<pid>/fd/N of a worker that had died since it sent
    its ring's name, and FileNotFoundError escaped."""
    real = workers_module.ConsumerRing
    killed = []

    def die_first(path, slot_bytes, slots, *rest):
        if not killed:
            pid = int(path.split("/")[2])
            os.kill(pid, signal.SIGKILL)
            while Path(f"/proc/{pid}/fd").exists() and any(Path(f"/proc/{pid}/fd").iterdir()):
                time.sleep(0.01)
            killed.append(pid)
        return real(path, slot_bytes, slots, *rest)

    monkeypatch.setattr(workers_module, "ConsumerRing", die_first)
    want = _want(dataset, 12)
    loader = _loader(dataset, multiprocessing_context="spawn")
    try:
        _check([b for _, b in zip(range(12), loader)], want)
        health = loader.metrics()["workers"]
        assert health["restarts"] == 1 and health["faults"][0]["pid"] == killed[0]
    finally:
        loader.close()


class _Slow(FaultyDataset):
    def __getitems__(self, indices):
        if 6 * MBS in indices:
            time.sleep(1.5)
        return super().__getitems__(indices)


def test_the_training_process_own_timeout_error_propagates_as_itself(dataset, tickets):
    """A SIGALRM watchdog of the training loop raising TimeoutError inside next() was reported as
    a dead worker; the workers are alive and the loader goes on afterwards."""
    want = _want(dataset, 12)
    loader = _loader(_Slow(dataset, tickets), num_workers=1, prefetch_factor=1)

    def fire(signum, frame):
        raise TimeoutError("the loop's own watchdog")

    old = signal.signal(signal.SIGALRM, fire)
    try:
        it = iter(loader)
        _check([next(it) for _ in range(6)], want)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(TimeoutError, match="the loop's own watchdog"):
            next(it)
        signal.setitimer(signal.ITIMER_REAL, 0)
        loader.restart(loader.consumed_samples)
        _check([b for _, b in zip(range(6), loader)], want, 6)
        assert loader.metrics()["workers"]["restarts"] == 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        loader.close()


def test_close_ends_stopped_workers_in_bounded_time(dataset):
    loader = _loader(dataset, num_workers=2)
    next(iter(loader))
    processes = loader.worker_processes
    for p in processes:
        os.kill(p.pid, signal.SIGSTOP)
    began = time.monotonic()
    loader.close()
    assert time.monotonic() - began < 10
    assert not any(p.is_alive() for p in processes)


class _Unloadable(FaultyDataset):
    def __setstate__(self, state):
        raise FormatError("cannot open the token file", path="gone.bin", hint="restore it")


def test_a_dataset_that_cannot_be_loaded_in_a_worker_is_raised_typed(dataset, tickets):
    loader = _loader(_Unloadable(dataset, tickets), multiprocessing_context="spawn", num_workers=1)
    try:
        with pytest.raises(FormatError, match=r"gone.bin: cannot open") as info:
            next(iter(loader))
        assert "in loader worker 0, loading the dataset" in "\n".join(info.value.__notes__)
        assert loader.metrics()["workers"]["restarts"] == 0
    finally:
        loader.close()


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "60", True])
def test_worker_timeout_is_checked(dataset, value):
    with pytest.raises(ConfigError, match="worker_timeout"):
        _loader(dataset, worker_timeout=value)


@pytest.mark.parametrize("value", [-1, 1.5, None])
def test_max_worker_restarts_is_checked(dataset, value):
    with pytest.raises(ConfigError, match="max_worker_restarts"):
        _loader(dataset, max_worker_restarts=value)


_SCRIPT = """
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.loader import build_dataloader
config = MegatronDataConfig(sequence_length=64, vocab_size=1000, eod_id=0)
ds = build_datasets(config, [500, 20, 0])[0]
dl = build_dataloader(ds, micro_batch_size=4, num_workers=2, multiprocessing_context="spawn")
next(iter(dl))
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize("source", ["stdin", "file"])
def test_the_issue_reproduction_raises_a_worker_error_within_seconds(tmp_path, source):
    """Spawned workers cannot run a main module read from standard input, nor one without an
    ``if __name__ == '__main__':`` guard: each dies while starting. Once hung for ever."""
    script = tmp_path / "repro.py"
    script.write_text(_SCRIPT)
    args = [sys.executable, "-"] if source == "stdin" else [sys.executable, str(script)]
    began = time.monotonic()
    with open(script) as stdin:
        done = subprocess.run(args, stdin=stdin if source == "stdin" else subprocess.DEVNULL,
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "WorkerError: loader worker" in done.stderr and "while starting" in done.stderr
    assert "__name__ == '__main__'" in done.stderr
    assert time.monotonic() - began < 100


class _Budget:
    """Each sample carries the storage read budget of the process that read it."""

    def __len__(self) -> int:
        return 40

    def __getitems__(self, indices):
        from tokenload.storage.options import read_retry_window

        return {"budget": np.full(len(indices), read_retry_window() or -1.0)}


@pytest.mark.parametrize("workers,method", [(0, None), (1, "fork"), (1, "spawn")])
def test_storage_reads_retry_for_most_of_worker_timeout(workers, method):
    """Issue 24 (4): a training read of a silent server retries by time, ending as a typed
    StorageError before the worker would count as stalled (storage.options.retry_reads_for)."""
    from tokenload.storage import options

    before = options.read_retry_window()
    try:
        for timeout, budget in ((50.0, 40.0), (None, -1.0)):
            loader = _loader(_Budget(), num_workers=workers, multiprocessing_context=method,
                             worker_timeout=timeout)
            got = next(iter(loader))["budget"]
            loader.close()
            assert got.tolist() == [budget] * MBS, timeout
            # only the loader's reads: the process's own storage requests keep their setting
            assert options.read_retry_window() == before
    finally:
        options.retry_reads_for(before)


def test_doctor_reports_workers_replaced_while_it_measured(dataset, tickets):
    """Issue 24 (5): ``tokenload doctor``'s loader measurements count restarts and stalls."""
    from tokenload.doctor.checks import _check_worker_faults
    from tokenload.doctor.measure import loader_rate
    from tokenload.doctor.report import DoctorConfig, Report

    faulty = FaultyDataset(dataset, tickets)
    faulty.arm_exit()  # the first worker exits while starting: replaced
    config = DoctorConfig(data_path=["unused"], seq_length=16, steps=6)
    health: list = []
    loader_rate(faulty, config, workers=1, health=health)
    loader_rate(dataset, config, workers=1, health=health)
    assert [h["restarts"] for h in health] == [1, 0]
    report = Report()
    _check_worker_faults(health, report)
    (finding,) = report.findings
    assert finding.problem and "replaced while measuring: 1 (0 stalled" in finding.measured
    assert "out-of-memory" in finding.fix
    clean = Report()
    _check_worker_faults(health[1:], clean)
    assert not clean.findings[0].problem and clean.findings[0].fix is None


class _ReadsAFifo(FaultyDataset):
    """Micro-batch 3's read blocks in read(2) of a FIFO that never gets data (once)."""

    def __getitems__(self, indices):
        if 3 * MBS in indices and chaos._claim(self.folder, "fifo"):
            fd = os.open(os.path.join(self.folder, "pipe"), os.O_RDONLY)
            os.read(fd, 1)
        return super().__getitems__(indices)


def test_the_slow_worker_warning_names_the_file_it_is_reading(dataset, tickets, caplog):
    fifo = os.path.join(tickets, "pipe")
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDWR)  # a writer that never writes: the reader blocks in read(2)
    want = _want(dataset, 8)
    loader = _loader(_ReadsAFifo(dataset, tickets), num_workers=1, prefetch_factor=1,
                     worker_timeout=2.0)
    try:
        with caplog.at_level(logging.WARNING, logger="tokenload.loader.workers"):
            _check([b for _, b in zip(range(8), loader)], want)
        slow = [r.getMessage() for r in caplog.records if "has sent nothing" in r.getMessage()]
        assert slow and "micro-batch 3" in slow[0] and f"reading {fifo} (read)" in slow[0]
        assert loader.metrics()["workers"]["stalls"] == 1
    finally:
        loader.close()
        os.close(keep)
