"""``loader.metrics()``: what was served per source equals what the batches hold, with 0 workers
and with worker processes (fork and spawn); the data wait is measured per step and grows when
the dataset is slow; a blend member that repeats is flagged and warned about once; the counters
survive ``state_dict``/``load_state_dict`` into a new loader; memory stays fixed over 10,000
steps; a summary is logged on rank 0 when asked."""

from __future__ import annotations

import itertools
import json
import logging
import math
import time

import numpy as np
import pytest
import torch

from support import write_documents
from tokenload.datasets import (
    FlatDatasetConfig,
    FlatTokenDataset,
    MegatronDataConfig,
    build_datasets,
)
from tokenload.errors import ConfigError, StateError
from tokenload.format import write_flat
from tokenload.loader import build_dataloader
from tokenload.metrics import DurationHistogram

SEQ = 16
MBS = 4
WORKERS = [(0, None), (2, "fork"), (2, "spawn")]
LOGGER = "tokenload.loader"


def _documents(rng, count):
    lengths = rng.integers(3, 40, size=count)
    return [np.append(rng.integers(0, 999, size=int(n)), 999) for n in lengths]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metrics")
    rng = np.random.default_rng(3)
    big, tiny = _documents(rng, 200), _documents(rng, 5)
    return {
        "a": write_documents(folder / "a", big),
        "b": write_documents(folder / "b", tiny),
        "tokens_b": sum(len(d) for d in tiny),
    }


@pytest.fixture(scope="module")
def single(files):
    config = MegatronDataConfig(
        sequence_length=SEQ, eod_id=999, blend=[files["a"]], split="100,0,0", cache="off"
    )
    return build_datasets(config, [None, 0, 0])[0]


@pytest.fixture(scope="module")
def blend(files):
    """Member b is tiny (5 documents) and weighs 90%: the blend draws it many times over."""
    config = MegatronDataConfig(
        sequence_length=SEQ, eod_id=999, blend=["10", files["a"], "90", files["b"]],
        split="100,0,0", cache="off",
    )
    return build_datasets(config, [2000, 0, 0])[0]


def _served(batches, sources):
    """Samples and tokens per source, counted from the batches themselves."""
    samples, tokens = [0] * sources, [0] * sources
    for batch in batches:
        ids = batch["dataset_id"].tolist() if "dataset_id" in batch else [0] * len(batch["tokens"])
        for row, s in enumerate(ids):
            samples[s] += 1
            tokens[s] += batch["tokens"][row].numel()
    return samples, tokens


@pytest.mark.parametrize("workers,context", WORKERS)
@pytest.mark.parametrize("kind", ["single", "blend"])
def test_counts_equal_what_the_batches_hold(request, kind, workers, context):
    dataset = request.getfixturevalue(kind)
    loader = build_dataloader(
        dataset, micro_batch_size=MBS, num_workers=workers, multiprocessing_context=context
    )
    batches = list(itertools.islice(loader, 30))
    m = loader.metrics()
    loader.close()
    samples, tokens = _served(batches, len(m["sources"]))
    assert [s["samples"] for s in m["sources"]] == samples
    assert [s["tokens"] for s in m["sources"]] == tokens
    assert m["samples"] == 30 * MBS and m["tokens"] == sum(b["tokens"].numel() for b in batches)
    # uint16 token files, S + 1 tokens read per sample
    assert [s["bytes_read"] for s in m["sources"]] == [n * (SEQ + 1) * 2 for n in samples]
    assert m["bytes_read"] == 30 * MBS * (SEQ + 1) * 2
    assert m["steps"] == m["data_wait"]["count"] == 30
    assert m["consumed_samples"] == 30 * MBS and not any(m["storage"].values())  # local files: no GETs
    assert json.loads(json.dumps(m)) == m  # plain data, ready for a log or a JSON file


def test_sources_are_named_and_sized_like_megatron(files, single, blend):
    one = build_dataloader(single, micro_batch_size=MBS, num_workers=0)
    next(iter(one))
    (source,) = one.metrics()["sources"]
    assert source["name"] == files["a"] and source["samples_per_epoch"] == len(single)  # one epoch
    mixed = build_dataloader(blend, micro_batch_size=MBS, num_workers=0)
    a, b = mixed.metrics()["sources"]
    assert (a["name"], b["name"]) == (files["a"], files["b"])
    # Megatron's num_samples_per_epoch: (tokens - the extra token) // sequence length
    assert b["samples_per_epoch"] == (files["tokens_b"] - 1) // SEQ


