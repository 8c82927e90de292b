"""Changing a computed blend's mixture mid-run through the loader (issue 12, point 6): the state
records every source's cursor; resuming into a blend of other weights, or with a source added or
removed, continues every source where it stopped (no sample repeated within its epoch, none
skipped) and the new weights hold from the next step. A Megatron-order blend still refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.datasets.computed.computed_dataset import build_computed_datasets
from tokenload.errors import StateError
from tokenload.loader import build_dataloader

S = 8
FILE_BASE = 1_000_000
"""Token t of file f's stream is ``f * FILE_BASE + t + 1``: a window's first token names it."""


@pytest.fixture
def files(tmp_path):
    """Files a (about 560 windows), b (about 40: it runs out and starts new epochs), c, d."""
    out = {}
    rng = np.random.default_rng(0)
    for f, (name, count) in enumerate((("a", 300), ("b", 20), ("c", 200), ("d", 100))):
        lengths = rng.integers(1, 30, size=count)
        stream = f * FILE_BASE + 1 + np.arange(int(lengths.sum()))
        docs = np.split(stream, np.cumsum(lengths)[:-1])
        out[name] = write_documents(tmp_path / name, docs, dtype=np.int32)
    return out


def _blend(files, weights: dict[str, float], **kw):
    blend = [x for name, w in weights.items() for x in (str(w), files[name])]
    cfg = MegatronDataConfig(sequence_length=S, blend=blend, split="100,0,0", eod_id=0, **kw)
    return build_computed_datasets(cfg, [4000, 0, 0])[0]


def _run(dataset, steps: int, state=None, *, workers: int):
    """(file, window) of every sample the loader serves in ``steps`` micro-batches of 4 on one of
    two data-parallel ranks each (both ranks' batches, in global order), and the state after."""
    loaders = [
        build_dataloader(dataset, micro_batch_size=4, dp_rank=r, dp_size=2, num_workers=workers,
                         multiprocessing_context="fork")
        for r in range(2)
    ]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint stores it
    iters = [iter(loader) for loader in loaders]
    served = []
    for _ in range(steps):
        for it in iters:
            batch = next(it)
            first = batch["tokens"][:, 0].numpy() - 1
            files, within = np.divmod(first, FILE_BASE)
            assert (within % S == 0).all()
            source = [dataset.datasets[d].extent.grid.first_token for d in batch["dataset_id"].tolist()]
            assert (within - np.array(source) >= 0).all()
            served += list(
                zip(
                    files.tolist(),
                    ((within - np.array(source)) // S).tolist(),
                    batch["dataset_id"].tolist(),
                )
            )
    state = loaders[0].state_dict()
    assert loaders[1].state_dict()["mixture"] == state["mixture"]  # ranks agree on the cursors
    for loader in loaders:
        loader.close()
    return served, state


def _check_sources(served, datasets_by_file):
    """Each file's windows, in the order served, are its own order from cursor 0: within an epoch
    none repeats and none is skipped."""
    for f, member in datasets_by_file.items():
        windows = [w for g, w, _ in served if g == f]
        np.testing.assert_array_equal(windows, member.order.global_windows(np.arange(len(windows))))
        n = member.samples_per_epoch
        for e in range(0, len(windows), n):
            epoch = windows[e : e + n]
            assert len(set(epoch)) == len(epoch)
            if len(epoch) == n:
                assert sorted(epoch) == list(range(n))


def _check_weights(served, weights: dict[str, float], names: list[str]):
    """From the first sample of a phase, every prefix is within one sample of the weights."""
    files = np.array([g for g, _, _ in served])
    total = sum(weights.values())
    m = np.arange(1, files.size + 1)
    for name, w in weights.items():
        counts = np.cumsum(files == names.index(name))
        assert (np.abs(counts - m * w / total) < 1 + 1e-9).all(), name


@pytest.mark.parametrize("workers", [0, 2])
def test_weights_and_sources_change_mid_run_without_repeats_or_skips(files, workers):
    names = list(files)
    phases = [
        {"a": 1, "b": 1},
        {"a": 1, "b": 3},  # other weights
        {"a": 2, "c": 1},  # b removed, c added
        {"c": 1, "b": 1, "d": 2, "a": 1},  # b back (continues), d added, another order
    ]
    served_all, state, members = [], None, {}
    for weights in phases:
        dataset = _blend(files, weights)
        for member, name in zip(dataset.datasets, weights):
            members[names.index(name)] = member
        served, state = _run(dataset, 9, state, workers=workers)
        _check_weights(served, weights, names)
        served_all += served
    _check_sources(served_all, members)
    b_windows = members[names.index("b")].samples_per_epoch
    assert sum(g == names.index("b") for g, _, _ in served_all) > b_windows  # b ran into its next epoch


def test_resuming_the_same_blend_continues_the_uninterrupted_order(files):
    weights = {"a": 3, "b": 1, "c": 2}
    whole, _ = _run(_blend(files, weights), 12, workers=0)
    first, state = _run(_blend(files, weights), 5, workers=0)
    rest, _ = _run(_blend(files, weights), 7, state, workers=0)
    assert first + rest == whole


def test_a_changed_phase_resumes_exactly_after_a_second_save(files):
    _, state = _run(_blend(files, {"a": 1, "b": 1}), 4, workers=0)
    second, state2 = _run(_blend(files, {"a": 1, "b": 5}), 3, state, workers=0)
    third, _ = _run(_blend(files, {"a": 1, "b": 5}), 3, state2, workers=0)
    straight, _ = _run(_blend(files, {"a": 1, "b": 5}), 6, state, workers=0)
    assert second + third == straight


def test_the_computed_blends_fingerprint_covers_sources_not_weights(files):
    a = _blend(files, {"a": 1, "b": 1})
    assert a.fingerprint == _blend(files, {"a": 1, "b": 7}).fingerprint
    assert a.fingerprint != _blend(files, {"a": 1, "c": 1}).fingerprint
    assert a.fingerprint != _blend(files, {"a": 1, "b": 1}, random_seed=9).fingerprint


def test_other_seeds_cyclic_samplers_and_megatron_blends_refuse_the_state(files):
    _, state = _run(_blend(files, {"a": 1, "b": 1}), 2, workers=0)
    other_seed = build_dataloader(_blend(files, {"a": 1, "b": 1}, random_seed=9), micro_batch_size=4, dp_size=2,
                                  dp_rank=0, num_workers=0)
    with pytest.raises(StateError, match="order"):
        other_seed.load_state_dict(state)
    cyclic = [
        build_dataloader(_blend(files, w), micro_batch_size=4, dp_size=2, dp_rank=0, num_workers=0, kind="cyclic")
        for w in ({"a": 1, "b": 1}, {"a": 1, "b": 2})
    ]
    with pytest.raises(StateError, match="fingerprint"):
        cyclic[1].load_state_dict(cyclic[0].state_dict())  # the cyclic order cannot change weights
    megatron = []
    for w in ("1", "2"):
        cfg = MegatronDataConfig(
            sequence_length=S, blend=["1", files["a"], w, files["b"]], split="100,0,0", cache="off"
        )
        megatron.append(build_dataloader(build_datasets(cfg, [400, 0, 0])[0], micro_batch_size=4, num_workers=0,
                                         dp_rank=0, dp_size=1))
    with pytest.raises(StateError, match="fingerprint"):
        megatron[1].load_state_dict(megatron[0].state_dict())
    tampered = dict(state, mixture=dict(state["mixture"], consumed=state["consumed_samples"] + 8))
    loader = build_dataloader(_blend(files, {"a": 1, "b": 1}), micro_batch_size=4, dp_size=2, dp_rank=0, num_workers=0)
    with pytest.raises(StateError, match="mixture was saved after"):
        loader.load_state_dict(tampered)
