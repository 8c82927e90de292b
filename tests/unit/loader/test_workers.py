"""The loader's worker processes: batches through shared slots, held batches never overwritten,
errors and dead workers raised in the training process, nothing left behind."""

from __future__ import annotations

import glob
import os
import signal
import sys
import time

import numpy as np
import pytest

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.errors import FormatError
from tokenload.format import write_flat
from tokenload.loader import build_dataloader
from tokenload.loader.workers import WorkerError


@pytest.fixture
def dataset(tmp_path):
    write_flat(tmp_path / "train.bin", np.arange(40_000) % 65_000)
    return FlatTokenDataset(tmp_path / "train.bin", FlatDatasetConfig(block_size=16, seed=3))


def _rings() -> set[str]:
    return set(glob.glob("/dev/shm/tokenload-ring-*"))


def _expected(dataset, mbs: int, steps: int) -> list[np.ndarray]:
    return [dataset.__getitems__(list(range(k * mbs, (k + 1) * mbs)))["tokens"] for k in range(steps)]


@pytest.mark.parametrize("share", ["share_memory_", "pickled for a queue"])
def test_a_batch_moved_to_shared_memory_leaves_later_batches_right(dataset, share):
    """A loop that calls ``share_memory_()`` on a batch's tensor, or pickles one for a
    ``torch.multiprocessing`` queue (which does the same), moves the slot storage's data into a
    segment of its own: every later batch of that slot is still its own, and the moved one
    keeps its values."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the tensors' reductions)

    want = _expected(dataset, 8, 40)
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, dp_rank=0, dp_size=1)
    try:
        for k, batch in zip(range(40), loader):
            assert np.array_equal(batch["tokens"].numpy(), want[k]), k
            if k == 3:
                if share == "share_memory_":
                    batch["tokens"].share_memory_()
                else:
                    ForkingPickler.dumps(batch["tokens"])
                assert batch["tokens"].is_shared()
                assert np.array_equal(batch["labels"].numpy()[:, :-1], want[3][:, 1:])
            del batch  # its slot is reused
    finally:
        loader.close()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_held_batches_keep_their_values(dataset, method):
    """Every batch is kept (more than the slots of a ring): none is overwritten by later ones,
    and writing into one does not change another."""
    before = _rings()
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, dp_rank=0, dp_size=1,
                              multiprocessing_context=method)
    held = list(loader)
    assert len(held) == len(dataset) // 8
    want = _expected(dataset, 8, len(held))
    held[0]["tokens"][:] = -1  # a training loop may write into its batch
    for k in range(1, len(held)):
        assert np.array_equal(held[k]["tokens"].numpy(), want[k]), k
    loader.close()
    assert _rings() <= before


def test_slots_are_reused_once_batches_are_dropped(dataset):
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, dp_rank=0, dp_size=1)
    want = _expected(dataset, 8, 300)
    kept = None
    for k, batch in enumerate(loader):
        if k == 5:
            kept = batch  # one batch held through the whole run
        assert np.array_equal(batch["tokens"].numpy(), want[k])
        if k == 299:
            break
    assert np.array_equal(kept["tokens"].numpy(), want[5])
    pool = loader._pool
    assert all(ring is not None for ring in pool._rings)
    assert sum(len(lent) for lent in pool._lent) <= 3  # the kept batch and the last ones
    loader.close()


class Failing:
    """Raises a typed error on one micro-batch."""

    def __init__(self, dataset, bad: int) -> None:
        self.dataset, self.bad = dataset, bad

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices):
        if self.bad in indices:
            raise FormatError("sample is corrupt", path="train.bin", hint="rebuild it")
        return self.dataset.__getitems__(indices)


class Unpicklable(Exception):
    def __init__(self, a, b):  # pickles but cannot be rebuilt from its args
        super().__init__(a)


class FailingOddly(Failing):
    def __getitems__(self, indices):
        if self.bad in indices:
            raise Unpicklable("odd", 1)
        return self.dataset.__getitems__(indices)


def test_an_error_in_a_worker_is_raised_with_its_type_and_traceback(dataset):
    loader = build_dataloader(Failing(dataset, 8 * 7 + 1), micro_batch_size=8, num_workers=2, dp_rank=0,
                              dp_size=1)
    seen = 0
    with pytest.raises(FormatError, match="sample is corrupt") as info:
        for _ in loader:
            seen += 1
    assert seen == 7
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "loader worker 1" in notes and "micro-batch 7" in notes and "__getitems__" in notes
    loader.restart(8 * 8)  # the workers survive and serve the next iteration
    first = next(iter(loader))
    assert np.array_equal(first["tokens"].numpy(), _expected(dataset, 8, 9)[8])
    loader.close()


def test_an_exception_that_cannot_be_pickled_still_reaches_the_loop(dataset):
    loader = build_dataloader(FailingOddly(dataset, 3), micro_batch_size=8, num_workers=1, dp_rank=0, dp_size=1)
    with pytest.raises(WorkerError, match=r"cannot be pickled(.|\n)*Unpicklable"):
        list(loader)
    loader.close()


def test_a_killed_worker_beyond_the_restart_budget_is_reported(dataset):
    """(A killed worker within the budget is replaced: test_self_heal.)"""
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, dp_rank=0, dp_size=1,
                              max_worker_restarts=0)
    it = iter(loader)
    next(it), next(it)  # worker 1 has delivered micro-batch 1
    victim = loader.worker_processes[1]
    os.kill(victim.pid, signal.SIGKILL)
    t = time.monotonic()
    with pytest.raises(WorkerError, match=rf"worker 1 \(pid {victim.pid}\) was killed by signal 9"
                       r" \(SIGKILL\) \(exit code -9\); last micro-batch it delivered in this"
                       r" iteration: micro-batch \d*[13579]; ") as info:
        for _ in it:
            pass
    assert time.monotonic() - t < 30
    assert "out-of-memory" in str(info.value) and "max_worker_restarts is 0" in str(info.value)
    loader.close()  # the budget is the loader's: closing it starts fresh workers
    loader.restart(0)
    assert np.array_equal(next(iter(loader))["tokens"].numpy(), _expected(dataset, 8, 1)[0])
    assert victim not in loader.worker_processes
    loader.close()
    loader.restart(0)  # and so does one after close
    assert np.array_equal(next(iter(loader))["tokens"].numpy(), _expected(dataset, 8, 1)[0])
    loader.close()


class PerItem:
    """Only ``__getitem__``, returning a dict per sample, and the loading process's state."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"x": np.array([i, i * i]), "torch": np.array("torch" in sys.modules)}


