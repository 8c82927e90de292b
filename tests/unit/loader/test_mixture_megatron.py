"""Megatron-order mixture changes (issue 26, points 2-4): ``mixture_change="continue"`` continues
each source's own Megatron order at its cursor under a new blending from the resume point; before
the change the order is Megatron's; sources may be removed (cursor kept) and added; a schedule is
the same stream as the phases resumed one by one; the default still refuses."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from test_mixture_resume import S, files  # noqa: F401  (files is a fixture)

from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import StateError
from tokenload.index import build_blending_indices
from tokenload.index.splits import normalize
from tokenload.loader import build_dataloader

# several loaders (some with fork workers) per test: ~10 s alone, minutes on a loaded machine
pytestmark = pytest.mark.timeout(240)

SIZE = 640


def megatron(files, weights: dict[str, float], *, schedule=None, change="continue", **kw):
    blend = [x for name, w in weights.items() for x in (str(w), files[name])]
    cfg = MegatronDataConfig(sequence_length=S, blend=blend, split="100,0,0", cache="off",
                             mixture_change=change, weights_schedule=schedule, **kw)
    return build_datasets(cfg, [SIZE, 0, 0])[0]


def run(dataset, samples, state=None, *, dp=2, mbs=4, workers=0, skip=None):
    """Token rows of the next ``samples`` global samples (all ranks, global order), the global
    indices they are, and rank 0's state after."""
    loaders = [build_dataloader(dataset, micro_batch_size=mbs, dp_rank=r, dp_size=dp,
                                num_workers=workers, multiprocessing_context="fork")
               for r in range(dp)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))
        if skip:
            loader.skip(samples=skip)
    start = loaders[0].consumed_samples
    iters = [iter(x) for x in loaders]
    rows = [row for _ in range(samples // (dp * mbs)) for it in iters
            for row in next(it)["tokens"].numpy().tolist()]
    state = loaders[0].state_dict()
    for x in loaders:
        x.close()
    return rows, list(range(start, start + len(rows))), state


def prepared_sample(dataset, k):
    """(source key, sample of its prepared order) of global sample k."""
    which, within = dataset._locate(np.array([k]))
    return dataset.sources[int(which[0])], int(within[0])


PHASES = [
    ({"a": 3, "b": 1, "c": 1}, 160, None),  # weights A
    ({"a": 1, "c": 3}, 192, 64),  # weights B, b removed, a skip of 64
    ({"a": 1, "b": 2, "c": 1, "d": 2}, 224, None),  # b back, d new
]


def _phases(files, dps=((4, 2), (2, 4), (8, 1))):
    rows, ks, owners, state, members = [], [], [], None, {}
    for (weights, samples, skip), (dp, mbs) in zip(PHASES, dps):
        dataset = megatron(files, weights)
        got, k, state = run(dataset, samples, state, dp=dp, mbs=mbs, skip=skip)
        rows += got
        ks += k
        owners += [prepared_sample(dataset, i) for i in k]
        for key, member in zip(dataset.sources, dataset.datasets):
            members.setdefault(key, member)
    return rows, ks, owners, state, members


def test_each_source_continues_its_own_megatron_order_through_changes(files):
    rows, ks, owners, _state, members = _phases(files)
    assert ks == list(range(160)) + list(range(224, 416)) + list(range(416, 640))
    # phase 1 is Megatron's own order: the plain (refusing) blend's items
    plain = megatron(files, PHASES[0][0], change="refuse")
    assert type(plain).__name__ == "BlendedDataset"
    theirs = plain.__getitems__(list(range(160)))["tokens"]
    np.testing.assert_array_equal(np.array(rows[:160]), theirs)
    # each source serves its prepared order 0, 1, 2, ... (the skip's samples are the only gap)
    skipped = {}
    dataset2 = megatron(files, PHASES[1][0])
    dataset2.resume_mixture(run(megatron(files, PHASES[0][0]), 160)[2]["mixture"])
    for k in range(160, 224):
        key, s = prepared_sample(dataset2, k)
        skipped.setdefault(key, []).append(s)
    for key in members:
        served = [s for owner, s in owners if owner == key] + skipped.get(key, [])
        assert sorted(served) == list(range(len(served))), key
    # the samples are the member's: its prepared order (built with phase 1's num_samples)
    for row, (key, s) in list(zip(rows, owners))[::7]:
        np.testing.assert_array_equal(row, members[key][s]["tokens"])
    # phase 3's shares: Megatron's greedy for its weights, restarted at the resume point
    shares = [owner for owner, _ in owners[160 + 192 :]]
    third = megatron(files, PHASES[2][0])
    di, _ = build_blending_indices(list(third.plans[0].plan.weights), 224)
    assert [third.sources.index(key) for key in shares] == di.tolist()
    weights = np.array(list(PHASES[2][0].values())) / sum(PHASES[2][0].values())
    m = np.arange(1, 225)[:, None]
    error = np.cumsum(di[:, None] == np.arange(4), axis=0) - m * weights
    assert (error < 1).all() and (error > -1.5).all()  # never one ahead, at most ~1.3 behind


def test_a_schedule_is_the_same_stream_as_the_phases_resumed(files):
    rows, _ks, _, _, _ = _phases(files)
    everyone = {"a": 1, "b": 1, "c": 1, "d": 1}  # the schedule replaces these weights
    schedule = [(0, [3, 1, 1, 0]), (160, [1, 0, 3, 0]), (416, [1, 2, 1, 2])]
    dataset = megatron(files, everyone, schedule=schedule, change="refuse")
    got, _, state = run(dataset, 160, dp=4, mbs=2)
    more, _, state = run(megatron(files, everyone, schedule=schedule), 192, state, dp=2, mbs=4,
                         skip=64)
    rest, _, _ = run(megatron(files, everyone, schedule=schedule), 224, state, dp=8, mbs=1)
    assert got + more + rest == rows


def test_resuming_a_changed_run_anywhere_continues_it_bit_exactly(files):
    _, _, state = run(megatron(files, PHASES[0][0]), 160)
    whole, _, _ = run(megatron(files, PHASES[1][0]), 240, state)
    head, _, mid = run(megatron(files, PHASES[1][0]), 80, state, dp=1, mbs=8)
    tail, _, _ = run(megatron(files, PHASES[1][0]), 160, mid, dp=4, mbs=2, workers=2)
    assert head + tail == whole


def test_the_default_refuses_a_change_as_megatron(files):
    schedule = [(0, [1, 1]), (100, [1, 3])]
    _, _, state = run(megatron(files, {"a": 1, "b": 1}, schedule=schedule, change="refuse"), 48)
    other = megatron(files, {"a": 1, "b": 1}, schedule=[(0, [1, 1]), (100, [3, 1])],
                     change="refuse")
    loader = build_dataloader(other, micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=0)
    with pytest.raises(StateError, match="other weights or sources") as err:
        loader.load_state_dict(state)
    assert "mixture_change='continue'" in str(err.value)


def test_a_source_whose_prepared_order_runs_out_starts_it_again(files, caplog):
    _, _, state = run(megatron(files, {"a": 20, "b": 1}), 320)
    dataset = megatron(files, {"a": 1, "b": 20})  # b was prepared for a small share
    with caplog.at_level(logging.WARNING, logger="tokenload.datasets.megatron.continuable"):
        run(dataset, 320, state)
    b = dataset.sources[1]
    length = len(dataset.datasets[1])
    served = [s for k in range(320, 640) for key, s in [prepared_sample(dataset, k)] if key == b]
    first = dataset.source_cursors(320)[1]
    assert served == [(first + j) % length for j in range(len(served))]
    assert first + len(served) > length
    assert "starts it again from its first sample" in caplog.text


def test_batches_in_any_order_locate_what_single_samples_locate(files):
    """The chain keeps the segment of the last batch and checks the members' lengths only where
    a source can run out: batches forwards, backwards and across changes, before and after a
    source's prepared order ran out, locate what the segments' arrays say for each sample
    (computed here from them, one sample at a time)."""
    # a joins at 200 (segments without a member, so greedy numbers are not member numbers);
    # b, prepared for 1/21 of the run, then serves 20/22
    schedule = [(0, [0, 1, 20]), (200, [1, 20, 1]), (330, [1, 0, 20]), (331, [3, 1, 2])]
    dataset = megatron(files, {"a": 1, "b": 1, "c": 1}, schedule=schedule)
    lengths = [len(m) for m in dataset.datasets]
    want, wrapped = [], 0
    for k in range(SIZE):
        seg = [s for s in dataset.segments if s.start <= k][-1]
        d = int(seg.sources[int(seg.di[k - seg.start])])
        within = int(seg.base[d]) + int(seg.dsi[k - seg.start])
        wrapped += within >= lengths[d]
        want.append((d, within % lengths[d]))
    assert wrapped > 20  # b's prepared order runs out in the second entry
    assert not dataset.segments[0].every and dataset.segments[-1].every
    rng = np.random.default_rng(4)
    for _ in range(400):
        first = int(rng.integers(0, SIZE - 1))
        k = np.arange(first, min(first + int(rng.choice([1, 4, 16, 64])), SIZE))
        if rng.random() < 0.3:
            k = rng.permutation(k)
        bounds = (int(k.min()), int(k.max())) if rng.random() < 0.5 else None
        which, within = dataset._locate(k, bounds)
        assert list(zip(which.tolist(), within.tolist())) == [want[i] for i in k.tolist()]


def per_split(files, train: dict, valid: dict, *, schedule=None, change="continue"):
    """The train and valid splits of a ``blend_per_split`` configuration (640 / 160 samples)."""

    def blend(weights):
        return [x for name, w in weights.items() for x in (str(w), files[name])]

    cfg = MegatronDataConfig(sequence_length=S, blend_per_split=[blend(train), blend(valid), None],
                             cache="off", mixture_change=change, weights_schedule=schedule)
    return build_datasets(cfg, [SIZE, 160, 0])[:2]


def test_per_split_blends_continue_each_source_at_its_cursor(files):
    """``mixture_change="continue"`` with ``blend_per_split``: each split's blend continues its
    own sources from their cursors (a source added starts at 0), Megatron's order before the
    change, Megatron's greedy for the new weights after it; the default still refuses."""
    before = per_split(files, {"a": 3, "b": 1}, {"c": 1, "d": 1})
    after = per_split(files, {"a": 1, "b": 3, "d": 1}, {"c": 3, "d": 1})
    plain = per_split(files, {"a": 3, "b": 1}, {"c": 1, "d": 1}, change="refuse")
    for k, (first, second, theirs, n) in enumerate(zip(before, after, plain, (160, 40))):
        assert type(theirs).__name__ == "BlendedDataset"
        rows, ks, state = run(first, n, dp=2, mbs=4)
        np.testing.assert_array_equal(np.array(rows), theirs.__getitems__(ks)["tokens"])
        more, later, _ = run(second, n, state, dp=4, mbs=2)
        assert later == list(range(n, 2 * n))
        owners = [prepared_sample(first, i) for i in ks] + [prepared_sample(second, i) for i in later]
        for key in set(second.sources) | set(first.sources):
            served = [s for owner, s in owners if owner == key]
            assert served == list(range(len(served))), (k, key)  # none repeated, none skipped
        members = dict(zip(second.sources, second.datasets))
        for row, (key, s) in list(zip(rows + more, owners))[::5]:
            np.testing.assert_array_equal(row, members[key][s]["tokens"])
        # after the change: Megatron's greedy for the new weights, restarted at the resume point
        di, _ = build_blending_indices(list(second.plans[0].plan.weights), n)
        assert [second.sources.index(key) for key, _ in owners[n:]] == di.tolist()
    # the default: a change is refused, as Megatron (a plain blend, or one with a schedule)
    _, _, state = run(plain[0], 32)
    refusing = per_split(files, {"a": 1, "b": 3, "d": 1}, {"c": 3, "d": 1}, change="refuse")[0]
    loader = build_dataloader(refusing, micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=0)
    with pytest.raises(StateError):
        loader.load_state_dict(state)
    scheduled = per_split(files, {"a": 1, "b": 1}, {"c": 1}, schedule=[(0, [3, 1]), (100, [1, 1])],
                          change="refuse")[0]
    _, _, state = run(scheduled, 48)
    other = per_split(files, {"a": 1, "b": 1}, {"c": 1}, schedule=[(0, [3, 1]), (100, [1, 3])],
                      change="refuse")[0]
    loader = build_dataloader(other, micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=0)
    with pytest.raises(StateError, match="other weights or sources") as err:
        loader.load_state_dict(state)
    assert "mixture_change='continue'" in str(err.value)


def test_a_per_split_schedule_is_the_same_stream_as_the_phases_resumed(files):
    """A Megatron-order ``weights_schedule`` of a ``blend_per_split`` train blend (its entries
    weigh the train split's sources) is the stream of the run resumed at each entry's start."""
    schedule = [(0, [3, 1, 0]), (160, [1, 3, 1])]
    train = {"a": 1, "b": 1, "d": 1}  # the schedule replaces these weights
    whole, _, _ = run(per_split(files, train, {"c": 1}, schedule=schedule)[0], 320, dp=2, mbs=4)
    first, _, state = run(per_split(files, {"a": 3, "b": 1}, {"c": 1})[0], 160, dp=4, mbs=2)
    rest, _, _ = run(per_split(files, {"a": 1, "b": 3, "d": 1}, {"c": 1})[0], 160, state, dp=2,
                     mbs=8)
    assert whole == first + rest


def test_the_greedy_never_serves_a_source_ahead_of_its_weight():
    """What the chain's fast path rests on (``_Segment.room``): before sample j, Megatron's
    greedy has served source d at most ``w_d * max(j, 1)`` samples (it picks the largest error,
    and the errors sum to at least 0), so a sample far enough before a source's prepared end
    needs no length check."""
    rng = np.random.default_rng(12)
    for _ in range(20):
        w = rng.random(int(rng.integers(2, 13))) ** 3 + 1e-3
        w = w / w.sum()
        w = w / w.sum()  # as Megatron's builder normalizes, twice
        di, dsi = build_blending_indices(list(w), 20_000)
        j = np.arange(di.size)
        assert (np.asarray(dsi) <= w[np.asarray(di)] * np.maximum(j, 1) + 1e-6).all()


def test_a_schedule_builds_its_segments_as_reading_reaches_them(files):
    """A run from sample 0 builds only the segment it starts in (Megatron's own arrays), and each
    later one when a sample first needs it: the same samples, in any reading order, as a chain
    whose segments were all built up front."""
    schedule = [(0, [5, 3, 2]), (160, [1, 1, 8]), (320, [2, 7, 1]), (480, [0, 1, 1])]
    lazy = megatron(files, {"a": 1, "b": 1, "c": 1}, schedule=schedule)
    assert len(lazy._built) == 0 and len(lazy._planned) == 4  # nothing read while building
    prepared_sample(lazy, 0)
    assert len(lazy._built) == 1
    assert lazy._built[0].di is lazy.megatron.dataset_index  # no greedy built for it
    eager = megatron(files, {"a": 1, "b": 1, "c": 1}, schedule=schedule)
    assert len(eager.segments) == 4 and len(eager._built) == 4
    assert [prepared_sample(lazy, k) for k in (10, 200)] == [
        prepared_sample(eager, k) for k in (10, 200)
    ]
    assert len(lazy._built) == 2  # reading sample 200 built the segment from 160 only
    rng = np.random.default_rng(9)
    for _ in range(60):
        k = np.sort(rng.integers(0, SIZE, size=int(rng.integers(1, 20))))
        assert [a.tolist() for a in lazy._locate(k)] == [b.tolist() for b in eager._locate(k)]
    assert len(lazy._built) == 4
    assert lazy.source_cursors(SIZE).tolist() == eager.source_cursors(SIZE).tolist()


def _scheduled(files, schedule, **kw):
    blend = [x for name in ("a", "b", "c") for x in ("1", files[name])]
    cfg = MegatronDataConfig(sequence_length=S, blend=blend, split="100,0,0",
                             weights_schedule=schedule, **kw)
    return build_datasets(cfg, [SIZE, 0, 0])[0]


SCHEDULE = [(0, [5, 3, 2]), (160, [1, 1, 8]), (320, [2, 7, 1]), (480, [0, 1, 1])]


def test_in_memory_megatron_arrays_hold_the_first_segment_only(files):
    """Built in memory, Megatron's arrays of the first entry cover only its segment (the greedy
    is prefix-stable: they are the first samples of the whole blend's arrays)."""
    scheduled = _scheduled(files, SCHEDULE, cache="off")
    plain = megatron(files, {"a": 5, "b": 3, "c": 2}, change="refuse")
    assert scheduled.megatron.dataset_index.shape == (160,)
    assert plain.dataset_index.shape == (SIZE,)
    for name in ("dataset_index", "dataset_sample_index"):
        np.testing.assert_array_equal(getattr(scheduled.megatron, name),
                                      getattr(plain, name)[:160])
    w = [0.2, 0.5, 0.3]
    for n in (1, 7, 160, 1000):
        head = [a[:n] for a in build_blending_indices(w, 1000)]
        np.testing.assert_array_equal(head, build_blending_indices(w, n))


def test_a_changed_resume_in_the_first_entry_reads_megatron_arrays(files):
    """A resume with other weights (no schedule) restarts the greedy at the resume point: the
    first samples of Megatron's arrays for the new weights, which the build made anyway."""
    _, _, state = run(megatron(files, PHASES[0][0]), 160)
    resumed = megatron(files, {"a": 1, "c": 3})
    resumed.resume_mixture(state["mixture"])
    segment = resumed._segment_at(0)
    assert segment.start == 160 and segment.di is resumed.megatron.dataset_index
    di, dsi = build_blending_indices(list(resumed.plans[0].plan.weights), SIZE - 160)
    k = np.arange(160, SIZE)
    which, within = resumed._locate(k)
    assert np.asarray(resumed.sources)[which].tolist() == np.asarray(resumed.sources)[
        resumed.plans[0].active][di].tolist()
    np.testing.assert_array_equal(within - segment.base[which], dsi)


def test_a_schedule_caches_every_entrys_blending_as_one_cache(files, tmp_path):
    """With ``path_to_cache`` the blend's cache holds every entry's blending arrays one after
    another (tokenload's description; the first entry's are Megatron's), loaded by the next run
    instead of built: the same stream as in memory, from sample 0 and from a resume; a damaged
    one is rebuilt, a missing one is a ``CacheError`` where the policy builds nothing."""
    from tokenload.errors import CacheError

    folder = tmp_path / "cache"
    memory = _scheduled(files, SCHEDULE, cache="off")
    first = _scheduled(files, SCHEDULE, path_to_cache=str(folder))
    texts = sorted(p.read_text() for p in folder.glob("*-BlendedDataset-train-description.txt"))
    ours = [json.loads(t) for t in texts if '"tokenload"' in t]
    assert [(d["sizes"], [len(w) for w in d["weights"]]) for d in ours] == [
        ([160, 160, 160, 160], [3, 3, 3, 2])]  # every entry's arrays, one after another
    assert len(texts) == 1  # the blend's only cache: as many to check as a fixed blend's
    plain = megatron(files, {"a": 5, "b": 3, "c": 2}, change="refuse")
    for name in ("dataset_index", "dataset_sample_index"):  # the first entry's: Megatron's
        np.testing.assert_array_equal(getattr(first.megatron, name)[:160],
                                      getattr(plain, name)[:160])
    again = _scheduled(files, SCHEDULE, path_to_cache=str(folder), build_policy="none")
    assert again.entry_spans == {1: (160, 160), 2: (320, 160), 3: (480, 160)}
    assert again.entry_arrays is again.megatron.indices and again.entry_arrays.paths is not None
    k = np.arange(SIZE)
    expected = [a.tolist() for a in memory._locate(k)]
    assert [a.tolist() for a in again._locate(k)] == expected
    assert [a.tolist() for a in first._locate(k)] == expected
    # a resume at entry 2 maps the cached arrays and builds no greedy
    _rows, _, state = run(_scheduled(files, SCHEDULE, cache="off"), 352)
    tail, _, _ = run(_scheduled(files, SCHEDULE, cache="off"), 96, state)
    cached_tail, _, _ = run(_scheduled(files, SCHEDULE, path_to_cache=str(folder)), 96, state)
    assert cached_tail == tail
    # damaged: a rebuilt cache, the same samples
    target = next(folder.glob("*-BlendedDataset-train-dataset_sample_index.npy"))
    data = bytearray(target.read_bytes())
    data[-8:] = b"\xff" * 8
    target.write_bytes(bytes(data))
    rebuilt = _scheduled(files, SCHEDULE, path_to_cache=str(folder))
    assert [a.tolist() for a in rebuilt._locate(k)] == expected
    # missing, under a policy that builds nothing: a typed error naming what to do
    ours = [p.name[:32] for p in folder.glob("*-description.txt") if '"tokenload"' in
            p.read_text()]
    assert len(ours) == 1
    for p in folder.glob(f"{ours[0]}-*"):
        p.unlink()
    with pytest.raises(CacheError, match="prepare-cache"):
        _scheduled(files, SCHEDULE, path_to_cache=str(folder), build_policy="none")


def test_a_segments_cursors_from_its_last_samples_equal_a_full_count():
    """A segment's cursors come from the last few samples (each source's last ``dsi + 1``):
    equal to counting the whole prefix, for any weights (tiny ones too) and any point."""
    from tokenload.datasets.megatron.continuable import _Segment

    rng = np.random.default_rng(21)
    for _ in range(40):
        d = int(rng.integers(1, 9))
        w = rng.random(d) ** 4 + (1e-4 if rng.random() < 0.3 else 1e-2)
        w = np.array(normalize(normalize(list(w))))
        n = int(rng.integers(1, 30_000))
        di, dsi = build_blending_indices(list(w), n)
        members = d + 2
        sources = np.sort(rng.choice(members, size=d, replace=False))
        base = rng.integers(0, 1000, size=members)
        segment = _Segment(500, 500 + n, sources, di, dsi, base, w)
        short = _Segment(500, 500 + n, sources, di, dsi, base, w)
        short._tail = 2  # a window some source is not seen in: the full count's path
        for upto in [0, 1, 2, n // 3, n - 1, n, *rng.integers(0, n + 1, size=5).tolist()]:
            counted = np.bincount(sources[np.asarray(di[:upto], dtype=np.int64)], minlength=members)
            assert segment.cursors(500 + upto).tolist() == (base + counted).tolist(), (w, upto)
            assert short.cursors(500 + upto).tolist() == (base + counted).tolist(), (w, upto)
