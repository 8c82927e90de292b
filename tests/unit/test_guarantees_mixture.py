"""Mixture guarantees at the edges the other tests never reach (issue 38, points 3-4; planted
bugs: tests/PLANTED.md). From docs/ORDER.md, "Mixture control":

* Exact accounting: ``loader.metrics()["job"]`` and ``state["accounting"]`` give each source's
  drawn samples "computed from the global order"; they follow ``consumed_samples``, backwards too
  (a rollback to an earlier state, a restart). Model: a count of the ``dataset_id`` of the
  samples a fault-free run delivered up to that point (one rank, so it sees every sample).
* "A schedule is exactly the run stopped at each start and resumed with that entry's weights":
  per sample (its file and window, and the ``dataset_id`` of its row), including a micro-batch
  whose last sample is a phase's first, in both orders.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.loader import build_dataloader, ledger

S = 8
BASE = 1_000_000  # token t of file f is f * BASE + t + 1: a row's first token names its sample
NAMES = ("a", "b", "c")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixture")
    rng = np.random.default_rng(2)
    out = {}
    for f, (name, count) in enumerate(zip(NAMES, (300, 120, 200))):
        lengths = rng.integers(1, 30, size=count)
        stream = f * BASE + 1 + np.arange(int(lengths.sum()))
        out[name] = write_documents(
            folder / name, np.split(stream, np.cumsum(lengths)[:-1]), dtype=np.int32
        )
    return out


def _blend(files, weights, **kw) -> list[str]:
    return [x for name, w in zip(NAMES, weights) for x in (str(w), files[name])]


def _megatron(files, weights, size=400, **kw):
    cfg = MegatronDataConfig(
        sequence_length=S, blend=_blend(files, weights), split="100,0,0", cache="off", **kw
    )
    return build_datasets(cfg, [size, 0, 0])[0]


def _computed(files, weights, **kw):
    cfg = MegatronDataConfig(
        sequence_length=S,
        blend=_blend(files, weights),
        split="100,0,0",
        eod_id=0,
        order="computed",
        **kw,
    )
    return build_datasets(cfg, [4000, 0, 0])[0]


def _file_of(batch) -> np.ndarray:
    return (batch["tokens"][:, 0].numpy() - 1) // BASE


def _member_files(dataset) -> list[int]:
    """The file each ``dataset_id`` names (from the source's prefix)."""
    return [NAMES.index(s.name.rsplit("/", 1)[-1]) for s in dataset.describe_sources().members]


def _loader(dataset, mbs=4):
    return build_dataloader(dataset, micro_batch_size=mbs, dp_rank=0, dp_size=1, num_workers=0)


def _take(it, steps: int) -> list[dict]:
    return [next(it) for _ in range(steps)]


def _drawn(loader, dataset) -> list[int]:
    """The job's drawn samples per member (dataset_id order), from metrics() and the state."""
    keys = [s.key for s in dataset.describe_sources().members]
    job = {s["source"]: s["drawn"] for s in loader.metrics()["job"]["sources"]}
    state = {s["source"]: s["drawn"] for s in loader.state_dict()["accounting"]["sources"]}
    assert job == state
    return [job[k] for k in keys]


# -- point 3: accounting after a rollback ----------------------------------------------------------
@pytest.mark.parametrize("order", ["megatron", "computed"])
def test_accounting_follows_consumed_back(files, order, monkeypatch):
    # a Megatron blend's draws are counted over dataset_index in chunks (4 Mi samples): chunks of
    # 7 here, so that a count after a jump (a resume, a rollback) crosses chunk boundaries
    monkeypatch.setattr(ledger, "_CHUNK", 7)
    weights = (5, 2, 3)
    dataset = _megatron(files, weights) if order == "megatron" else _computed(files, weights)
    n = len(_member_files(dataset))
    # the model: every sample's dataset_id in the fault-free order, counted over a prefix
    ids = np.concatenate([b["dataset_id"].numpy() for b in _take(iter(_loader(dataset)), 30)])

    def count(upto: int) -> list[int]:
        return np.bincount(ids[:upto], minlength=n).tolist()

    loader = _loader(dataset)
    it = iter(loader)
    _take(it, 10)
    early = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint stores it
    assert _drawn(loader, dataset) == count(40)
    _take(it, 12)
    assert _drawn(loader, dataset) == count(88)
    loader.load_state_dict(early)  # roll back to sample 40 in the same loader
    assert loader.consumed_samples == 40
    assert _drawn(loader, dataset) == count(40)
    again = _take(iter(loader), 5)
    assert np.concatenate([b["dataset_id"].numpy() for b in again]).tolist() == ids[40:60].tolist()
    assert _drawn(loader, dataset) == count(60)
    loader.restart(0)  # e.g. a job restarted from scratch in the same process
    assert _drawn(loader, dataset) == count(0)
    _take(iter(loader), 3)
    assert _drawn(loader, dataset) == count(12)
    # a new loader resumed from the early state agrees
    fresh = _loader(dataset)
    fresh.load_state_dict(early)
    assert _drawn(fresh, dataset) == count(40)


# -- point 4: a micro-batch that ends on a phase's first sample ------------------------------------
A, B, START = (5, 1, 2), (1, 4, 3), 48
MBS = 7  # micro-batch 6 is samples 42..48: it ends on the second phase's first sample


def _rows(batches, member_files) -> list[tuple[int, tuple[int, ...]]]:
    """(file of the dataset_id, the row's tokens) of every row; the file the tokens name must be
    the one the row's dataset_id names."""
    out = []
    for batch in batches:
        named = [member_files[d] for d in batch["dataset_id"].tolist()]
        assert named == _file_of(batch).tolist()
        out += list(zip(named, map(tuple, batch["tokens"].numpy().tolist())))
    return out


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_a_batch_ending_on_a_phase_s_first_sample_draws_it_from_the_new_phase(files, order):
    schedule = [(0, list(A)), (START, list(B))]
    total = 9 * MBS  # 63 samples: through the boundary and on into the second phase
    if order == "computed":
        scheduled = _computed(files, (1, 1, 1), weights_schedule=schedule)
        first = _computed(files, A)
        second = _computed(files, B)
    else:
        scheduled = _megatron(files, (1, 1, 1), weights_schedule=schedule)
        first = _megatron(files, A, mixture_change="continue")
        second = _megatron(files, B, mixture_change="continue")
    loader = _loader(scheduled, MBS)
    got = _rows(_take(iter(loader), total // MBS), _member_files(scheduled))
    # the model: the first entry's blend stopped at START, resumed with the second entry's weights
    head_loader = _loader(first, 4)
    head = _rows(_take(iter(head_loader), START // 4), _member_files(first))
    tail_loader = _loader(second, 3)
    tail_loader.load_state_dict(json.loads(json.dumps(head_loader.state_dict())))
    tail = _rows(_take(iter(tail_loader), (total - START) // 3), _member_files(second))
    want = head + tail
    assert len(got) == len(want) == total
    for k, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"global sample {k} (phase {'2' if k >= START else '1'})"


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_the_schedule_position_changes_exactly_at_a_phase_s_start(files, order):
    """``metrics()["job"]["schedule"]``: the entry in force after ``consumed`` samples, i.e. the
    one that serves the next sample; at ``consumed == START`` that is the new entry."""
    schedule = [(0, list(A)), (START, list(B))]
    build = _computed if order == "computed" else _megatron
    loader = _loader(build(files, (1, 1, 1), weights_schedule=schedule), 4)
    it = iter(loader)
    seen = {}
    for _ in range(START // 4 + 1):
        next(it)
        seen[loader.consumed_samples] = loader.metrics()["job"]["schedule"]
    before, at, after = seen[START - 4], seen[START], seen[START + 4]
    assert (before["entry"], before["weights"], before["next_change"]) == (0, list(A), START)
    assert (at["entry"], at["weights"], at["next_change"]) == (1, list(B), None)
    assert (after["entry"], after["start"]) == (1, START)
