"""The DataLoader entry point: exact resume, fingerprints, start methods, bounded memory."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.errors import ConfigError, StateError
from tokenload.format import write_flat
from tokenload.loader import build_dataloader


@pytest.fixture
def dataset(tmp_path):
    write_flat(tmp_path / "train.bin", np.arange(60_000) % 65_000)
    return FlatTokenDataset(tmp_path / "train.bin", FlatDatasetConfig(block_size=16, seed=5))


def _starts(batches):
    return [b["tokens"][:, 0].tolist() for b in batches]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_gives_the_next_batches_exactly(dataset, num_workers):
    cfg = dict(micro_batch_size=4, dp_rank=1, dp_size=3, num_workers=num_workers)
    reference = _starts(itertools.islice(build_dataloader(dataset, **cfg), 20))
    first = build_dataloader(dataset, **cfg)
    it = iter(first)
    head = _starts(itertools.islice(it, 12))
    state = first.state_dict()
    assert state["consumed_samples"] == 12 * 4 * 3
    resumed = build_dataloader(dataset, **cfg)
    resumed.load_state_dict(state)
    tail = _starts(itertools.islice(resumed, 8))
    assert head + tail == reference
    batch = next(iter(resumed))
    assert batch["tokens"].dtype == torch.int64 and batch["tokens"].shape == (4, 16)


def test_resume_with_persistent_workers_restarts_from_state(dataset):
    loader = build_dataloader(dataset, micro_batch_size=2, num_workers=2, persistent_workers=True)
    first_epoch_head = _starts(itertools.islice(loader, 3))
    state = loader.state_dict()
    again = _starts(itertools.islice(loader, 2))  # continues where the loader stands
    loader.load_state_dict(state)
    assert _starts(itertools.islice(loader, 2)) == again
    fresh = build_dataloader(dataset, micro_batch_size=2, num_workers=0)
    assert _starts(itertools.islice(fresh, 5)) == first_epoch_head + again
    assert len(loader) == len(dataset) // 2 - 5


def test_state_for_other_data_is_refused(dataset, tmp_path):
    state = build_dataloader(dataset, micro_batch_size=2, num_workers=0).state_dict()
    other = FlatTokenDataset(dataset.path, FlatDatasetConfig(block_size=16, seed=6))
    loader = build_dataloader(other, micro_batch_size=2, num_workers=0)
    with pytest.raises(StateError, match="fingerprint") as info:
        loader.load_state_dict(state)
    assert "HINT" in str(info.value)
    with pytest.raises(StateError, match="version"):
        loader.load_state_dict({**state, "version": 99})
    odd = dict(build_dataloader(other, micro_batch_size=3, num_workers=0).state_dict(), consumed_samples=3)
    with pytest.raises(StateError, match="not a multiple"):
        loader.load_state_dict(odd)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_start_methods(dataset, method):
    loader = build_dataloader(dataset, micro_batch_size=8, num_workers=2, multiprocessing_context=method)
    got = _starts(itertools.islice(loader, 6))
    want = [dataset.__getitems__(list(range(i * 8, i * 8 + 8)))["tokens"][:, 0].tolist() for i in range(6)]
    assert got == want


def test_bad_loader_config(dataset):
    with pytest.raises(ConfigError):
        build_dataloader(dataset, micro_batch_size=2, kind="random")
    with pytest.raises(ConfigError):
        build_dataloader(dataset, micro_batch_size=2, multiprocessing_context="threads")


def test_drop_last_false_counts_only_what_is_left_and_close_stops_workers(tmp_path):
    write_flat(tmp_path / "small.bin", np.arange(161) % 65_000)  # 10 windows of 16
    ds = FlatTokenDataset(tmp_path / "small.bin", FlatDatasetConfig(block_size=16, seed=1))
    loader = build_dataloader(ds, micro_batch_size=4, num_workers=2, drop_last=False, persistent_workers=True)
    sizes = [len(b["tokens"]) for b in loader]
    assert sizes == [4, 4, 2] and loader.state_dict()["consumed_samples"] == 10
    workers = loader.worker_processes
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    loader.close()
    assert loader._iterator is None and not any(w.is_alive() for w in workers)
    loader.restart(4)
    assert [len(b["tokens"]) for b in loader] == [4, 2]


def test_prefetch_factor_default_is_what_the_hint_and_docstring_say(dataset):
    with pytest.raises(ConfigError, match=r"prefetch_factor is 0\nHINT: use 1 or more \(or None for 4\)"):
        build_dataloader(dataset, micro_batch_size=2, prefetch_factor=0)
    loader = build_dataloader(dataset, micro_batch_size=2, num_workers=1)
    next(iter(loader))
    assert loader._iterator.prefetch == 4  # the worker pool's credit window
    loader.close()
