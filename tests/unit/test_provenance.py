"""``tokenload.provenance`` (issue 35, point 3) on token files whose every token names its source,
document and position (``source * 1e6 + document * 1000 + position``): ``explain``'s pieces
rebuild the rows the loader served (every rank's micro-batches, in rank order) and ``where``
equals a scan of every served row's tokens, across a skip, a weights schedule and a
``set_weights`` change recorded in the loader's state, on both orders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import ConfigError, StateError
from tokenload.loader import build_dataloader
from tokenload.provenance import explain, where

pytestmark = pytest.mark.timeout(300)

S, SIZE, G = 16, 480, 8  # sequence length, samples, global batch (2 ranks x 2 micro x 2 rows)
SOURCES = 3


def token(source, document, position):
    return source * 1_000_000 + document * 1000 + position


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("named")
    rng = np.random.default_rng(3)
    out = []
    for s in range(SOURCES):
        lengths = rng.integers(1, 60, size=120)
        docs = [[token(s, d, p) for p in range(n)] for d, n in enumerate(lengths.tolist())]
        out.append(write_documents(tmp / f"s{s}", docs, dtype=np.int32))
    return out


def build(prefixes, order, schedule=((0, [3, 1, 0]), (96, [1, 1, 2]))):
    blend = [x for p in prefixes for x in ("1", p)]
    cfg = MegatronDataConfig(
        sequence_length=S,
        blend=blend,
        split="100,0,0",
        order=order,
        weights_schedule=list(schedule),
        **({"mixture_change": "continue"} if order == "megatron" else {}),
    )
    return build_datasets(cfg, [SIZE, 0, 0])[0]


def decode(tokens):
    """(source, document, position) of each token."""
    t = np.asarray(tokens, dtype=np.int64)
    source, rest = np.divmod(t, 1_000_000)
    document, position = np.divmod(rest, 1000)
    return source, document, position


def run(prefixes, order, steps, workers=0):
    """Every rank's batches of ``steps`` global steps (2 ranks, micro-batch 2, G = 8), with a
    skip of one global step after step 3 and ``set_weights`` after step 7; the state after."""
    loaders = [
        build_dataloader(
            build(prefixes, order), micro_batch_size=2, dp_rank=r, dp_size=2, num_workers=workers
        )
        for r in range(2)
    ]
    iters = [iter(x) for x in loaders]
    served = {}  # (step, rank, micro-batch) -> tokens
    for step in range(steps):
        if step == 4:
            for x in loaders:
                x.skip(samples=G)
        if step == 8:
            for x in loaders:
                x.set_weights([0, 1, 3])
        for micro in range(2):
            for rank, it in enumerate(iters):
                served[step, rank, micro] = next(it)["tokens"].numpy()
    state = json.loads(json.dumps(loaders[0].state_dict()))
    for x in loaders:
        x.close()
    return served, state


def rebuilt(row):
    """The tokens a row's pieces name."""
    return [token(p.source, p.document, k) for p in row.pieces for k in range(p.start, p.stop)]


@pytest.mark.parametrize(("order", "workers"), [("computed", 2), ("megatron", 2), ("computed", 0)])
def test_explain_and_where_match_the_rows_the_loader_served(prefixes, order, workers):
    steps = 40
    served, state = run(prefixes, order, steps, workers)
    assert [s["samples"] for s in state["skips"]] == [G]
    assert state["weights_changes"] == [[9 * G, [0.0, 1.0, 3.0]]]
    held = {}  # (source, document) -> steps whose rows hold a token of it
    for step in range(steps):
        rows = explain(build(prefixes, order), step=step, global_batch_size=G, state=state)
        assert [(r.rank, r.micro_batch, r.row) for r in rows] == [
            (rank, micro, row) for rank in range(2) for micro in range(2) for row in range(2)
        ]
        for r in rows:
            tokens = served[step, r.rank, r.micro_batch][r.row]
            assert rebuilt(r) == tokens.tolist()  # no sample is short: never padded
            source, document, _ = decode(tokens)
            for key in zip(source.tolist(), document.tolist()):
                held.setdefault(key, set()).add(step)
    assert {s for s, _ in held} == {0, 1, 2}  # the set_weights change took effect
    rng = np.random.default_rng(0)
    keys = sorted(held)
    asked = [keys[i] for i in rng.choice(len(keys), size=25, replace=False)]
    asked += [(2, d) for d in range(3)]  # a source the schedule drew from sample 96 on
    for source, document in asked:
        found = where(
            build(prefixes, order),
            source=source,
            document=document,
            global_batch_size=G,
            state=state,
        )
        within = [s for s in found.steps if s < steps]
        assert within == sorted(held.get((source, document), ())), (source, document)


