"""A weights schedule through the loader (issue 26, point 1): resuming anywhere in the schedule,
on any data-parallel size, micro-batch size and worker count, continues bit-exactly; a resume
with another schedule continues every source at its cursor."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_mixture_resume import FILE_BASE, S, files  # noqa: F401  (files is a fixture)

from tokenload.datasets import MegatronDataConfig
from tokenload.datasets.computed.computed_dataset import build_computed_datasets
from tokenload.errors import ConfigError
from tokenload.loader import build_dataloader

# several loaders (some with fork workers) per test: ~10 s alone, minutes on a loaded machine
pytestmark = pytest.mark.timeout(240)

NAMES = ["a", "b", "c", "d"]
SCHEDULE = [(0, [5, 3, 0, 0]), (48, [2, 3, 4, 0]), (120, [0, 3, 1, 2]), (200, [1, 0, 0, 1])]
TOTAL = 312


def blend(files, schedule=SCHEDULE, names=NAMES, **kw):
    """A computed blend of ``names`` (weights 1 each, replaced by the schedule when given)."""
    paths = [x for name in names for x in ("1", files[name])]
    cfg = MegatronDataConfig(sequence_length=S, blend=paths, split="100,0,0", eod_id=0,
                             order="computed", weights_schedule=schedule, **kw)
    return build_computed_datasets(cfg, [4000, 0, 0])[0]


def serve(dataset, samples: int, state=None, *, dp=2, mbs=4, workers=0, skip=None):
    """(file, window) of the next ``samples`` global samples, read by ``dp`` ranks (every rank's
    micro-batches put back in global order), and rank 0's state after them. ``skip``: call
    ``loader.skip(samples=skip)`` on every rank first."""
    loaders = [
        build_dataloader(dataset, micro_batch_size=mbs, dp_rank=r, dp_size=dp, num_workers=workers,
                         multiprocessing_context="fork")
        for r in range(dp)
    ]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint stores it
        if skip:
            loader.skip(samples=skip)
    iters = [iter(loader) for loader in loaders]
    served = []
    for _ in range(samples // (mbs * dp)):
        for it in iters:
            served += identify(dataset, next(it))
    state = loaders[0].state_dict()
    saved = json.dumps(state["mixture"])
    assert all(json.dumps(x.state_dict()["mixture"]) == saved for x in loaders)
    for loader in loaders:
        loader.close()
    return served, state


def identify(dataset, batch):
    """(file, window within the source's split) of every sample of a batch."""
    first = batch["tokens"][:, 0].numpy() - 1
    file, within = np.divmod(first, FILE_BASE)
    ids = batch["dataset_id"].tolist()
    begin = np.array([dataset.datasets[d].extent.grid.first_token for d in ids])
    assert ((within - begin) % S == 0).all()
    return list(zip(file.tolist(), ((within - begin) // S).tolist()))


@pytest.mark.parametrize("at, dp, mbs, workers", [
    (30, 3, 2, 0), (48, 4, 3, 2), (58, 1, 2, 0), (130, 2, 13, 0), (144, 3, 4, 2), (202, 2, 1, 2),
])
def test_resuming_anywhere_in_the_schedule_continues_bit_exactly(files, at, dp, mbs, workers):
    whole, _ = serve(blend(files), TOTAL, dp=4, mbs=2)
    head, state = serve(blend(files), at, dp=1, mbs=2)
    tail, _ = serve(blend(files), TOTAL - at, state, dp=dp, mbs=mbs, workers=workers)
    assert head + tail == whole


def test_the_schedule_changes_the_shares_at_each_start(files):
    served, _ = serve(blend(files), TOTAL)
    source = np.array([f for f, _ in served])
    bounds = [s for s, _ in SCHEDULE] + [TOTAL]
    for (start, weights), end in zip(SCHEDULE, bounds[1:]):
        phase = source[start:end]
        m = np.arange(1, phase.size + 1)
        for d, w in enumerate(weights):
            error = np.abs(np.cumsum(phase == d) - m * w / sum(weights))
            assert (error < 1 + 1e-9).all(), (start, d)


def test_a_resume_into_another_schedule_continues_every_source(files):
    _, state = serve(blend(files), 80)
    other = [(0, [1, 1, 1, 1]), (150, [0, 0, 0, 1])]
    tail, state2 = serve(blend(files, other), 120, state, dp=4, mbs=2)
    first, _ = serve(blend(files), 80)
    members = blend(files).datasets
    for f, member in enumerate(members):
        windows = [w for g, w in first + tail if g == f]
        np.testing.assert_array_equal(windows, member.order.global_windows(np.arange(len(windows))))
    assert {g for g, _ in tail[150 - 80:]} == {3}  # the other schedule's last entry, from 150
    assert state2["mixture"]["phase"]["consumed"] == 80  # the new chain's origin


def test_schedules_are_checked_against_the_blend(files):
    with pytest.raises(ConfigError, match="3 sources"):
        blend(files, [(0, [1, 1, 1, 1])], names=["a", "b", "c"])
    with pytest.raises(ConfigError, match="not 'neox'"):
        MegatronDataConfig(sequence_length=S, blend=["x", "y"], split="1,0,0", order="neox",
                           weights_schedule=[(0, [1, 1])])
    with pytest.raises(ConfigError, match="mixture_change"):
        MegatronDataConfig(sequence_length=S, blend=["x", "y"], split="1,0,0", mixture_change="yes")
    with pytest.raises(ConfigError, match="needs a blend"):
        cfg = MegatronDataConfig(sequence_length=S, blend=[files["a"]], split="1,0,0",
                                 order="computed", weights_schedule=[(0, [1])])
        build_computed_datasets(cfg, [100, 0, 0])
