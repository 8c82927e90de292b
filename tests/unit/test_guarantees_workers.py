"""Self-healing guarantees in the conditions the other tests never create (issue 38, points 1-2;
planted bugs: tests/PLANTED.md). From README "Differences from Megatron": a worker that "sends
nothing for ``worker_timeout`` seconds while the training loop waits for its batch (stopped,
stuck in a read) is killed and replaced; the replacement makes exactly the micro-batches the lost
one owed, so the loop receives the same batches, bit for bit".

* A worker spinning in a CPU-bound loop inside a read is stuck too (it uses the CPU, but sends
  nothing): replaced after ``worker_timeout``, under fork and spawn.
* The stall clock runs from when the loop began to wait for that worker's batch: a read that is
  slow but shorter than ``worker_timeout``, awaited after a training step longer than
  ``worker_timeout``, is not killed.

The model is the fault-free order: micro-batch k holds samples ``[k*MBS, (k+1)*MBS)`` of the
dataset (the single sampler on one rank), read here without a loader.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.format import write_flat
from tokenload.loader import build_dataloader

MBS = 4


def _claim(path: str) -> bool:
    """True in the first process that creates ``path`` (one-shot faults across processes)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class _Wrapped:
    """A dataset read through ``self.dataset`` (its length and fingerprint)."""

    dataset: Any

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def fingerprint(self) -> str:
        return self.dataset.fingerprint

    def __getitems__(self, indices):
        return self.dataset.__getitems__(indices)


class Spinning(_Wrapped):
    """The read of sample ``at`` spins in a pure-Python loop for ever, once."""

    def __init__(self, dataset, folder: str, at: int) -> None:
        self.dataset, self.folder, self.at = dataset, folder, at

    def __getitems__(self, indices):
        if self.at in indices and _claim(os.path.join(self.folder, "spin")):
            x = 0
            while True:  # CPU-bound: the worker's CPU time grows, it sends nothing
                x = (x * 31 + 7) % 1_000_003
        return self.dataset.__getitems__(indices)


class Gated(_Wrapped):
    """The read of sample ``at`` waits for the file ``gate`` (touched when the training loop
    begins to wait for that batch), then takes ``slow_s`` more: slow, healthy, and started
    before the loop waits, as a read behind a long training step is."""

    def __init__(self, dataset, gate: str, at: int, slow_s: float) -> None:
        self.dataset, self.gate, self.at, self.slow_s = dataset, gate, at, slow_s

    def __getitems__(self, indices):
        if self.at in indices:
            while not os.path.exists(self.gate):
                time.sleep(0.01)
            time.sleep(self.slow_s)
        return self.dataset.__getitems__(indices)


class SlowToLoad(_Wrapped):
    """Unpickling takes ``load_s`` of CPU in the worker (heavy imports, a large dataset): a
    spawned worker still starting, busy, not stuck."""

    def __init__(self, dataset, load_s: float) -> None:
        self.dataset, self.load_s = dataset, load_s

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        end = time.process_time() + self.load_s
        while time.process_time() < end:  # CPU time, so a loaded machine only makes it longer
            pass


@pytest.fixture
def dataset(tmp_path):
    write_flat(tmp_path / "train.bin", np.arange(30_000) % 65_000)
    return FlatTokenDataset(tmp_path / "train.bin", FlatDatasetConfig(block_size=16, seed=3))


def _want(dataset, k: int) -> np.ndarray:
    return dataset.__getitems__(list(range(k * MBS, (k + 1) * MBS)))["tokens"]