def test_where_lists_the_skipped_samples_and_explain_refuses_bad_queries(prefixes):
    _, state = run(prefixes, "computed", 6)
    data = build(prefixes, "computed")
    rows = explain(data, step=4, global_batch_size=G, state=state)
    skipped = list(range(4 * G, 5 * G))  # step 4 is the step after the skip
    assert [r.sample for r in sorted(rows, key=lambda r: r.sample)] == [k + G for k in skipped]
    for r in explain(build(prefixes, "computed"), step=3, global_batch_size=G, state=state):
        assert r.sample < 4 * G
    # a document of a skipped sample: listed apart, in no step
    pieces = build(prefixes, "computed").sample_pieces(np.array(skipped))
    document = int(pieces.document[0])
    found = where(
        build(prefixes, "computed"),
        source=int(pieces.source[0]),
        document=document,
        global_batch_size=G,
        state=state,
    )
    assert set(found.skipped) & set(skipped)
    everywhere = where(build(prefixes, "computed"), source=0, document=5, global_batch_size=G)
    first = where(build(prefixes, "computed"), source=0, document=5, global_batch_size=G, steps=20)
    assert first.steps == [s for s in everywhere.steps if s < 20] and everywhere.steps[-1] >= 20
    with pytest.raises(ConfigError, match="global_batch_size"):
        explain(build(prefixes, "computed"), step=0, global_batch_size=6, state=state)
    with pytest.raises(ConfigError, match="source"):
        where(build(prefixes, "computed"), source=3, document=0, global_batch_size=G)
    with pytest.raises(ConfigError, match="step"):
        explain(build(prefixes, "computed"), step=SIZE, global_batch_size=G)


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_explain_and_where_on_packed_rows_match_the_rows(prefixes, order):
    cfg = MegatronDataConfig(
        sequence_length=S,
        blend=[x for p in prefixes[:2] for x in ("1", p)],
        split="100,0,0",
        order=order,
        packing="best-fit",
        **({"cache": "off"} if order == "megatron" else {}),
    )
    data = build_datasets(cfg, [200, 0, 0])[0]
    steps = 200 // G
    held = {}  # (source, document) -> steps whose rows' inputs hold a token of it
    for step in range(steps):
        rows = explain(data, step=step, global_batch_size=G)
        tokens = data.__getitems__([r.sample for r in rows])["tokens"]
        for r, served in zip(rows, tokens.tolist(), strict=True):
            mine = rebuilt(r)
            assert mine == served[: len(mine)] and len(r.pieces) >= 1
            assert not any(served[len(mine) :])  # padding after the documents
            real = np.array(served[: len(mine)])
            source, document, _ = decode(real[real != 0])
            for key in zip(source.tolist(), document.tolist()):
                held.setdefault(key, set()).add(step)
    rng = np.random.default_rng(1)
    keys = sorted(k for k in held if k[1] > 0)  # token 0 is padding's too: document 0 aside
    for source, document in [keys[i] for i in rng.choice(len(keys), size=25, replace=False)]:
        found = where(data, source=source, document=document, global_batch_size=G)
        assert found.steps == sorted(held[source, document]), (source, document)
    rare = where(data, source=1, document=119, global_batch_size=G)
    assert rare.steps == sorted(held.get((1, 119), ()))


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_a_state_of_another_packing_or_seed_is_refused_as_the_loader_refuses_it(prefixes, order):
    def data(**options):
        cfg = MegatronDataConfig(
            sequence_length=S,
            blend=[x for p in prefixes[:2] for x in ("1", p)],
            split="100,0,0",
            order=order,
            **({"cache": "off"} if order == "megatron" else {}),
            **options,
        )
        return build_datasets(cfg, [200, 0, 0])[0]

    loader = build_dataloader(data(packing="best-fit"), micro_batch_size=2, num_workers=0)
    batches = iter(loader)
    for _ in range(4):
        next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    rows = explain(data(packing="best-fit"), step=1, global_batch_size=G, state=state)
    assert [r.sample for r in rows] == list(range(G, 2 * G))  # the packed run's own: answered
    for other, words in (({}, "packing='concat'"), ({"packing": "best-fit", "random_seed": 7}, "")):
        resume = build_dataloader(data(**other), micro_batch_size=2, num_workers=0)
        with pytest.raises(StateError) as resumed:
            resume.load_state_dict(state)
        with pytest.raises(StateError) as explained:
            explain(data(**other), step=1, global_batch_size=G, state=state)
        with pytest.raises(StateError) as found:
            where(data(**other), source=0, document=1, global_batch_size=G, state=state)
        assert explained.value.message == found.value.message == resumed.value.message
        assert explained.value.hint == resumed.value.hint  # a resume's refusal says it too
        assert words in resumed.value.hint and "random_seed" in resumed.value.hint
        assert f"in order={order!r}" in resumed.value.hint


