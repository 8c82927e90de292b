"""Bounded memory: a DataLoader worker reading random windows for a long run does not grow its
private memory with the number of samples read.

What is measured is each worker's ``Private_Dirty`` (``/proc/self/smaps_rollup``): memory the
worker itself wrote, i.e. the heap, NumPy buffers, Python objects and any cache or index that
could grow with the samples read. (``RssAnon`` misses growth of a forked worker into free heap it
inherited from its parent: writing such a page swaps a shared page for a private one and leaves
``RssAnon`` unchanged. That blind spot made the leak control below flaky in a full test run.)
File-backed pages of the token file's mmap (``RssFile``) are page cache, shared with every
process mapping the file and reclaimable by the kernel; they are not the concern. They do grow up
to the file's size (measured: the worker's mapping holds all 64 MiB within its first batches, as
the kernel maps whole page-cache folios around each fault); the test checks that the samples
read span nearly every page of the file, so that no read pattern stays in a few pages.

Each worker reports its own ``Private_Dirty`` inside every batch (a wrapper dataset adds it in
``__getitems__``); growth between 10% and 100% of the run must stay below ``BOUND_KB``. The first
10% is warm-up (allocator arenas, NumPy and torch caches, the worker's first mapping). A control
run with a wrapper that keeps every batch it reads shows the measurement does see a leak.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.format import write_flat
from tokenload.loader import build_dataloader

FILE_TOKENS = 32 << 20  # 64 MiB of uint16 tokens
BLOCK = 64
MBS = 200
SAMPLES = 200_000
BOUND_KB = 2 << 10  # 2 MiB; measured growth: 16-250 kB


def _status_kb(*fields: str) -> list[int]:
    values = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in fields:
                values[name] = int(rest.split()[0])
    return [values[name] for name in fields]


class MemoryProbe:
    """Wraps a dataset; each batch also carries the reading process's pid and Private_Dirty (kB)."""

    def __init__(self, dataset, keep: bool = False) -> None:
        self.dataset = dataset
        self.keep = keep  # the leaky control: retain every batch read
        self.kept: list = []

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def fingerprint(self) -> str:
        return self.dataset.fingerprint

    def __getitems__(self, indices):
        batch = self.dataset.__getitems__(indices)
        if self.keep:
            self.kept.append(batch["tokens"])
        (anon,) = _status_kb("Private_Dirty")
        n = len(indices)
        return {**batch, "pid": np.full(n, os.getpid()), "anon": np.full(n, anon)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("memory") / "big.bin"
    write_flat(path, np.random.default_rng(0).integers(0, 50_000, FILE_TOKENS, dtype=np.uint16))
    return FlatTokenDataset(path, FlatDatasetConfig(block_size=BLOCK, seed=1))


def _run(dataset, samples: int, method: str, keep: bool = False) -> dict[int, np.ndarray]:
    """Per worker pid: rows of (samples read by the whole loader so far, Private_Dirty kB)."""
    loader = build_dataloader(
        MemoryProbe(dataset, keep),
        micro_batch_size=MBS,
        num_workers=2,
        multiprocessing_context=method,
        persistent_workers=False,
    )
    rows: dict[int, list] = {}
    for step, batch in enumerate(loader):
        if (step + 1) * MBS > samples:
            break
        rows.setdefault(int(batch["pid"][0]), []).append(((step + 1) * MBS, int(batch["anon"][0])))
        assert batch["tokens"].shape == (MBS, BLOCK)
    return {pid: np.array(r) for pid, r in rows.items()}


def _growth_kb(rows: np.ndarray, samples: int) -> int:
    """Private_Dirty growth from 10% of the run to its end (to its highest value)."""
    after_warmup = rows[rows[:, 0] >= samples // 10]
    return int(after_warmup[:, 1].max() - after_warmup[0, 1])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_private_memory_stays_flat(dataset, method):
    assert len(dataset) >= SAMPLES  # one epoch of random windows: no window read twice
    pages = np.unique(dataset.window_starts(np.arange(SAMPLES)) * 2 // 4096)
    assert pages.size > 0.95 * FILE_TOKENS * 2 / 4096  # the reads span the whole file
    per_worker = _run(dataset, SAMPLES, method)
    assert len(per_worker) == 2 and os.getpid() not in per_worker
    for pid, rows in per_worker.items():
        grew = _growth_kb(rows, SAMPLES)
        assert grew < BOUND_KB, f"worker {pid} grew Private_Dirty by {grew} kB over {SAMPLES} samples"


def test_the_probe_sees_a_leak(dataset):
    samples = 40_000  # 100 batches a worker, each keeping 200 x 65 int64 tokens (104 kB)
    for pid, rows in _run(dataset, samples, "fork", keep=True).items():
        grew = _growth_kb(rows, samples)
        assert grew > 5_000, f"worker {pid}: a leak of ~9 MB after warm-up showed as {grew} kB"


COLLECTING = r"""
import gc, json, os, sys
import numpy as np
from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.loader import build_dataloader


def private_kb():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:"))


class Collecting:
    # one full garbage collection in the worker, at its third batch; Private_Dirty (kB) just
    # before and just after it, with the batch
    def __init__(self, dataset):
        self.dataset, self.calls = dataset, 0

    def __len__(self):
        return len(self.dataset)

    @property
    def fingerprint(self):
        return self.dataset.fingerprint

    def __getitems__(self, indices):
        batch = self.dataset.__getitems__(indices)
        self.calls += 1
        before = private_kb()
        if self.calls == 3:
            gc.collect()
        grew = private_kb() - before
        n = len(indices)
        return {**batch, "grew": np.full(n, grew), "pid": np.full(n, os.getpid())}


path, frozen = sys.argv[1], sys.argv[2] == "frozen"
if not frozen:  # the control: workers that do not freeze what they inherit
    gc.freeze = lambda: None
held = [[i] for i in range(600_000)]  # ~50 MB of tracked objects in the training process
gc.collect()
dataset = FlatTokenDataset(path, FlatDatasetConfig(block_size=64, seed=1))
loader = build_dataloader(Collecting(dataset), micro_batch_size=200, num_workers=2,
                          multiprocessing_context="fork", persistent_workers=False)
grew = {}
for step, batch in enumerate(loader):
    pid = int(batch["pid"][0])
    grew[pid] = max(grew.get(pid, 0), int(batch["grew"][0]))
    if step == 10:
        break
print(json.dumps(sorted(grew.values())))
"""


def test_a_forked_worker_s_collection_does_not_copy_the_training_process_s_objects(dataset):
    # Objects a forked worker inherits share the training process's pages; a collection that
    # scanned them would write to each one and copy every page holding one (the workers freeze
    # them at start). A fresh training process (this test's own holds whatever earlier tests
    # left), holding ~50 MB of objects; the control's workers do not freeze.
    def run(mode: str) -> list[int]:
        out = subprocess.run(
            [sys.executable, "-c", COLLECTING, str(dataset.path), mode],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    frozen, control = run("frozen"), run("control")
    assert len(frozen) == len(control) == 2
    assert min(control) > 20_000, f"the control's collection copied only {control} kB"
    assert max(frozen) < 4_096, f"one collection made {frozen} kB of a worker's memory private"
