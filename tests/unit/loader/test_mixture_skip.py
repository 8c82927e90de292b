"""Skips and exact accounting (issue 26, points 5 and 6): ``loader.skip(samples=N)`` drops the next
N global samples, the stream afterwards is the unskipped stream from there, the skip travels in
the state; the job's per-source figures equal a count over the delivered samples and are the same
whatever the data-parallel size, micro-batch size and worker count."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from test_mixture_resume import S, files  # noqa: F401  (files is a fixture)
from test_mixture_schedule import blend, identify, serve

from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import ConfigError, StateError
from tokenload.loader import build_dataloader

# several loaders (some with fork workers) per test: ~10 s alone, minutes on a loaded machine
pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("dp, mbs, workers", [(2, 4, 0), (4, 2, 2)])
def test_the_stream_after_a_skip_is_the_unskipped_stream_from_there(files, dp, mbs, workers):
    whole, _ = serve(blend(files), 256)
    head, state = serve(blend(files), 48)
    tail, after = serve(blend(files), 96, state, dp=dp, mbs=mbs, workers=workers, skip=64)
    assert tail == whole[112:208] and head == whole[:48]
    assert after["consumed_samples"] == 208
    assert [(s["at"], s["samples"]) for s in after["skips"]] == [(48, 64)]
    names = blend(files).sources
    skipped = Counter(names[f] for f, _ in whole[48:112])
    assert after["skips"][0]["sources"] == dict(skipped)
    # a later resume keeps the record and its per-source figures
    more, later = serve(blend(files), 48, after, dp=1, mbs=8)
    assert more == whole[208:256] and later["skips"] == after["skips"]
    job = {s["source"]: s for s in later["accounting"]["sources"]}
    delivered = Counter(names[f] for f, _ in whole[:48] + whole[112:256])
    for name in names:
        assert job[name]["skipped"] == skipped[name]
        assert job[name]["samples"] == delivered[name]
        assert job[name]["tokens"] == delivered[name] * S
        assert job[name]["drawn"] == delivered[name] + skipped[name]
    assert later["accounting"]["skipped_samples"] == 64


def test_a_skip_mid_iteration_drops_the_batches_made_ahead(files):
    whole, _ = serve(blend(files), 160, dp=1, mbs=4)
    loader = build_dataloader(blend(files), micro_batch_size=4, dp_rank=0, dp_size=1,
                              num_workers=2, multiprocessing_context="fork", prefetch_factor=4)
    it = iter(loader)
    got = [x for _ in range(3) for x in identify(loader.dataset, next(it))]
    loader.skip(samples=40)
    got += [x for _ in range(5) for x in identify(loader.dataset, next(it))]
    loader.close()
    assert got == whole[:12] + whole[52:72]
    assert loader.metrics()["job"]["skips"] == [{"at": 12, "samples": 40}]


@pytest.mark.parametrize("dp, mbs, workers", [(1, 8, 0), (2, 4, 2), (4, 1, 0), (8, 2, 0)])
def test_the_jobs_figures_equal_a_count_of_the_delivered_samples_anywhere(files, dp, mbs, workers):
    served, state = serve(blend(files), 192, dp=dp, mbs=mbs, workers=workers, skip=32)
    names = blend(files).sources
    counted = Counter(names[f] for f, _ in served)
    job = state["accounting"]
    assert job["consumed_samples"] == 224 and job["skipped_samples"] == 32
    assert {s["source"]: s["samples"] for s in job["sources"]} == {n: counted[n] for n in names}
    reference = json.dumps(serve(blend(files), 192, dp=2, mbs=4, skip=32)[1]["accounting"])
    assert json.dumps(job) == reference  # the same whatever the topology
    windows = {d.identity: d.samples_per_epoch for d in blend(files).datasets}
    for s in job["sources"]:
        assert s["epoch"] == s["drawn"] // windows[s["source"]]
    assert job["schedule"]["entry"] == 3 and job["schedule"]["next_change"] is None


def test_removed_sources_keep_their_figures(files):
    _, state = serve(blend(files, None), 64)
    first = {s["source"]: s for s in state["accounting"]["sources"]}
    _, state2 = serve(blend(files, None, names=["a", "c"]), 64, state)
    job = {s["source"]: s for s in state2["accounting"]["sources"]}
    b = blend(files).sources[1]
    assert job[b]["active"] is False and job[b]["samples"] == first[b]["samples"] > 0
    assert state2["mixture"]["sources"][b]["cursor"] == first[b]["drawn"]
    assert state2["accounting"]["schedule"]["start"] == 64  # the new weights hold from the resume


def test_megatron_order_blends_and_single_files_are_counted_exactly(files):
    cfg = MegatronDataConfig(sequence_length=S, blend=["1", files["a"], "2", files["c"]],
                             split="100,0,0", cache="off")
    dataset = build_datasets(cfg, [400, 0, 0])[0]
    loaders = [build_dataloader(dataset, micro_batch_size=4, dp_rank=r, dp_size=2, num_workers=0)
               for r in range(2)]
    its = [iter(x) for x in loaders]
    ids = [i for _ in range(6) for it in its for i in next(it)["dataset_id"].tolist()]
    for x in loaders:
        x.skip(samples=16)
    ids += [i for _ in range(4) for it in its for i in next(it)["dataset_id"].tolist()]
    job = loaders[1].metrics()["job"]
    assert [s["samples"] for s in job["sources"]] == np.bincount(ids, minlength=2).tolist()
    skipped = np.bincount(dataset.dataset_index[48:64], minlength=2).tolist()
    assert [s["skipped"] for s in job["sources"]] == skipped
    one_file = MegatronDataConfig(sequence_length=S, blend=[files["d"]], split="100,0,0",
                                  cache="off")
    single = build_datasets(one_file, [100, 0, 0])[0]
    loader = build_dataloader(single, micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=0)
    it = iter(loader)
    next(it)
    loader.skip(samples=8)
    next(it)
    (one,) = loader.metrics()["job"]["sources"]
    assert (one["samples"], one["skipped"], one["drawn"]) == (8, 8, 16)


def test_bad_skips_and_skip_records_are_typed_errors(files):
    loader = build_dataloader(blend(files), micro_batch_size=4, dp_rank=0, dp_size=2, num_workers=0)
    for bad in (-8, 6, 8.0, True, len(loader.dataset) + 8):
        with pytest.raises(ConfigError, match="skip"):
            loader.skip(samples=bad)
    assert loader.consumed_samples == 0 and loader.state_dict()["skips"] == []
    state = loader.state_dict()
    for broken in ([{"at": 0}], [{"at": -1, "samples": 8, "sources": {}}], "x"):
        with pytest.raises(StateError, match="skips"):
            loader.load_state_dict(dict(state, skips=broken))