def test_per_item_datasets_travel_through_the_pipe_and_workers_never_import_torch():
    loader = build_dataloader(PerItem(30), micro_batch_size=4, num_workers=2, dp_rank=0, dp_size=1,
                              multiprocessing_context="spawn")
    batches = list(loader)
    assert [b["x"][:, 0].tolist() for b in batches] == [list(range(k, k + 4)) for k in range(0, 28, 4)]
    assert not any(bool(b["torch"].any()) for b in batches)
    loader.close()


def test_a_new_iteration_ends_the_previous_one(dataset):
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, dp_rank=0, dp_size=1)
    old = iter(loader)
    next(old)
    new = iter(loader)
    assert np.array_equal(next(new)["tokens"].numpy(), _expected(dataset, 8, 2)[1])
    with pytest.raises(RuntimeError, match="newer iteration"):
        next(old)
    loader.close()


def test_workers_stop_when_the_loader_is_dropped(dataset):
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, dp_rank=0, dp_size=1)
    next(iter(loader))
    workers = loader.worker_processes
    del loader
    for w in workers:
        w.join(10)
    assert not any(w.is_alive() for w in workers)


def test_idle_persistent_workers_survive_under_forkserver(dataset):
    """Workers check that their parent is alive while they wait; under forkserver their parent is
    the fork server, which must not read as the training process having died."""
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, dp_rank=0, dp_size=1,
                              multiprocessing_context="forkserver", persistent_workers=True)
    want = _expected(dataset, 8, 3)
    first = [b["tokens"].numpy().copy() for b, _ in zip(loader, range(3))]
    time.sleep(2.5)  # longer than the workers' liveness checks
    loader.restart(0)
    again = [b["tokens"].numpy().copy() for b, _ in zip(loader, range(3))]
    assert all(np.array_equal(x, y) and np.array_equal(x, z) for x, y, z in zip(first, again, want))
    loader.close()


