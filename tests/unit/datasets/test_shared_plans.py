"""The computed order's packed blocks shared by a loader's workers (``shared_plans``): a block
packed by one process is read by the others, never packed twice, and never read back damaged;
a process waits for another only so long, a killed one's lock dies with it, and the folder goes
with the workers."""

from __future__ import annotations

import fcntl
import os
import pickle
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from tokenload.datasets import build_datasets
from tokenload.datasets.computed import packed as packed_module
from tokenload.datasets.computed import shared_plans
from tokenload.datasets.computed.computed_blend import ComputedBlendedDataset
from tokenload.datasets.computed.packed import ComputedPackedDataset
from tokenload.datasets.computed.shared_plans import SharedPlans
from tokenload.loader import build_dataloader
from unit.datasets.test_packing import config, corpus


def _dataset(tmp_path: Path) -> ComputedPackedDataset:
    prefix, _ = corpus(tmp_path, 1, 900, seed=31)
    train, _, _ = build_datasets(config(blend=[prefix]), [100, 0, 0])
    assert isinstance(train, ComputedPackedDataset)
    return ComputedPackedDataset(
        train.source, train.extent, train.item, seed=7, length=None, block_documents=64
    )


def _sharing(tmp_path: Path) -> tuple[Path, ComputedPackedDataset, ComputedPackedDataset, ComputedPackedDataset]:
    """A plans folder, two datasets sharing it (two processes' worth) and one packing alone."""
    folder = tmp_path / "plans"
    folder.mkdir()
    first, second, alone = _dataset(tmp_path), _dataset(tmp_path), _dataset(tmp_path)
    first.share_plans(str(folder))
    second.share_plans(str(folder))
    return folder, first, second, alone


def _no_packing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a block was packed again")

    monkeypatch.setattr(packed_module, "pack_block", refuse)


def _same(a: dict, b: dict) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in ("windows", "row_tokens", "piece_first", "piece_length"))


def test_a_block_packed_by_one_process_is_read_by_the_others(tmp_path, monkeypatch) -> None:
    folder, first, second, alone = _sharing(tmp_path)
    late = len(alone) - 20  # past the first blocks: a resume's search counts them
    rows = [np.arange(0, 16), np.arange(late, late + 16)]
    want = [alone.read_batch(r) for r in rows]
    got = [first.read_batch(r) for r in rows]
    assert all(_same(g, w) for g, w in zip(got, want, strict=True))
    assert list(folder.glob("*.plan")), "nothing was published"
    _no_packing(monkeypatch)  # the second process finds every block, and every count, there
    for r, w in zip(rows, want, strict=True):
        assert _same(second.read_batch(r), w)


@pytest.mark.parametrize("damage", ["flipped", "truncated", "empty", "header only"])
def test_a_damaged_block_is_packed_again_not_read(tmp_path, monkeypatch, damage) -> None:
    folder, first, second, alone = _sharing(tmp_path)
    rows = np.arange(0, 16)
    want = alone.read_batch(rows)
    first.read_batch(rows)
    len(second)  # its counts, read from the folder
    plan = Path(SharedPlans(str(folder))._path(second.rows._plan_key(0, 0), "plan"))
    data = plan.read_bytes()
    if damage == "flipped":  # a bit of the arrays: the digest no longer matches
        broken = bytearray(data)
        broken[-5] ^= 0x10
        plan.write_bytes(bytes(broken))
    elif damage == "truncated":
        plan.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        plan.write_bytes(b"")
    else:
        plan.write_bytes(data[: shared_plans._HEADER.size])
    packed = []
    real = packed_module.pack_block  # type: ignore[attr-defined]  # patched where it is used

    def spy(*args, **kwargs):
        packed.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(packed_module, "pack_block", spy)
    assert _same(second.read_batch(rows), want)
    assert packed == [1], "the damaged block was read instead of packed again"


@pytest.mark.parametrize("damage", ["count", "another key's", "short"])
def test_a_damaged_row_count_is_counted_again_not_read(tmp_path, damage) -> None:
    # a wrong count moves every later row of the source: a resume's search would serve others
    folder, first, second, alone = _sharing(tmp_path)
    late = len(alone) - 20
    rows = np.arange(late, late + 16)
    want = alone.read_batch(rows)
    first.read_batch(rows)  # publishes the counts of every block before it
    shared = SharedPlans(str(folder))
    keys = [first.rows._plan_key(0, b) for b in range(3)]
    path = Path(shared._path(keys[0], "rows"))
    data = path.read_bytes()
    assert shared.rows(keys[0]) is not None
    if damage == "count":  # magic kept, the count less 7
        count = int.from_bytes(data[8:16], "little") - 7
        path.write_bytes(data[:8] + count.to_bytes(8, "little") + data[16:])
    elif damage == "another key's":
        path.write_bytes(Path(shared._path(keys[1], "rows")).read_bytes())
    else:
        path.write_bytes(data[:16])
    assert shared.rows(keys[0]) is None
    assert _same(second.read_batch(rows), want)