class Slow:
    """A dataset that sleeps in every read (only ``__getitems__``: no two-stage read)."""

    def __init__(self, dataset, seconds: float, phases: dict | None = None) -> None:
        self.dataset, self.seconds = dataset, seconds
        if phases is not None:
            self.startup_phases = phases

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def fingerprint(self) -> str:
        return self.dataset.fingerprint

    def __getitems__(self, indices):
        time.sleep(self.seconds)
        return self.dataset.__getitems__(indices)


@pytest.mark.parametrize("workers,context", WORKERS[:2])
def test_data_wait_is_measured_per_step_and_grows_with_a_slow_dataset(single, workers, context):
    def run(dataset):
        loader = build_dataloader(dataset, micro_batch_size=MBS, num_workers=workers,
                                  multiprocessing_context=context, prefetch_factor=2)
        for _ in itertools.islice(loader, 20):
            pass
        loader.close()
        return loader.metrics()

    fast, slow = run(Slow(single, 0.0)), run(Slow(single, 0.02))
    for m in (fast, slow):
        wait = m["data_wait"]
        assert wait["count"] == 20
        assert wait["min_s"] <= wait["p50_s"] <= wait["p90_s"] <= wait["p99_s"] <= wait["max_s"]
        assert 0 < wait["share"] <= 1 and m["active_s"] >= wait["total_s"]
    # 20 reads of 20 ms by 0 or 2 workers: at least 400 / 2 ms, less what was made ahead
    assert slow["data_wait"]["total_s"] > 0.15
    # Two workers read in step: every other batch waits a whole read, the next one almost nothing
    # (so the median says little); the fast run's waits are the workers' scheduling latency, up
    # to ~10 ms on a loaded 2-core machine. The long waits are a read less the training loop's own
    # time per step, which a loaded machine stretches (14.4 ms seen in a full CI run): half a read.
    assert slow["data_wait"]["p90_s"] >= 0.010
    assert slow["data_wait"]["total_s"] > fast["data_wait"]["total_s"] + 0.1
    if workers == 0:
        assert slow["data_wait"]["min_s"] >= 0.02  # every step waits for its read
    startup = slow["startup"]
    assert startup["first_batch_s"] >= startup["first_batch_wait_s"] >= 0.02
    assert startup["loader_init_s"] < startup["first_batch_s"]


def test_startup_reports_the_phases_a_dataset_records(single):
    phases = {"header_reads": 0.25, "index_load": 0.5}
    loader = build_dataloader(Slow(single, 0.0, phases), micro_batch_size=MBS, num_workers=0)
    assert loader.metrics()["startup"]["phases"] == phases
    assert loader.metrics()["startup"]["first_batch_s"] is None  # no batch yet
    # build_datasets records its own phases on what it returns: the loader reports them as is
    plain = build_dataloader(single, micro_batch_size=MBS, num_workers=0)
    recorded = plain.metrics()["startup"]["phases"]
    assert recorded == single.startup_phases and recorded and all(v >= 0 for v in recorded.values())
    assert {"header_reads", "index_build"} <= set(recorded) or {"header_reads", "index_load"} <= set(recorded)


def _repeat_warnings(caplog):
    return [
        r for r in caplog.records if r.levelno == logging.WARNING and "repeating" in r.getMessage()
    ]


@pytest.mark.parametrize("workers,context", WORKERS[:2])
def test_a_blend_member_that_repeats_is_flagged_and_warned_once(
    files, blend, caplog, workers, context
):
    loader = build_dataloader(
        blend, micro_batch_size=MBS, num_workers=workers, multiprocessing_context=context
    )
    caplog.set_level(logging.WARNING, logger=LOGGER)
    it = iter(loader)
    next(it)  # about 4 draws of b, fewer than one pass of its data holds
    assert loader.metrics()["repeating"] == [] and not _repeat_warnings(caplog)
    for _ in itertools.islice(it, 60):
        pass
    loader.close()
    m = loader.metrics()
    a, b = m["sources"]
    assert m["repeating"] == [files["b"]]
    assert b["repeating"] and not a["repeating"]
    assert b["epoch"] == b["drawn"] // b["samples_per_epoch"] > 1 and a["epoch"] == 0
    (warning,) = _repeat_warnings(caplog)
    assert files["b"] in warning.getMessage()