class Unshippable:
    def __len__(self) -> int:
        return 10

    def __getitems__(self, indices):
        batch = {"x": np.zeros((len(indices), 2))}
        return {**batch, "how": lambda: 0} if 5 in indices else batch


def test_a_batch_that_cannot_be_pickled_is_an_error_in_the_loop():
    loader = build_dataloader(Unshippable(), micro_batch_size=2, num_workers=1, dp_rank=0, dp_size=1)
    with pytest.raises(WorkerError, match=r"(?s)batch cannot be sent.*pickle.*loader worker 0"):
        list(loader)
    loader.close()


@pytest.mark.parametrize("memfd", [True, False])
def test_ring_slots_round_trip_and_leave_no_file(monkeypatch, memfd):
    from tokenload.loader import ring

    if not memfd:
        monkeypatch.delattr(ring.os, "memfd_create", raising=False)
    before = _rings()
    worker = ring.WorkerRing(ring.batch_bytes({"a": np.zeros((4, 8)), "b": np.zeros(3, np.int32)}), 2)
    assert worker.path.startswith("/proc/") == memfd
    alloc = worker.allocator(1)
    a = alloc((4, 8), np.dtype(np.float64))
    a[...] = np.arange(32).reshape(4, 8)
    layout = worker.write(1, {"a": a, "b": np.array([7, 8, 9], np.int32)})  # b is copied in
    consumer = ring.ConsumerRing(worker.path, worker.slot_bytes, 2)
    assert _rings() == before  # mapped, then no name left
    got = consumer.arrays(1, layout)
    assert np.array_equal(got["a"], np.arange(32).reshape(4, 8)) and got["b"].tolist() == [7, 8, 9]
    assert consumer.in_use(1) and not consumer.in_use(0)
    view = got["a"][1:]
    del got
    assert consumer.in_use(1)  # a view still refers to the slot
    del view
    assert not consumer.in_use(1)
    assert worker.write(0, {"big": np.zeros(worker.slot_bytes + 1, np.uint8)}) is None  # too big: the pipe
    assert worker.write(0, {"text": np.array(["x"])}) is None  # not numeric: the pipe


def test_arrays_the_allocator_made_stay_in_place_and_others_are_copied() -> None:
    """``write`` leaves in place what the slot's allocator made (found by identity), and the
    reshaped or sliced contiguous views of it (found by address); a strided view or an array of
    ordinary memory is copied after them; every field reads back as written."""
    from tokenload.loader import ring

    worker = ring.WorkerRing(1 << 16, 2)
    alloc = worker.allocator(1)
    a = alloc((4, 8), np.dtype(np.int64))
    a[...] = np.arange(32).reshape(4, 8)
    b = alloc((6,), np.dtype(np.int32))
    b[...] = np.arange(6)
    flat, strided, plain = a.reshape(32), b[::2], np.array([5, 6, 7], np.int16)
    batch = {"a": a, "flat": flat, "b": b, "strided": strided, "plain": plain}
    layout = worker.write(1, batch)
    assert layout is not None
    offsets = {name: offset for name, _, _, offset in layout}
    assert offsets["a"] == offsets["flat"] == 0 and offsets["b"] == 256  # in place (aligned)
    assert offsets["strided"] >= 320 and offsets["plain"] > offsets["strided"]  # copied after
    consumer = ring.ConsumerRing(worker.path, worker.slot_bytes, 2)
    got = consumer.arrays(1, layout)
    for name, value in batch.items():
        assert np.array_equal(got[name], value), name