def test_waiting_for_another_process_is_bounded(tmp_path, monkeypatch) -> None:
    """A process that holds a block's lock and never publishes (stuck) holds the others back
    for WAIT_S only: they pack the block themselves."""
    monkeypatch.setattr(shared_plans, "WAIT_S", 0.3)
    store = SharedPlans(str(tmp_path))
    key = "block"
    holder = os.open(store._path(key, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        began = time.monotonic()
        assert store.claim(key) is None
        assert 0.25 < time.monotonic() - began < 5
    finally:
        os.close(holder)
    fd = store.claim(key)  # free again
    assert fd is not None
    store.release(fd)


def test_a_killed_process_s_lock_dies_with_it(tmp_path) -> None:
    store = SharedPlans(str(tmp_path))
    key = "block"
    pid = os.fork()
    if pid == 0:  # the child takes the lock, says so, and waits to be killed
        try:
            fd = store.claim(key)
            Path(tmp_path, "held.tmp").write_text(str(fd is not None))
            os.replace(Path(tmp_path, "held.tmp"), Path(tmp_path, "held"))  # seen whole or not
            time.sleep(60)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while not Path(tmp_path, "held").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert Path(tmp_path, "held").read_text() == "True"
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        began = time.monotonic()
        fd = store.claim(key)
        assert fd is not None and time.monotonic() - began < 1.0
        store.release(fd)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def test_a_folder_that_cannot_be_written_leaves_each_process_packing_alone(tmp_path) -> None:
    folder = tmp_path / "plans"
    folder.mkdir()
    first, alone = _dataset(tmp_path), _dataset(tmp_path)
    first.share_plans(str(folder))
    folder.chmod(0o500)  # read-only (root ignores it: then the folder is removed instead)
    if os.access(folder, os.W_OK):
        folder.chmod(0o700)
        folder.rmdir()
    try:
        rows = np.arange(20, 36)
        assert _same(first.read_batch(rows), alone.read_batch(rows))
    finally:
        if folder.exists():
            folder.chmod(0o700)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_share_blocks_serve_the_same_rows_and_leave_no_folder(tmp_path, context) -> None:
    prefix, _ = corpus(tmp_path, 1, 900, seed=33)
    train, _, _ = build_datasets(config(blend=[prefix]), [96, 0, 0])
    assert train is not None
    alone = build_dataloader(train, micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=0)
    want = [b["tokens"].numpy().copy() for b in alone]
    fresh, _, _ = build_datasets(config(blend=[prefix]), [96, 0, 0])  # nothing packed yet
    assert fresh is not None
    loader = build_dataloader(
        fresh,
        micro_batch_size=4,
        dp_rank=0,
        dp_size=1,
        num_workers=2,
        multiprocessing_context=context,
    )
    got = [b["tokens"].numpy().copy() for b in loader]
    folder = loader._pool._plans if loader._pool is not None else None
    assert folder is not None and os.path.isdir(folder)
    assert any(name.endswith(".rows") for name in os.listdir(folder)), "no block was shared"
    loader.close()
    assert not os.path.exists(folder)
    assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))


