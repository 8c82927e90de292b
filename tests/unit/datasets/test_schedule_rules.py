"""The rules of a weights schedule in both orders (issue 34, points 2-4), each checked against an
independent model: the samples a split delivers, counted per source over each entry's range of
global samples, must follow that entry's weights (a source of weight 0 never drawn).

* the schedule is applied with ``blend`` and with ``blend_per_split``, however many sources the
  first entry has (a ``blend_per_split`` train blend whose first entry had one source was built
  as that source's plain dataset, and served it through every later entry);
* a source of weight 0 in every entry is never drawn (Megatron's order raised StopIteration);
* an entry at or after the split's end is a ConfigError when the datasets are built (Megatron's
  order raised AssertionError at the first read, the computed order OverflowError past 2^63).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import ConfigError

S = 8
FILE_BASE = 1_000_000
"""Token t of file f is ``f * FILE_BASE + t + 1``: a sample's first token names its file."""
NAMES = ("a", "b", "c")
SIZE = 160
ORDERS = ("megatron", "computed")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Token files a, b, c (the train sources, 250-500 samples of 8 tokens each) and v (the
    valid split of a ``blend_per_split``)."""
    tmp = tmp_path_factory.mktemp("schedule_rules")
    rng = np.random.default_rng(7)
    out = {}
    for f, (name, count) in enumerate((("a", 300), ("b", 200), ("c", 250), ("v", 50))):
        lengths = rng.integers(1, 30, size=count)
        stream = f * FILE_BASE + 1 + np.arange(int(lengths.sum()))
        out[name] = write_documents(tmp / name, np.split(stream, np.cumsum(lengths)[:-1]),
                                    dtype=np.int32)
    return out


def train_split(files, order, schedule, *, per_split=False, names=NAMES, change="refuse",
                size=SIZE, **kw):
    """The train split of a blend of ``names`` (weights 1 each: the schedule replaces them)."""
    paths = [x for name in names for x in ("1", files[name])]
    if per_split:
        kw.update(blend_per_split=[paths, [files["v"]], None])
    else:
        kw.update(blend=paths, split="100,0,0")
    if order == "megatron":
        kw.update(cache=kw.get("cache", "off"), mixture_change=change)
    cfg = MegatronDataConfig(sequence_length=S, order=order, eod_id=0, weights_schedule=schedule,
                             **kw)
    return build_datasets(cfg, [size, 16 if per_split else 0, 0])[0]


def delivered(dataset, names=NAMES, start=0) -> np.ndarray:
    """The source of every sample the split delivers from ``start`` on, as the index of its name
    in ``names``: read from the sample's tokens (its file), and equal to its ``dataset_id``
    where it has one."""
    items = dataset.__getitems__(np.arange(start, len(dataset)))
    index = {("a", "b", "c", "v").index(name): i for i, name in enumerate(names)}
    source = np.array([index[f] for f in (items["tokens"][:, 0] // FILE_BASE).tolist()])
    if "dataset_id" in items:
        np.testing.assert_array_equal(items["dataset_id"], source)
    return source


def through_loader(dataset, samples: int, dp: int = 2, mbs: int = 4) -> np.ndarray:
    """The ``dataset_id`` of the first ``samples`` global samples as the loader delivers them to
    ``dp`` data-parallel ranks (every rank's micro-batches put back in global order)."""
    from tokenload.loader import build_dataloader

    loaders = [build_dataloader(dataset, micro_batch_size=mbs, dp_rank=r, dp_size=dp,
                                num_workers=0) for r in range(dp)]
    iters = [iter(x) for x in loaders]
    ids = [next(it)["dataset_id"].numpy() for _ in range(samples // (dp * mbs)) for it in iters]
    for x in loaders:
        x.close()
    return np.concatenate(ids)


def check_counts(source: np.ndarray, schedule, num_sources: int) -> None:
    """The independent model: over each entry's range ``[start, end)`` of m samples, a source of
    weight w (weights normalized over the entry) is drawn ``m * w`` times within 2 (Megatron's
    greedy and the computed order's interleave both stay within about one sample), and a source
    of weight 0 never."""
    starts = [s for s, _ in schedule]
    ends = [*starts[1:], len(source)]
    for (start, weights), end in zip(schedule, ends):
        m = end - start
        counts = np.bincount(source[start:end], minlength=num_sources)
        w = np.asarray(weights, dtype=np.float64) / sum(weights)
        where = f"entry at {start} (weights {list(weights)}): counts {counts.tolist()} of {m}"
        assert counts.sum() == m, where
        assert (counts[w == 0] == 0).all(), where
        assert (np.abs(counts - m * w) < 2).all(), where


# -- point 2: every combination of blend / blend_per_split x sources active in the first entry ---
FIRST_ENTRIES = {1: [1, 0, 0], 2: [3, 0, 1], 3: [1, 2, 1]}


@pytest.mark.parametrize("active", sorted(FIRST_ENTRIES))
@pytest.mark.parametrize("per_split", [False, True], ids=["blend", "blend_per_split"])
@pytest.mark.parametrize(  # mixture_change is the Megatron order's (the computed one continues)
    ("order", "change"), [("megatron", "refuse"), ("megatron", "continue"), ("computed", None)]
)
def test_the_schedule_is_applied_in_every_combination(files, order, per_split, active, change):
    schedule = [(0, FIRST_ENTRIES[active]), (64, [0, 1, 0]), (112, [1, 1, 2])]
    dataset = train_split(files, order, schedule, per_split=per_split, change=change)
    assert len(dataset) >= SIZE
    check_counts(delivered(dataset)[:SIZE], schedule, len(NAMES))


@pytest.mark.parametrize("order", ORDERS)
def test_issue_34_case_two_sources_one_then_the_other(files, order):
    """The case of the report: ``[(0, [1, 0]), (64, [0, 1])]``, ``mixture_change="continue"``,
    ``blend_per_split``: samples 64 on come from the second source."""
    schedule = [(0, [1, 0]), (64, [0, 1])]
    extra = {"change": "continue"} if order == "megatron" else {}
    dataset = train_split(files, order, schedule, per_split=True, names=("a", "b"), **extra)
    source = delivered(dataset, ("a", "b"))
    assert (source[:64] == 0).all() and (source[64:SIZE] == 1).all()
    np.testing.assert_array_equal(through_loader(dataset, SIZE), source[:SIZE])


def test_a_one_source_per_split_blend_with_a_schedule(files):
    """A ``blend_per_split`` train blend of one source: Megatron's order serves it (the schedule
    can only ever name it), the computed order refuses a schedule of one source as it always
    has (a ConfigError): applied or refused, never ignored."""
    schedule = [(0, [1]), (64, [2])]
    dataset = train_split(files, "megatron", schedule, per_split=True, names=("a",))
    assert (delivered(dataset, ("a",))[:SIZE] == 0).all()
    with pytest.raises(ConfigError, match="weights_schedule"):
        train_split(files, "computed", schedule, per_split=True, names=("a",))


# -- point 3: a source of weight 0 in every entry ----------------------------------------------
@pytest.mark.parametrize("per_split", [False, True], ids=["blend", "blend_per_split"])
@pytest.mark.parametrize("order", ORDERS)
def test_a_source_inactive_throughout_is_never_drawn(files, order, per_split):
    schedule = [(0, [1, 0, 0]), (64, [1, 2, 0])]
    dataset = train_split(files, order, schedule, per_split=per_split)
    source = delivered(dataset)
    assert not (source == 2).any()
    check_counts(source[:SIZE], schedule, len(NAMES))
    np.testing.assert_array_equal(through_loader(dataset, SIZE), source[:SIZE])
    cursors = dataset.source_cursors(len(dataset))
    assert cursors[2] == 0 and cursors.sum() == len(dataset)


def test_an_inactive_source_joins_at_a_resume_with_its_own_preparation(files):
    """Megatron's order: the state of a run whose source c was inactive throughout records it
    prepared for 0 samples (never prepared); a resume into a schedule that draws c prepares c as
    that schedule plans it, and c serves its prepared order from its first sample."""
    first = train_split(files, "megatron", [(0, [1, 0, 0]), (64, [1, 2, 0])], change="continue")
    state = first.mixture_state(96)
    assert state["sources"][first.sources[2]] == {"cursor": 0, "num_samples": 0}
    schedule = [(0, [1, 0, 0]), (64, [1, 2, 0]), (96, [1, 1, 1])]
    second = train_split(files, "megatron", schedule, change="continue")
    planned = second.prepared[2]
    assert second.resume_mixture(state) == "weights"
    assert second.prepared[2] == planned > 0
    which, within = second._locate(np.arange(96, len(second)))
    assert within[which == 2].tolist() == list(range(int((which == 2).sum())))
    check_counts(delivered(second, start=96), [(0, [1, 1, 1])], len(NAMES))


# -- point 4: an entry at or after the split's end -----------------------------------------------
@pytest.mark.parametrize("start", [SIZE, 500, 2**63])
@pytest.mark.parametrize("per_split", [False, True], ids=["blend", "blend_per_split"])
@pytest.mark.parametrize("order", ORDERS)
def test_an_entry_past_the_end_is_refused_when_the_datasets_are_built(files, order, per_split,
                                                                       start, tmp_path):
    cached = {}
    if order == "megatron":
        cached = {"path_to_cache": str(tmp_path / "cache"), "cache": "auto"}
    with pytest.raises(ConfigError) as err:  # 160 samples in both orders (80 + 80)
        train_split(files, order, [(0, [1, 1]), (start, [0, 1])], per_split=per_split,
                    names=("a", "b"), **cached)
    text = str(err.value)
    assert "weights_schedule" in text and f"entry at sample {start}" in text
    assert f"holds {SIZE} samples" in text  # the split's length
    assert err.value.field == "weights_schedule"
    if cached:  # refused before any cache was written
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_an_entry_just_before_the_end_is_served(files):
    for order in ORDERS:
        schedule = [(0, [1, 0, 0]), (SIZE - 1, [0, 0, 1])]
        source = delivered(train_split(files, order, schedule))
        assert (source[: SIZE - 1] == 0).all() and source[SIZE - 1] == 2


# -- the property: random schedules, both orders, both blend forms -------------------------------
@st.composite
def schedules(draw):
    """1-4 entries over 2-3 sources, starts below SIZE, integer weights 0-4 (a positive sum per
    entry; a source may be inactive in some or every entry)."""
    n = draw(st.integers(2, 3))
    k = draw(st.integers(1, 4))
    starts = [0, *sorted(draw(st.sets(st.integers(1, SIZE - 1), min_size=k - 1, max_size=k - 1)))]
    entries = []
    for start in starts:
        weights = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n).filter(any))
        entries.append((start, weights))
    return entries


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=schedules(), order=st.sampled_from(ORDERS), per_split=st.booleans(),
       change=st.sampled_from(["refuse", "continue"]))
def test_random_schedules_deliver_their_weights(files, schedule, order, per_split, change):
    names = NAMES[: len(schedule[0][1])]
    dataset = train_split(files, order, schedule, per_split=per_split, names=names, change=change)
    assert len(dataset) >= SIZE
    check_counts(delivered(dataset, names)[:SIZE], schedule, len(names))