def test_an_array_whose_strides_were_set_in_place_is_copied_as_it_reads() -> None:
    """An array the allocator made, made another layout in place (``strides =``: the same
    object, no longer C-contiguous), is copied in its own order, not taken as laid out in C order
    at its offset."""
    import warnings

    from tokenload.loader import ring

    worker = ring.WorkerRing(4096, 2)
    a = worker.allocator(0)((4, 6), np.dtype(np.int64))
    a[...] = np.arange(24).reshape(4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # NumPy 2.4 deprecates it
        a.shape = (6, 4)
        a.strides = (8, 48)  # the transpose of the original 4 x 6
    want = np.array(a)
    layout = worker.write(0, {"x": a})
    assert layout is not None
    got = ring.ConsumerRing(worker.path, worker.slot_bytes, 2).arrays(0, layout)["x"]
    assert np.array_equal(got, want)


def test_a_raw_field_comes_as_its_bytes_and_holds_nothing_of_its_slot() -> None:
    """The loader's own fields (the packing counts) come out of a slot as a copy of their bytes,
    next to the tensors of the others: no tensor is made for them, and once the tensors are gone
    the slot is free, whatever holds the bytes."""
    from tokenload.loader import ring

    counts = np.arange(32, dtype=np.int64).reshape(16, 2)
    tokens = np.arange(64, dtype=np.int64).reshape(4, 16)
    size = ring.batch_bytes({"tokens": tokens, "counts": counts})
    assert size is not None
    worker = ring.WorkerRing(size, 2)
    layout = worker.write(0, {"tokens": tokens, "counts": counts})
    assert layout is not None
    consumer = ring.ConsumerRing(worker.path, worker.slot_bytes, 2, frozenset({"counts"}))
    got = consumer.tensors(0, layout)
    assert isinstance(got["counts"], bytes) and got["counts"] == counts.tobytes()
    assert np.array_equal(got["tokens"].numpy(), tokens)
    kept = got.pop("counts")
    assert consumer.in_use(0)  # the tokens tensor
    del got
    assert not consumer.in_use(0) and kept == counts.tobytes()
    worker.write(0, {"tokens": tokens + 1, "counts": counts + 1})  # the slot reused
    again = consumer.tensors(0, layout)
    assert again["counts"] == (counts + 1).tobytes() and kept == counts.tobytes()


@pytest.mark.parametrize("shared_memory,pin", [(False, False), (True, True)])
def test_without_shared_memory_and_with_pinning_the_batches_are_the_same(dataset, shared_memory, pin):
    """shared_memory=False: every batch travels pickled through the pipe (several per message);
    pin_memory=True on a machine without CUDA is skipped, as torch's DataLoader does."""
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, dp_rank=0, dp_size=1,
                              shared_memory=shared_memory, pin_memory=pin, prefetch_factor=8)
    want = _expected(dataset, 8, 40)
    for k, batch in zip(range(40), loader):
        assert np.array_equal(batch["tokens"].numpy(), want[k])
    assert all(ring is None for ring in loader._pool._rings) != shared_memory
    loader.close()


def _in_slots(batch, pool) -> bool:
    tokens = batch["tokens"].numpy()
    return any(np.shares_memory(tokens, s) for ring in pool._rings if ring is not None for s in ring._slots)


def test_abandoned_iterations_give_their_slots_back(dataset):
    """Breaking out of iterations (with batches made ahead and already received) many times over
    does not use up the slots: later batches still come through shared memory."""
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, dp_rank=0, dp_size=1,
                              persistent_workers=True)
    for _ in range(12):
        loader.restart(0)
        for _, batch in zip(range(5), loader):  # noqa: B007  (deleted below: no reference kept)
            pass
        del batch
    loader.restart(0)
    want = _expected(dataset, 8, 30)
    for k, batch in zip(range(30), loader):
        assert np.array_equal(batch["tokens"].numpy(), want[k])
        assert _in_slots(batch, loader._pool), k
    loader.close()