def test_a_cyclic_loader_past_its_dataset_repeats(tmp_path, caplog):
    write_flat(tmp_path / "t.bin", np.arange(8 * 16 + 1) % 1000)
    dataset = FlatTokenDataset(tmp_path / "t.bin", FlatDatasetConfig(block_size=16))
    loader = build_dataloader(dataset, micro_batch_size=2, kind="cyclic", num_workers=0)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    list(loader)  # the whole first epoch: every sample once
    assert loader.metrics()["repeating"] == [] and loader.metrics()["epoch"] == 1
    next(iter(loader))
    assert loader.metrics()["sources"][0]["repeating"] and len(_repeat_warnings(caplog)) == 1


@pytest.mark.parametrize("workers,context", [(0, None), (2, "spawn")])
def test_metrics_survive_a_resume_into_a_new_loader(files, blend, caplog, workers, context):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    cfg = dict(micro_batch_size=MBS, num_workers=workers, multiprocessing_context=context)
    first = build_dataloader(blend, **cfg)
    head = list(itertools.islice(first, 40))
    first.close()
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    assert first.metrics()["repeating"] == [files["b"]]
    caplog.clear()
    resumed = build_dataloader(blend, **cfg)
    resumed.load_state_dict(state)
    tail = list(itertools.islice(resumed, 10))
    resumed.close()
    m = resumed.metrics()
    samples, tokens = _served(head + tail, 2)
    assert [s["samples"] for s in m["sources"]] == samples
    assert [s["tokens"] for s in m["sources"]] == tokens
    assert m["steps"] == m["data_wait"]["count"] == 50
    assert m["data_wait"]["total_s"] > first.metrics()["data_wait"]["total_s"]
    assert m["repeating"] == [files["b"]]
    assert not _repeat_warnings(caplog)  # warned once, before the resume


def test_a_state_without_metrics_still_loads(single):
    loader = build_dataloader(single, micro_batch_size=MBS, num_workers=0)
    list(itertools.islice(loader, 3))
    state = loader.state_dict()
    del state["metrics"]  # as tokenload wrote it before metrics existed
    resumed = build_dataloader(single, micro_batch_size=MBS, num_workers=0)
    resumed.load_state_dict(state)
    assert resumed.consumed_samples == 3 * MBS and resumed.metrics()["steps"] == 0


def test_malformed_metrics_in_a_state_are_refused(single):
    state = build_dataloader(single, micro_batch_size=MBS, num_workers=0).state_dict()
    state["metrics"]["samples"] = ["12"]
    with pytest.raises(StateError, match="metrics") as info:
        build_dataloader(single, micro_batch_size=MBS, num_workers=0).load_state_dict(state)
    assert "unchanged" in info.value.hint