@contextmanager
def _bounded(seconds: int):
    """A hang fails the test within ``seconds`` (the loader lets the training process's own
    signal handler's exception out of ``next()`` as itself)."""

    def expire(signum, frame):
        raise TimeoutError(f"no batch within {seconds} s: the stuck worker was never replaced")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_spinning_inside_a_read_is_replaced(dataset, tmp_path, method):
    steps = 16
    spinning = Spinning(dataset, str(tmp_path), at=5 * MBS + 1)  # micro-batch 5: worker 1
    loader = build_dataloader(
        spinning,
        micro_batch_size=MBS,
        dp_rank=0,
        dp_size=1,
        num_workers=2,
        prefetch_factor=2,
        worker_timeout=1.0,
        multiprocessing_context=method,
    )
    try:
        with _bounded(40):
            got = [b["tokens"].numpy().copy() for _, b in zip(range(steps), loader)]
        for k, tokens in enumerate(got):
            np.testing.assert_array_equal(tokens, _want(dataset, k), err_msg=f"micro-batch {k}")
        health = loader.metrics()["workers"]
        assert (health["restarts"], health["stalls"]) == (1, 1)
        fault = health["faults"][0]
        assert (fault["worker"], fault["cause"]) == (1, "stalled")
        # it was spinning in the read when it was killed: its stack shows the dataset's loop
        assert fault["stack"] and "__getitems__" in fault["stack"]
    finally:
        loader.close()


def test_a_slow_read_after_a_long_training_step_is_not_killed(dataset, tmp_path):
    timeout, step_s, slow_s = 3.0, 3.6, 1.3  # the step outlasts the timeout; the read does not
    gate = tmp_path / "gate"
    gated = Gated(dataset, str(gate), at=2 * MBS, slow_s=slow_s)  # micro-batch 2
    loader = build_dataloader(
        gated,
        micro_batch_size=MBS,
        dp_rank=0,
        dp_size=1,
        num_workers=1,
        prefetch_factor=2,
        worker_timeout=timeout,
        multiprocessing_context="fork",
    )
    try:
        with _bounded(60):
            it = iter(loader)
            got = [next(it)["tokens"].numpy().copy() for _ in range(2)]
            pid = loader.worker_processes[0].pid
            time.sleep(step_s)  # a training step longer than worker_timeout
            gate.touch()  # the loop begins to wait; the read takes slow_s < worker_timeout more
            began = time.monotonic()
            got.append(next(it)["tokens"].numpy().copy())
            waited = time.monotonic() - began
            got += [next(it)["tokens"].numpy().copy() for _ in range(5)]
        for k, tokens in enumerate(got):
            np.testing.assert_array_equal(tokens, _want(dataset, k), err_msg=f"micro-batch {k}")
        health = loader.metrics()["workers"]
        assert (health["restarts"], health["stalls"]) == (0, 0), health["faults"]
        assert loader.worker_processes[0].pid == pid  # the same worker, not a replacement
        assert slow_s * 0.9 < waited < timeout  # the read itself, not a replacement's restart
    finally:
        loader.close()


def test_a_spawned_worker_that_starts_longer_than_worker_timeout_is_not_killed(dataset):
    """README: a worker is replaced when it "sends nothing for worker_timeout seconds while the
    training loop waits for its batch (stopped, stuck in a read)"; workers.py: "one still
    starting progresses while it uses the CPU". Under spawn the dataset is unpickled in the
    worker (under fork it is inherited): a start of 1.5 s of CPU and more, worker_timeout=1."""
    slow = SlowToLoad(dataset, load_s=1.5)
    loader = build_dataloader(
        slow,
        micro_batch_size=MBS,
        dp_rank=0,
        dp_size=1,
        num_workers=1,
        worker_timeout=1.0,
        multiprocessing_context="spawn",
    )
    try:
        with _bounded(60):
            got = [b["tokens"].numpy().copy() for _, b in zip(range(6), loader)]
        for k, tokens in enumerate(got):
            np.testing.assert_array_equal(tokens, _want(dataset, k), err_msg=f"micro-batch {k}")
        health = loader.metrics()["workers"]
        assert (health["restarts"], health["stalls"]) == (0, 0), health["faults"]
    finally:
        loader.close()