def serve(phases, skips=()):
    """The rows the loaders served, phase by phase: each phase ``(make, dp, mbs, steps)``
    resumes from the state the last one saved, on ``dp`` ranks of micro-batch ``mbs`` reading
    ``make()``; ``skips``: ``(step, micro-batch, samples)``, skipped on every rank before that
    micro-batch. ``{(step, rank, micro-batch, row): tokens}`` and the last state."""
    served, state, step = {}, None, 0
    skipped = {(s, m): n for s, m, n in skips}
    for make, dp, mbs, steps in phases:
        loaders = []
        for rank in range(dp):
            loader = build_dataloader(
                make(), micro_batch_size=mbs, dp_rank=rank, dp_size=dp, num_workers=0
            )
            if state is not None:
                loader.load_state_dict(state)
            loaders.append(loader)
        iters = [iter(x) for x in loaders]
        for _ in range(steps):
            for micro in range(G // (mbs * dp)):
                if (step, micro) in skipped:
                    for x in loaders:
                        x.skip(samples=skipped[step, micro])
                for rank, it in enumerate(iters):
                    for row, tokens in enumerate(next(it)["tokens"].numpy().tolist()):
                        served[step, rank, micro, row] = tokens
            step += 1
        state = json.loads(json.dumps(loaders[0].state_dict()))
        for x in loaders:
            x.close()
    return served, state


def assert_explained(make, served, steps, state, **topology):
    """``explain`` of each of ``steps`` lists the rows served, at the rank, micro-batch and row
    that received them, each rebuilding its tokens."""
    for step in steps:
        rows = explain(make(), step=step, global_batch_size=G, state=state, **topology)
        assert sorted((r.rank, r.micro_batch, r.row) for r in rows) == sorted(
            k[1:] for k in served if k[0] == step
        ), step
        for r in rows:
            assert rebuilt(r) == served[step, r.rank, r.micro_batch, r.row], (step, r)


def held_by(served, source, document):
    """(step, rank, micro-batch, row) of every served row holding a token of the document."""
    out = []
    for key, tokens in served.items():
        s, d, _ = decode(tokens)
        if ((s == source) & (d == document)).any():
            out.append(key)
    return sorted(out)


def where_rows(found, steps):
    return sorted((s, r.rank, r.micro_batch, r.row) for s, r in found.rows if s < steps)


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_steps_before_an_elastic_resume_keep_the_topology_they_ran_with(prefixes, order):
    # 2 ranks x micro-batch 2, then 4 x 1 (the same samples per micro-batch step: nothing but
    # the history tells them apart), then 1 x 4; G = 8 is two micro-batch steps on each
    def make():
        return build(prefixes, order)

    served, state = serve([(make, 2, 2, 4), (make, 4, 1, 3), (make, 1, 4, 2)])
    assert state["topologies"] == [[0, 2, 2], [32, 1, 4], [56, 4, 1]]
    assert_explained(make, served, range(9), state)
    rng = np.random.default_rng(5)
    keys = sorted({k for t in served.values() for k in zip(*decode(t)[:2], strict=True)})
    for source, document in [keys[i] for i in rng.choice(len(keys), size=12, replace=False)]:
        found = where(make(), source=source, document=document, global_batch_size=G, state=state)
        assert where_rows(found, 9) == held_by(served, source, document), (source, document)
        assert not found.unplaced and not found.notes


def test_a_state_without_the_topology_history_says_it_cannot_place_earlier_steps(prefixes):
    def make():
        return build(prefixes, "computed")

    served, state = serve([(make, 2, 2, 4), (make, 4, 1, 3)])
    old = {k: v for k, v in state.items() if k != "topologies"}  # as an older tokenload saved
    with pytest.raises(StateError, match="only from global sample 56") as refused:
        explain(make(), step=1, global_batch_size=G, state=old)
    assert "micro_batch_size= and dp_size=" in refused.value.hint
    rows = explain(make(), step=7, global_batch_size=G, state=old)  # from its save on: its own
    assert [(r.rank, r.micro_batch, r.row) for r in rows][:3] == [(0, 0, 0), (0, 1, 0), (1, 0, 0)]
    # both sizes given: they place the samples before the state's history
    assert_explained(make, served, range(4), old, micro_batch_size=2, dp_size=2)
    source, document = (int(x[0]) for x in decode(served[1, 1, 1, 1])[:2])
    found = where(make(), source=source, document=document, global_batch_size=G, state=old)
    held = held_by(served, source, document)
    assert sorted({k[0] for k in held}) == [s for s in found.steps if s < 7]
    assert {s for s, _ in found.unplaced} == {k[0] for k in held}
    assert not found.rows or min(s for s, _ in found.rows) >= 7
    assert len(found.notes) == 1 and "global sample 56" in found.notes[0]
    # a loader that resumes such a state on another topology records where it began
    loader = build_dataloader(make(), micro_batch_size=8, dp_rank=0, dp_size=1, num_workers=0)
    loader.load_state_dict(old)
    assert loader.state_dict()["topologies"] == [[56, 8, 1]]
    loader.close()


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_explain_places_the_rows_after_a_skip_between_the_micro_batches_of_a_step(
    prefixes, order
):
    def make():
        return build(prefixes, order)

    # step 1's second micro-batch step comes after a skip of 4 samples (one micro-batch step)
    served, state = serve([(make, 2, 2, 5)], skips=[(1, 1, 4)])
    assert [(s["at"], s["samples"]) for s in state["skips"]] == [(12, 4)]
    assert_explained(make, served, range(5), state)
    rows = explain(make(), step=1, global_batch_size=G, state=state)
    assert sorted(r.sample for r in rows) == [8, 9, 10, 11, 16, 17, 18, 19]
    source, document = (int(x[0]) for x in decode(served[1, 0, 1, 0])[:2])
    found = where(make(), source=source, document=document, global_batch_size=G, state=state)
    assert where_rows(found, 5) == held_by(served, source, document)


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_where_names_the_steps_before_a_mixture_change_at_a_resume(prefixes, order):
    def before():
        return build(prefixes, order)

    def after():  # other weights from the resume on: a new mixture chain
        return build(prefixes, order, schedule=[(0, [1, 1, 1])])

    served, state = serve([(before, 2, 2, 5), (after, 2, 2, 4)])
    keys = sorted({k for t in served.values() for k in zip(*decode(t)[:2], strict=True)})
    only_before = [
        k for k in keys if {s for s, *_ in held_by(served, *k)} <= {0, 1, 2, 3, 4}
    ]
    assert only_before
    for source, document in only_before[:5]:
        found = where(after(), source=source, document=document, global_batch_size=G, state=state)
        assert [s for s in found.steps if s < 9] == [] and found.first_sample == 5 * G
        assert len(found.notes) == 1
        assert "steps before 5 (global samples before 40) are not covered" in found.notes[0]
    for source, document in keys[::7]:
        found = where(after(), source=source, document=document, global_batch_size=G, state=state)
        assert where_rows(found, 9) == [k for k in held_by(served, source, document) if k[0] >= 5]
    with pytest.raises(StateError, match="before the state's mixture chain"):
        explain(after(), step=4, global_batch_size=G, state=state)
    assert_explained(after, served, range(5, 9), state)


def test_where_refuses_a_document_past_the_token_file_with_the_range(prefixes):
    for document in (120, 10**9, 2**63):  # the token files hold 120 documents each
        with pytest.raises(ConfigError, match=r"holds 120 documents .*numbered 0\.\.119") as e:
            where(build(prefixes, "megatron"), source=1, document=document, global_batch_size=G)
        assert e.value.field == "document" and "token file" in e.value.hint
    last = [
        where(build(prefixes, "computed"), source=s, document=119, global_batch_size=G).steps
        for s in range(SOURCES)
    ]
    assert any(last)  # the last document is in range: answered


def test_bad_sizes_and_query_values_are_config_errors_with_what_to_do(prefixes):
    data = build(prefixes, "computed")
    for sizes, name in (
        ({"micro_batch_size": 0}, "micro_batch_size is 0"),
        ({"dp_size": 0, "micro_batch_size": 0}, "micro_batch_size is 0"),
        ({"dp_size": 0}, "dp_size is 0"),
        ({"micro_batch_size": -2, "dp_size": -4}, "micro_batch_size is -2"),
        ({"micro_batch_size": 2.0}, "micro_batch_size is 2.0"),
    ):
        for query in (explain, where):
            asked = {"step": 0} if query is explain else {"source": 0, "document": 1}
            with pytest.raises(ConfigError, match=name) as e:
                query(data, global_batch_size=G, **asked, **sizes)
            assert "expected an int >= 1" in e.value.message and e.value.hint
    for asked, name in (
        ({"steps": -1}, "steps is -1"),
        ({"document": -1}, "document is -1"),
        ({"document": "3"}, "document is '3'"),
    ):
        with pytest.raises(ConfigError, match=name) as e:
            where(data, source=0, global_batch_size=G, **{"document": 1, **asked})
        assert "expected an int >= 0" in e.value.message and e.value.hint
    # NumPy integers are integers
    rows = explain(data, step=np.int64(3), global_batch_size=np.int64(G), dp_size=np.int32(2),
                   micro_batch_size=np.int64(2))  # fmt: skip
    assert rows == explain(data, step=3, global_batch_size=G, dp_size=2, micro_batch_size=2)
    assert {r.rank for r in rows} == {0, 1}
    found = where(data, source=np.int64(0), document=np.uint16(5), global_batch_size=G,
                  steps=np.int64(20))  # fmt: skip
    assert found == where(data, source=0, document=5, global_batch_size=G, steps=20)
    assert found.steps


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_a_batch_schedule_s_steps_are_explained_and_found(prefixes, order):
    """With megatron-core's --step-batch-size-schedule the global batch changes with the samples
    received (8 from 0, 16 once 20 are received: step 3 of 8 passes 20, so step 3 on holds 16,
    then 24 from 100), as Megatron's training loop takes its micro-batches; explain and where
    place every row as served, with a skip inside the larger steps."""
    from tokenload.megatron_args import StepBatchSchedule

    schedule = StepBatchSchedule.parse("0:8 20:16 100:24")
    dp, mbs = 2, 2
    loaders = [
        build_dataloader(build(prefixes, order), micro_batch_size=mbs, dp_rank=r, dp_size=dp,
                         num_workers=0)
        for r in range(dp)
    ]
    iters = [iter(x) for x in loaders]
    served = {}
    for step in range(10):
        batch = schedule.batch_of_step(step)
        for micro in range(batch // (mbs * dp)):
            if (step, micro) == (6, 2):
                for x in loaders:
                    x.skip(samples=mbs * dp)
            for rank, it in enumerate(iters):
                for row, tokens in enumerate(next(it)["tokens"].numpy().tolist()):
                    served[step, rank, micro, row] = tokens
    state = json.loads(json.dumps(loaders[0].state_dict()))
    for x in loaders:
        x.close()
    assert [schedule.batch_of_step(s) for s in range(10)] == [8, 8, 8, 16, 16, 16, 16, 16, 24, 24]
    for step in range(10):
        rows = explain(build(prefixes, order), step=step, global_batch_size=schedule, state=state)
        assert sorted((r.rank, r.micro_batch, r.row) for r in rows) == sorted(
            k[1:] for k in served if k[0] == step
        ), step
        for r in rows:
            assert rebuilt(r) == served[step, r.rank, r.micro_batch, r.row], (step, r)
    rng = np.random.default_rng(9)
    keys = sorted({k for t in served.values() for k in zip(*decode(t)[:2], strict=True)})
    for source, document in [keys[i] for i in rng.choice(len(keys), size=12, replace=False)]:
        found = where(build(prefixes, order), source=source, document=document,
                      global_batch_size=schedule, state=state)
        assert where_rows(found, 10) == held_by(served, source, document), (source, document)
    with pytest.raises(ConfigError, match="not a multiple"):  # 8 on 3 ranks of 2: no run
        explain(build(prefixes, order), step=0, global_batch_size=schedule, micro_batch_size=2,
                dp_size=3)


@pytest.mark.parametrize("order", ["computed", "megatron"])
def test_a_resume_between_the_micro_batches_of_a_step_places_rows_as_served(prefixes, order):
    """A state saved inside a step (after a skip between its micro-batches: 6 of its 8 samples
    received) and resumed on 1 rank of micro-batch 4: the new micro-batches begin where the
    resume began, so one straddles steps 0 and 1. Every row is placed at the rank and row that
    served it, and the step's micro-batches count on in the order received."""

    def make():
        return build(prefixes, order)

    served = {}  # tokens -> (rank, row, the loader's micro-batch count)
    first = [build_dataloader(make(), micro_batch_size=1, dp_rank=r, dp_size=2, num_workers=0)
             for r in range(2)]  # fmt: skip
    its = [iter(x) for x in first]
    for micro in range(3):
        if micro == 1:
            for x in first:
                x.skip(samples=2)
        for rank, it in enumerate(its):
            for row, tokens in enumerate(next(it)["tokens"].numpy().tolist()):
                served[tuple(tokens)] = (rank, row)
    state = json.loads(json.dumps(first[0].state_dict()))
    for x in first:
        x.close()
    second = build_dataloader(make(), micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=0)
    second.load_state_dict(state)
    it = iter(second)
    for _ in range(6):
        for row, tokens in enumerate(next(it)["tokens"].numpy().tolist()):
            served[tuple(tokens)] = (0, row)
    state = json.loads(json.dumps(second.state_dict()))
    second.close()
    assert state["topologies"] == [[0, 1, 2], [8, 4, 1]]
    for step in range(3):
        rows = explain(make(), step=step, global_batch_size=G, state=state)
        assert len(rows) == G
        for r in rows:
            assert served[tuple(rebuilt(r))] == (r.rank, r.row), (step, r)
        received = sorted(rows, key=lambda r: r.sample)
        micros = [r.micro_batch for r in received]
        assert micros[0] == 0 and micros == sorted(micros), (step, micros)
    step0 = sorted(explain(make(), step=0, global_batch_size=G, state=state), key=lambda r: r.sample)
    assert [(r.micro_batch, r.rank, r.row) for r in step0] == [
        (0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0), (2, 0, 0), (2, 1, 0), (3, 0, 0), (3, 0, 1)
    ]  # fmt: skip
