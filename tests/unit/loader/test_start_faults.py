"""A worker killed while it starts (issue 34, point 7): a worker killed by a signal before it has
loaded its dataset, and its replacement killed the same way, count against
``max_worker_restarts`` like any fault (it was a WorkerError "its start failed twice" with 9 of
10 restarts left). Only a start that ends with the worker's own error (an exit code: a spawned
worker that cannot import the main module) fails fast, and each error's hint names the case."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing import util

import numpy as np
import pytest

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.format import write_flat
from tokenload.loader import build_dataloader
from tokenload.loader import workers as workers_module
from tokenload.loader.workers import WorkerError

pytestmark = pytest.mark.timeout(240)

MBS = 4


@pytest.fixture
def dataset(tmp_path):
    write_flat(tmp_path / "train.bin", np.arange(30_000) % 65_000)
    return FlatTokenDataset(tmp_path / "train.bin", FlatDatasetConfig(block_size=16, seed=3))


class _SlowStart:
    """``dataset``, with a start that takes 0.5 s in each worker (right after the fork, or while
    a spawned worker unpickles it): a kill sent as the worker process is started lands while it
    starts, before it can say it is ready (a forked worker is otherwise ready within a
    millisecond, and the kill would find it started)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset
        util.register_after_fork(self, _SlowStart._starting)  # runs in forked workers

    def _starting(self) -> None:
        time.sleep(0.5)

    def __getstate__(self) -> dict:
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:  # a spawned worker loads its dataset
        self.__dict__.update(state)
        self._starting()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices):
        return self.dataset.__getitems__(indices)

    @property
    def fingerprint(self) -> str:
        return self.dataset.fingerprint


def _want(dataset, steps: int) -> list[np.ndarray]:
    """The fault-free batches: the dataset's own items, micro-batch by micro-batch."""
    return [dataset.__getitems__(list(range(k * MBS, (k + 1) * MBS)))["tokens"]
            for k in range(steps)]


@pytest.fixture
def kill_at_start(monkeypatch):
    """``kill_at_start(worker, times)``: the next ``times`` processes started as that worker
    (its first start, then its replacements) get SIGKILL from the training process as soon as
    they exist, before they can load their dataset. Returns the pids killed."""
    killed: list[int] = []
    original = workers_module.WorkerPool._start

    def arm(worker: int, times: int) -> list[int]:
        def start(pool, w):
            original(pool, w)
            if w == worker and len(killed) < times:
                pid = pool.processes[w].pid
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        monkeypatch.setattr(workers_module.WorkerPool, "_start", start)
        return killed

    return arm


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("worker", [0, 1])
def test_a_worker_and_its_replacement_killed_while_starting_are_replaced(dataset, kill_at_start,
                                                                          method, worker):
    """Worker 0 is the first one awaited: when its replacement dies too, no worker has started
    yet (the case that failed fast); worker 1's replacement dies after worker 0 has started."""
    killed = kill_at_start(worker, 2)
    want = _want(dataset, 12)
    loader = build_dataloader(_SlowStart(dataset), micro_batch_size=MBS, num_workers=2,
                              dp_rank=0, dp_size=1, multiprocessing_context=method,
                              max_worker_restarts=10)
    try:
        got = [b["tokens"].numpy() for _, b in zip(range(12), loader)]
        for k, (a, b) in enumerate(zip(got, want)):
            assert np.array_equal(a, b), k
        health = loader.metrics()["workers"]
        assert len(got) == 12 and len(killed) == 2, (killed, health)
        assert health["restarts"] == 2, health  # each start killed counts against the budget
        faults = [(f["worker"], f["pid"], f["exitcode"], f["started"]) for f in health["faults"]]
        assert faults == [(worker, pid, -9, False) for pid in killed], health
    finally:
        loader.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_starts_killed_beyond_the_budget_are_a_worker_error_that_names_the_signal(
        dataset, kill_at_start, method):
    kill_at_start(0, 3)
    loader = build_dataloader(_SlowStart(dataset), micro_batch_size=MBS, num_workers=2,
                              dp_rank=0, dp_size=1, multiprocessing_context=method,
                              max_worker_restarts=2)
    try:
        with pytest.raises(WorkerError) as info:
            next(iter(loader))
    finally:
        loader.close()
    text = str(info.value)
    assert "was killed by signal 9 (SIGKILL) while starting" in text
    assert "2 worker(s) already replaced, max_worker_restarts is 2" in text
    assert "killed by a signal while it started" in info.value.hint
    assert "__main__" not in text and "own error" not in text


_SCRIPT = """
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.loader import build_dataloader
config = MegatronDataConfig(sequence_length=64, vocab_size=1000, eod_id=0)
ds = build_datasets(config, [500, 20, 0])[0]
dl = build_dataloader(ds, micro_batch_size=4, num_workers=2, multiprocessing_context="spawn",
                      max_worker_restarts=10)
next(iter(dl))
"""


def test_a_spawned_worker_that_cannot_import_the_main_module_still_fails_fast(tmp_path):
    """Read from standard input, the main module cannot be imported by a spawned worker: every
    start exits with code 1, the worker's own error. The second one is a WorkerError at once,
    with 9 of 10 restarts left, and its hint says what it saw."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-"], input=_SCRIPT, cwd=tmp_path,
                          capture_output=True, text=True, timeout=200)
    error = done.stderr.rsplit("WorkerError", 1)[-1]
    assert done.returncode != 0, done.stderr
    assert "WorkerError: loader worker 0" in done.stderr, done.stderr
    assert "exited with code 1 while starting" in error, error
    assert "1 worker(s) already replaced, max_worker_restarts is 10" in error, error
    assert "its start ended with its own error twice" in error, error
    hint = error.split("HINT:", 1)[1]
    assert "exited with code 1 before it loaded its dataset (its own error, not a signal)" in hint
    assert "__name__ == '__main__'" in hint
    assert time.monotonic() - began < 150