def test_an_abandoned_iterator_collected_later_leaves_the_new_iteration_alone(dataset):
    """persistent_workers=False: workers stop with their iteration, but dropping an old iterator
    after a new one started must not stop the new one's workers."""
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, dp_rank=0, dp_size=1,
                              persistent_workers=False)
    old = iter(loader)
    next(old)
    loader.restart(0)
    new = iter(loader)
    first = next(new)
    del old  # collected now, after the new iteration started
    want = _expected(dataset, 8, 6)
    got = [first] + [next(new) for _ in range(5)]
    assert all(np.array_equal(b["tokens"].numpy(), w) for b, w in zip(got, want))
    workers = loader.worker_processes
    del new  # the last iteration ends: its workers stop
    assert not loader.worker_processes
    for w in workers:
        w.join(10)
    assert not any(w.is_alive() for w in workers)


def test_ring_tensors_are_fresh_aliases_that_hold_their_slot():
    """Tensors over a slot are aliases of views made once per slot: whatever refers to the slot
    (a handed tensor, a view of it, its NumPy array, its storage object) keeps the slot lent, and
    a loop that reshapes its tensor in place does not change the next batch of that slot."""
    import torch  # not at the top: spawned workers import this module, and must not import torch

    from tokenload.loader import ring

    size = ring.batch_bytes({"a": np.zeros((4, 8)), "b": np.zeros(3, np.int32)})
    worker = ring.WorkerRing(size, 2)
    alloc = worker.allocator(1)
    a = alloc((4, 8), np.dtype(np.float64))
    a[...] = np.arange(32).reshape(4, 8)
    layout = worker.write(1, {"a": a, "b": np.array([7, 8, 9], np.int32)})
    consumer = ring.ConsumerRing(worker.path, worker.slot_bytes, 2)
    holds = (
        lambda t: t["a"][1:], lambda t: t["b"].numpy(), lambda t: t["a"].untyped_storage(), lambda t: t
    )
    for hold in holds:
        got = consumer.tensors(1, layout)
        assert got["a"].dtype == torch.float64 and got["b"].tolist() == [7, 8, 9]
        assert np.array_equal(got["a"].numpy(), np.arange(32).reshape(4, 8))
        kept = hold(got)
        del got
        assert consumer.in_use(1) and not consumer.in_use(0)
        del kept
        assert not consumer.in_use(1)
    got = consumer.tensors(1, layout)
    got["a"].unsqueeze_(0)  # the loop's own alias
    got["b"][0] = 70  # writes land in the slot
    del got
    again = consumer.tensors(1, layout)
    assert again["a"].shape == (4, 8) and again["b"].tolist() == [70, 8, 9]
    a = worker.allocator(1)((4, 8), np.dtype(np.float64))
    a[...] = 5
    assert worker.write(1, {"a": a, "b": np.array([1, 2, 3], np.int32)}) == layout
    assert again["b"].tolist() == [1, 2, 3]  # the worker's next batch in that slot, without a copy


def test_loops_that_reshape_their_batches_in_place_get_every_batch_right(dataset):
    """Slots are reused many times over; a loop that changes its tensors' shapes in place and
    writes into them sees every later batch with its own shape and values."""
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, dp_rank=0, dp_size=1)
    want = _expected(dataset, 8, 200)
    for k, batch in zip(range(200), loader):
        tokens = batch["tokens"]
        assert tokens.shape == (8, 16) and np.array_equal(tokens.numpy(), want[k]), k
        # each worker's first batch sizes its slots and travels through the pipe
        assert _in_slots(batch, loader._pool) == (k >= 2), k
        tokens.unsqueeze_(0)[:] = -1
        batch["labels"].t_()
    loader.close()
