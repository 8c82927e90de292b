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


def build(prefixes, order):
    blend = [x for p in prefixes for x in ("1", p)]
    cfg = MegatronDataConfig(
        sequence_length=S,
        blend=blend,
        split="100,0,0",
        order=order,
        weights_schedule=[(0, [3, 1, 0]), (96, [1, 1, 2])],
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
        assert words in explained.value.hint and "random_seed" in explained.value.hint
