"""``loader.set_weights`` (issue 35, point 1): a change of the blend's weights from the first
sample the training loop has not received is the stream of a ``weights_schedule`` that declares
the same changes up front, on both orders, with worker processes (fork and spawn) that remake
what they made ahead; the state records it, so a resume on another topology continues exactly;
bad weights are refused before anything changes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import test_mixture_resume

from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import ConfigError
from tokenload.loader import build_dataloader

S = test_mixture_resume.S
files = test_mixture_resume.files  # the fixture: files a, b, c, d whose tokens name them

# several loaders with worker processes per test: seconds alone, minutes on a loaded machine
pytestmark = pytest.mark.timeout(300)

SIZE = 640
NAMES = ["a", "b", "c", "d"]
FIRST = [3, 1, 0, 0]  # c and d join at the first change (Megatron order: prepared by it)
CHANGES = {5: [1, 2, 1, 2], 9: [0, 1, 3, 0]}  # step (of 2 ranks x micro-batch 4) -> weights
GROUP = 8


def dataset(files, order, schedule=((0, FIRST),), change="continue"):
    """A factory of the blend (each rank builds its own)."""
    return lambda: _dataset(files, order, schedule, change)


def _dataset(files, order, schedule, change, weights=(1, 1, 1, 1)):
    """The blend of ``weights``, with ``schedule`` (None: no weights_schedule)."""
    blend = [x for w, name in zip(weights, NAMES) for x in (str(w), files[name])]
    cfg = MegatronDataConfig(
        sequence_length=S,
        blend=blend,
        split="100,0,0",
        cache="off",
        eod_id=0,
        order=order,
        weights_schedule=None if schedule is None else [list(e) for e in schedule],
        # the Megatron order's choice (the computed order always continues)
        **({"mixture_change": change} if order == "megatron" else {}),
    )
    return build_datasets(cfg, [SIZE, 0, 0])[0]


def declared(changes=CHANGES, group=GROUP):
    """The schedule that declares ``changes`` (at steps of ``group`` samples) up front."""
    return [(0, FIRST), *((step * group, w) for step, w in sorted(changes.items()))]


def serve(
    make, steps, *, dp=2, mbs=4, workers=0, context="fork", changes=None, state=None, save_at=None
):
    """Token rows and ``dataset_id`` of ``steps`` steps of ``dp`` ranks (global order; each rank
    its own dataset, ``make()``), calling ``set_weights`` on every rank before the steps in
    ``changes`` (weights, or a list of weights: several calls); the state after ``save_at``
    steps (rank 0's) when asked."""
    loaders = [
        build_dataloader(
            make(),
            micro_batch_size=mbs,
            dp_rank=r,
            dp_size=dp,
            num_workers=workers,
            multiprocessing_context=context,
        )
        for r in range(dp)
    ]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint stores it
    iters = [iter(loader) for loader in loaders]
    rows, ids, saved = [], [], None
    try:
        for step in range(steps):
            if save_at == step:
                saved = loaders[0].state_dict()
            calls = (changes or {}).get(step, [])
            for weights in calls if calls and isinstance(calls[0], list) else [calls] * bool(calls):
                for loader in loaders:
                    loader.set_weights(weights)
            for it in iters:
                batch = next(it)
                rows += batch["tokens"].numpy().tolist()
                ids += batch["dataset_id"].tolist()
        if save_at == steps:
            saved = loaders[0].state_dict()
    finally:
        for loader in loaders:
            loader.close()
    return rows, ids, saved


@pytest.mark.parametrize("order", ["computed", "megatron"])
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_set_weights_is_the_declared_schedule_with_two_workers(files, order, context):
    expected, ids, _ = serve(dataset(files, order, declared()), 14)
    got, got_ids, state = serve(
        dataset(files, order), 14, workers=2, context=context, changes=CHANGES, save_at=14
    )
    assert got == expected
    assert got_ids == ids
    assert set(ids[5 * GROUP : 9 * GROUP]) == {0, 1, 2, 3}  # the first change took effect
    assert 3 not in ids[9 * GROUP :] and 0 not in ids[9 * GROUP :]  # the second one too
    assert state["weights_changes"] == [[5 * GROUP, [1.0, 2, 1, 2]], [9 * GROUP, [0.0, 1, 3, 0]]]


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_a_resume_on_another_topology_continues_the_changed_stream(files, order):
    whole, _, _ = serve(dataset(files, order, declared()), 20)
    # changed at steps 5 and 9, saved at step 12 (96 samples), resumed on 4 ranks of 2 and 3
    # workers (a state saved between the changes, at step 7, too)
    for at in (7, 12):
        head, _, state = serve(dataset(files, order), at, workers=2, changes=CHANGES, save_at=at)
        if at == 7:
            assert state["weights_changes"] == [[5 * GROUP, [1.0, 2, 1, 2]]]
            tail_changes = {(9 * GROUP - at * GROUP) // GROUP: CHANGES[9]}
        else:
            tail_changes = None
        steps = (20 - at) * GROUP // 8
        tail, _, _ = serve(
            dataset(files, order), steps, dp=4, mbs=2, workers=3, state=state, changes=tail_changes
        )
        assert head + tail == whole, at


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_set_weights_twice_at_one_point_and_with_no_workers(files, order):
    expected, _, _ = serve(dataset(files, order, declared({5: [1, 2, 1, 2]})), 10)
    # the second call at the same point replaces the first
    got, _, _ = serve(dataset(files, order), 10, changes={5: [[0, 1, 0, 1], [1, 2, 1, 2]]})
    assert got == expected


def _plain(files, order, weights=(3, 1, 1, 1)):
    """A factory of a weighted blend with no weights_schedule (its weights in ``blend``)."""
    return lambda: _dataset(files, order, None, "continue", weights)


@pytest.mark.parametrize("order", ["computed", "megatron"])
@pytest.mark.parametrize("weights", [[1, 2, 1, 2], [0, 1, 3, 0], [3, 1, 0, 0]])
def test_set_weights_before_the_first_batch_is_the_declared_schedule(files, order, weights):
    """A change at sample 0 replaces the first entry (the Megatron order then builds its arrays:
    those it was built with are the replaced weights'), with a weights_schedule or the blend's
    own weights; a resume of that run on another topology continues it."""
    for make in (dataset(files, order), _plain(files, order)):
        expected, ids, _ = serve(dataset(files, order, [(0, weights)]), 12)
        got, got_ids, state = serve(make, 6, changes={0: weights}, save_at=6)
        assert got_ids == ids[: 6 * GROUP], order
        assert got == expected[: 6 * GROUP]
        assert {i for i, w in enumerate(weights) if w} == set(ids)
        tail, _, _ = serve(make, 6 * GROUP // 6, dp=3, mbs=2, state=state)
        assert got + tail == expected


def test_bad_weights_are_refused_before_anything_changes(files):
    for order in ("computed", "megatron"):
        plain, _, _ = serve(dataset(files, order), 8)
        loader = build_dataloader(
            dataset(files, order)(), micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=0
        )
        it = iter(loader)
        rows = [next(it)["tokens"].numpy().tolist() for _ in range(2)]
        for bad, match in (
            ([1, 2, 3], "3 weights; the blend has 4"),
            ([1, -1, 1, 1], ">= 0"),
            ([1, math.nan, 1, 1], "finite"),
            ([1, math.inf, 1, 1], "finite"),
            ([0, 0, 0, 0], "not all 0"),
            ("abcd", "numbers"),
        ):
            with pytest.raises(ConfigError, match=match):
                loader.set_weights(bad)
        rows += [next(it)["tokens"].numpy().tolist() for _ in range(14)]
        assert [r for batch in rows for r in batch] == plain, order
        assert loader.state_dict()["weights_changes"] == []
        loader.close()


def test_datasets_whose_weights_cannot_change_say_what_to_build(files):
    refused = dataset(files, "megatron", change="refuse")()
    with pytest.raises(ConfigError, match="mixture_change"):
        build_dataloader(
            refused, micro_batch_size=2, dp_size=1, dp_rank=0, num_workers=0
        ).set_weights([1, 1, 1, 1])
    cfg = MegatronDataConfig(
        sequence_length=S,
        blend=["1", files["a"], "1", files["b"]],
        split="100,0,0",
        cache="off",
        eod_id=0,
    )
    megatron = build_datasets(cfg, [SIZE, 0, 0])[0]  # Megatron's own blend
    with pytest.raises(ConfigError, match="mixture_change='continue'"):
        build_dataloader(
            megatron, micro_batch_size=2, dp_size=1, dp_rank=0, num_workers=0
        ).set_weights([1, 1])
    one = build_datasets(
        MegatronDataConfig(
            sequence_length=S, blend=[files["a"]], split="100,0,0", cache="off", eod_id=0
        ),
        [SIZE, 0, 0],
    )[0]
    with pytest.raises(ConfigError, match="needs a blend"):
        build_dataloader(one, micro_batch_size=2, dp_size=1, dp_rank=0, num_workers=0).set_weights(
            [1]
        )
    with pytest.raises(ConfigError, match="cyclic"):
        build_dataloader(
            dataset(files, "computed")(),
            micro_batch_size=2,
            dp_size=1,
            dp_rank=0,
            num_workers=0,
            kind="cyclic",
        ).set_weights([1, 1, 1, 1])
    end = build_dataloader(
        dataset(files, "computed")(),
        micro_batch_size=2,
        dp_size=1,
        dp_rank=0,
        num_workers=0,
        consumed_samples=SIZE,
    )
    end.set_weights([1, 1, 1, 1])  # after the last sample: changes nothing
    assert end.state_dict()["weights_changes"] == []


def test_the_changed_shares_follow_the_new_weights(files):
    _, ids, _ = serve(dataset(files, "computed"), 40, changes={10: [1, 0, 0, 3]})
    after = np.array(ids[10 * GROUP :])
    m = np.arange(1, after.size + 1)
    assert (np.abs(np.cumsum(after == 3) - m * 3 / 4) < 1 + 1e-9).all()
    assert not np.isin(after, [1, 2]).any()