def test_two_files_alike_to_the_sampled_identity_never_share_a_plan(tmp_path) -> None:
    """The computed order names a split by its sizes and the lengths at its two ends: two files
    that differ only in the middle (two documents' places swapped) get the same identity, and a
    blend of both once shared one plan between them across its workers (red-team finding: the
    second file's rows served with the first one's lengths). Each member now shares under its
    place in the blend."""
    from support import write_documents
    from unit.datasets.test_packing import named

    rng = np.random.default_rng(3)
    n = 2600  # more than the 2 x 1,024 lengths the identity samples
    lengths = np.minimum(rng.lognormal(np.log(12), 1.0, n).astype(int) + 1, 200).tolist()
    lengths[1300], lengths[1301] = 5, 60
    swapped = list(lengths)
    swapped[1300], swapped[1301] = lengths[1301], lengths[1300]
    prefixes = [
        write_documents(tmp_path / name, [named(s, d, k) for d, k in enumerate(lens)], dtype=np.int32)
        for s, name, lens in ((1, "a", lengths), (2, "b", swapped))
    ]
    blend, _, _ = build_datasets(config(blend=["0.5", prefixes[0], "0.5", prefixes[1]]), [400, 0, 0])
    assert isinstance(blend, ComputedBlendedDataset)
    a, b = blend.datasets
    assert a.extent.identity == b.extent.identity  # the premise: the sampled identities agree
    folder = tmp_path / "plans"
    folder.mkdir()
    first, second = (pickle.loads(pickle.dumps(blend)) for _ in range(2))  # two workers
    first.share_plans(str(folder))
    second.share_plans(str(folder))
    rows = np.arange(len(blend))
    want = blend.read_batch(rows)
    first.datasets[0].read_batch(np.arange(16))  # the first worker packs member 0's block
    got = second.read_batch(rows)  # the second reads both members' blocks from the folder
    for key in ("windows", "row_tokens", "piece_first", "piece_length", "dataset_id"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_a_source_read_for_many_epochs_keeps_few_plans_in_the_folder(tmp_path) -> None:
    """Blocks two behind the one being read are removed, counted across epochs (a source of two
    blocks per epoch kept two plans of every epoch it had read: red-team finding)."""
    prefix, _ = corpus(tmp_path, 1, 900, seed=31)
    train, _, _ = build_datasets(config(blend=[prefix]), [100, 0, 0])
    assert isinstance(train, ComputedPackedDataset)
    one = ComputedPackedDataset(
        train.source, train.extent, train.item, seed=7, length=None, block_documents=500
    )
    assert one.rows.num_blocks == 2
    epochs = 12
    many = ComputedPackedDataset(
        train.source, train.extent, train.item, seed=7, length=epochs * len(one), block_documents=500
    )
    folder = tmp_path / "plans"
    folder.mkdir()
    many.share_plans(str(folder))
    most = 0
    for begin in range(0, len(many) - 16, 16):
        many.read_batch(np.arange(begin, begin + 16))
        most = max(most, len(list(folder.glob("*.plan"))))
    assert many.rows.epoch_rows(epochs - 1) is not None  # every epoch was read
    assert most <= 3, most


_KILLED = r"""
import os, signal, sys
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.loader import build_dataloader
config = MegatronDataConfig(sequence_length=32, order="computed", packing="best-fit",
                            split="1,0,0", random_seed=7, blend=[sys.argv[1]])
train = build_datasets(config, [200, 0, 0])[0]
loader = build_dataloader(train, micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=2)
it = iter(loader)
for _ in range(5):
    next(it)
print(loader._pool._plans, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no clean-up runs
"""


def test_the_folder_of_a_killed_training_process_goes_with_the_next_loader(tmp_path) -> None:
    """A training process killed outright (SIGKILL: the OOM killer, a preempted node) leaves
    its plans folder in shared memory (red-team finding: a few MB per packed source, kept until
    the machine restarts). The next loader that makes a folder removes it once its process and
    workers are gone, and leaves a live loader's alone."""
    import subprocess
    import sys

    from tokenload.loader import plan_folders

    prefix, _ = corpus(tmp_path, 1, 900, seed=31)
    live_train, _, _ = build_datasets(config(blend=[prefix]), [96, 0, 0])
    assert live_train is not None
    live = build_dataloader(live_train, micro_batch_size=4, num_workers=2)
    try:
        next(iter(live))
        assert live._pool is not None and live._pool._plans is not None
        run = subprocess.run(
            [sys.executable, "-c", _KILLED, prefix], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == -signal.SIGKILL, run.stderr
        dead = run.stdout.split()[-1]
        assert os.path.isdir(dead) and any(Path(dead).glob("*.plan"))
        lock = os.open(os.path.join(dead, "owner.lock"), os.O_RDONLY)
        deadline = time.monotonic() + 30  # its workers see their parent gone within ~1 s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                assert time.monotonic() < deadline, "the killed loader's workers did not end"
                time.sleep(0.1)
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)
        assert os.path.isdir(dead)
        again, _, _ = build_datasets(config(blend=[prefix]), [96, 0, 0])
        assert again is not None
        other = build_dataloader(again, micro_batch_size=4, num_workers=2)  # makes its folder
        next(iter(other))
        assert not os.path.exists(dead)
        assert other._pool is not None and other._pool._plans != live._pool._plans
        assert os.path.isdir(live._pool._plans)  # held by a live loader: kept
        assert plan_folders.sweep(os.path.dirname(dead)) == []
        other.close()
    finally:
        live.close()