def test_metrics_of_another_version_start_from_zero_with_a_warning(single, caplog):
    loader = build_dataloader(single, micro_batch_size=MBS, num_workers=0)
    list(itertools.islice(loader, 3))
    state = loader.state_dict()
    state["metrics"]["version"] = 99
    resumed = build_dataloader(single, micro_batch_size=MBS, num_workers=0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        resumed.load_state_dict(state)
    assert resumed.consumed_samples == 3 * MBS and resumed.metrics()["steps"] == 0
    assert any("version 99" in r.getMessage() for r in caplog.records)


def test_memory_stays_fixed_over_10000_steps(tmp_path):
    write_flat(tmp_path / "t.bin", np.arange(20_000) % 1000)
    dataset = FlatTokenDataset(tmp_path / "t.bin", FlatDatasetConfig(block_size=1))
    loader = build_dataloader(dataset, micro_batch_size=1, num_workers=0)
    it = iter(loader)
    list(itertools.islice(it, 100))
    early = len(json.dumps(loader.state_dict()["metrics"]))
    histogram = loader._metrics.wait  # tracemalloc would show it too, at 15x the test's time
    bins = len(histogram.counts)
    list(itertools.islice(it, 9_900))
    m = loader.metrics()
    assert m["data_wait"]["count"] == m["steps"] == 10_000
    assert loader._metrics.wait is histogram and len(histogram.counts) == bins == 320
    # only the non-zero bins are stored: the state grows by at most a few dozen bins, never per step
    assert len(json.dumps(loader.state_dict()["metrics"])) < early + 2_000


def test_histogram_quantiles_are_within_five_percent():
    rng = np.random.default_rng(0)
    values = rng.lognormal(mean=math.log(2e-4), sigma=1.0, size=20_000)
    h = DurationHistogram()
    for v in values.tolist():
        h.add(v)
    s = h.summary()
    assert s["count"] == values.size and s["max_s"] == values.max() and s["min_s"] == values.min()
    assert s["total_s"] == pytest.approx(values.sum())
    for name, q in (("p50_s", 50), ("p90_s", 90), ("p99_s", 99)):
        exact = np.percentile(values, q)
        assert s[name] == pytest.approx(exact, rel=0.05), name
    restored = DurationHistogram()
    restored.load_state_dict(json.loads(json.dumps(h.state_dict())))
    assert restored.summary() == s


def test_a_summary_is_logged_every_n_steps_on_rank_0(single, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger=LOGGER)
    loader = build_dataloader(single, micro_batch_size=MBS, num_workers=0, log_metrics_every=5)
    list(itertools.islice(loader, 12))
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(lines) == 2 and lines[0].startswith("loader: step 5,") and "data wait" in lines[0]
    caplog.clear()
    loader.log_metrics()
    assert next(r.getMessage() for r in caplog.records).startswith("loader: step 12,")
    caplog.clear()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    other = build_dataloader(
        single, micro_batch_size=MBS, num_workers=0, log_metrics_every=5, dp_rank=1
    )
    list(itertools.islice(other, 12))
    other.log_metrics()
    assert not caplog.records


@pytest.mark.parametrize("every", [0, -1, True, 2.5])
def test_log_metrics_every_must_be_a_positive_count(single, every):
    with pytest.raises(ConfigError, match="log_metrics_every"):
        build_dataloader(single, micro_batch_size=MBS, log_metrics_every=every)


def test_metrics_of_per_sample_datasets_count_rows(tmp_path):
    """A dataset without ``__getitems__`` (torch collates its items) is still counted."""

    class Items:
        def __len__(self):
            return 40

        def __getitem__(self, i):
            return {"tokens": torch.full((8,), i, dtype=torch.int32)}

    loader = build_dataloader(Items(), micro_batch_size=4, num_workers=0)
    list(itertools.islice(loader, 3))
    (source,) = loader.metrics()["sources"]
    assert (source["samples"], source["tokens"], source["bytes_read"]) == (12, 96, 96 * 4)
    assert source["name"] == "Items" and source["samples_per_epoch"] == 40


@pytest.mark.parametrize("given", ["tensor", "bytes"])
@pytest.mark.parametrize("sources", [1, 3])
def test_packing_counts_add_up_every_batch_whenever_they_are_folded(sources, given) -> None:
    """``PackingCounts`` keeps each batch's counts and adds them up in one pass now and then:
    its totals (per source, and rows by documents per row) are those of every batch counted
    one by one, for one source (no ``dataset_id``) and a blend, rows of two widths, batches of
    any size, read before, at and past the batches it keeps; the counts given as a tensor (the
    loader's own process) or as their bytes (from a worker's ring)."""
    from tokenload.loader.accounting import PackingCounts

    rng = np.random.default_rng(sources)
    counted = PackingCounts(sources)
    want = {k: np.zeros(sources, dtype=np.int64) for k in ("rows", "documents", "padding", "slots")}
    by_documents = np.zeros(64, dtype=np.int64)
    for b in range(2 * PackingCounts._FOLD + 7):
        rows = int(rng.integers(0, 9))
        width = int(rng.choice([16, 32]))
        documents = rng.integers(1, 12, rows)
        padding = rng.integers(0, width, rows)
        ids = None if sources == 1 else rng.integers(0, sources, rows)
        counts = torch.from_numpy(np.stack([documents, padding], axis=1).astype(np.int64))
        counted.record(width, ids, counts if given == "tensor" else counts.numpy().tobytes())
        who = np.zeros(rows, dtype=np.int64) if ids is None else ids
        np.add.at(want["rows"], who, 1)
        np.add.at(want["documents"], who, documents)
        np.add.at(want["padding"], who, padding)
        np.add.at(want["slots"], who, width)
        np.add.at(by_documents, documents, 1)
        counts.fill_(-1)  # the slot's memory is reused: the counts were copied
        if b in (3, PackingCounts._FOLD - 1, PackingCounts._FOLD + 5):
            state = counted.state_dict()  # adds up the batches kept so far
            assert state["rows"] == want["rows"].tolist()
    state = counted.state_dict()
    for key, values in want.items():
        assert state[key] == values.tolist(), key
    found = np.array(state["rows_by_documents"])
    assert np.array_equal(found, by_documents[: found.size]) and not by_documents[found.size :].any()
