"""``metrics()["sources"]`` and the repeat warning after a computed blend's sources change at a
resume (issue 36, point 12): each source's ``drawn``, ``epoch`` and ``repeating``, and the
warnings, equal a count of the samples the job delivered (every rank's, over both runs), whatever
this rank happened to see; a source added at the resume is not called repeating after a few
samples, and sources past an epoch show it."""

from __future__ import annotations

import json
import logging
from collections import Counter

import numpy as np
import pytest
import test_mixture_resume as base

from tokenload.datasets import MegatronDataConfig
from tokenload.datasets.computed.computed_dataset import build_computed_datasets
from tokenload.loader import build_dataloader

pytestmark = pytest.mark.timeout(240)

files = base.files  # the fixture: token t of file f's stream is f * FILE_BASE + t + 1
FILE_BASE, S = base.FILE_BASE, base.S

NAMES = ["a", "b", "c", "d"]
LOGGER = "tokenload.loader"


def _blend(files, names):
    paths = [x for name in names for x in ("1", files[name])]
    cfg = MegatronDataConfig(
        sequence_length=S, blend=paths, split="100,0,0", eod_id=0, order="computed"
    )
    return build_computed_datasets(cfg, [4000, 0, 0])[0]


def _run(dataset, steps, state, *, dp=2, mbs=4):
    """The file of every sample ``dp`` ranks serve in ``steps`` micro-batches each, rank 0's
    loader (closed, for its metrics) and the state after them."""
    loaders = [
        build_dataloader(dataset, micro_batch_size=mbs, dp_rank=r, dp_size=dp, num_workers=0)
        for r in range(dp)
    ]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint stores it
    iters = [iter(loader) for loader in loaders]
    files_served = []
    for _ in range(steps):
        for it in iters:
            first = next(it)["tokens"][:, 0].numpy() - 1
            files_served += (first // FILE_BASE).tolist()
    for loader in loaders:
        loader.close()
    return files_served, loaders[0], loaders[0].state_dict()


def _warned(caplog):
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "repeating" in r.getMessage()
    ]


def _expect(dataset, names, counted):
    """(drawn, samples_per_epoch, epoch, repeating) per member of ``dataset``, from the count."""
    out = {}
    for name, member in zip(names, dataset.datasets):
        drawn, per_epoch = counted[NAMES.index(name)], member.samples_per_epoch
        out[name] = (drawn, per_epoch, drawn // per_epoch, drawn > per_epoch)
    return out


def _reported(loader, names):
    return {
        name: (s["drawn"], s["samples_per_epoch"], s["epoch"], s["repeating"])
        for name, s in zip(names, loader.metrics()["sources"])
    }


@pytest.mark.parametrize("changed", [["a", "b", "c"], ["c", "b", "d"]])
def test_after_a_source_change_sources_and_warnings_follow_the_delivered_samples(
    files, changed, caplog
):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    first = ["a", "b"]
    head, loader, state = _run(_blend(files, first), 16, None)  # 128 samples: b (~40) repeats
    counted = Counter(head)
    assert _reported(loader, first) == _expect(_blend(files, first), first, counted)
    assert _reported(loader, first)["b"][3]  # the setup: b is past its first epoch
    assert len(_warned(caplog)) == 2  # b, once per rank
    caplog.clear()

    dataset = _blend(files, changed)
    tail, loader, _ = _run(dataset, 2, state)  # 16 samples: each new source serves a few
    counted.update(tail)
    expected = _expect(dataset, changed, counted)
    assert _reported(loader, changed) == expected
    m = loader.metrics()
    assert m["repeating"] == [files[n] for n in changed if expected[n][3]]
    job = {s["name"]: s for s in m["job"]["sources"] if s["active"]}
    for name, s in zip(changed, m["sources"]):
        assert (s["drawn"], s["epoch"]) == (job[files[name]]["drawn"], job[files[name]]["epoch"])
    # every source the job drew past its epoch is warned about (here, by each of the 2 ranks'
    # fresh counters), and no other
    repeating = {files[n] for n in changed if expected[n][3]}
    warned = Counter(f for msg in _warned(caplog) for f in files.values() if f"source {f} " in msg)
    assert warned == Counter({f: 2 for f in repeating})


def test_a_new_source_warns_when_its_own_draws_pass_its_epoch(files, caplog):
    """b, added at the resume with all the weight left, warns at the step that takes it past its
    epoch, not before."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    _, _, state = _run(_blend(files, ["a", "c"]), 8, None)
    dataset = _blend(files, ["a", "b"])
    per_epoch = dataset.datasets[1].samples_per_epoch
    loaders = [
        build_dataloader(dataset, micro_batch_size=4, dp_rank=r, dp_size=2, num_workers=0)
        for r in range(2)
    ]
    for loader in loaders:
        loader.load_state_dict(json.loads(json.dumps(state)))
    iters = [iter(loader) for loader in loaders]
    drawn, warned_at = 0, None
    for step in range(40):
        for it in iters:
            first = next(it)["tokens"][:, 0].numpy() - 1
            drawn += int(np.count_nonzero(first // FILE_BASE == NAMES.index("b")))
        if _warned(caplog) and warned_at is None:
            warned_at = (step, drawn)
        if warned_at is None:
            assert drawn <= per_epoch, step
    assert warned_at is not None and warned_at[1] > per_epoch
    assert len(_warned(caplog)) == 2  # once per rank
