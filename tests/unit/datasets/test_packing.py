"""Packed rows (``packing="best-fit"``) on both orders, checked on token files whose tokens name
their source, document and position (an independent model: the tokens themselves).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import CacheError, ConfigError, StateError
from tokenload.loader import build_dataloader

S = 32
W = S + 1


def named(source: int, doc: int, length: int) -> np.ndarray:
    """Tokens that say where they come from: source, document and position."""
    return (source << 26) | (doc << 12) | np.arange(length, dtype=np.int64)


def unname(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = np.asarray(tokens, dtype=np.int64)
    return t >> 26, (t >> 12) & ((1 << 14) - 1), t & ((1 << 12) - 1)


def corpus(tmp_path, source: int, n: int, seed: int) -> tuple[str, list[int]]:
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(np.log(12), 1.0, n).astype(int), 200).tolist()
    lengths[3] = 0  # an empty document
    lengths[5] = W  # exactly one window
    lengths[7] = W + 1  # a rest of two tokens
    lengths[9] = 3 * S + 1  # three full windows, no rest
    docs = [named(source, d, k) for d, k in enumerate(lengths)]
    prefix = write_documents(tmp_path / f"src{source}", docs, dtype=np.int32)
    return prefix, lengths


ORDERS = pytest.mark.parametrize("order", ["computed", "megatron"])


def config(**fields):
    base = dict(
        sequence_length=S,
        order="computed",
        packing="best-fit",
        split="1,0,0",
        random_seed=7,
        eod_id=None,
    )
    base.update(fields)
    return MegatronDataConfig(**base)


def windows_of(batch) -> np.ndarray:
    """Each row's S + 1 slots: its inputs, then the last label (0 where padding)."""
    return np.concatenate([batch["tokens"], batch["labels"][:, -1:]], axis=1)


def runs(window: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """The row's pieces: (source, document, first position, stop position, first slot)."""
    src, doc, p = unname(window)
    out = []
    i = 0
    while i < window.size:
        if window[i] == 0:  # padding (no real token is 0: sources start at 1)
            i += 1
            continue
        j = i + 1
        while (
            j < window.size
            and window[j] != 0
            and src[j] == src[i]
            and doc[j] == doc[i]
            and p[j] == p[j - 1] + 1
        ):
            j += 1
        out.append((int(src[i]), int(doc[i]), int(p[i]), int(p[j - 1]) + 1, i))
        i = j
    return out


@ORDERS
@pytest.mark.parametrize("sources", [1, 2])
def test_every_document_served_whole_once_per_epoch_with_little_padding(tmp_path, order, sources) -> None:
    """One epoch (size None) of one source, or of an unweighted blend of two (whose one epoch is
    each source's: the computed order once sized it by an estimate of rows, ceil(tokens / W),
    and left some of a source's pieces unserved)."""
    made = [corpus(tmp_path, 1 + s, 3000 if s == 0 else 700, seed=1 + s) for s in range(sources)]
    train, _, _ = build_datasets(config(blend=[p for p, _ in made], order=order), [None, 0, 0])
    assert train is not None
    n = len(train)
    batch = train.__getitems__(np.arange(n))
    windows = windows_of(batch)
    seen: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r in range(n):
        pieces = runs(windows[r])
        # documents back to back from slot 0, padding only at the end
        slot = 0
        for src, d, a, b, first_slot in pieces:
            assert first_slot == slot
            slot += b - a
            seen.setdefault((src, d), []).append((a, b))
        assert (windows[r, slot:] == 0).all()
        # position ids restart at every document
        starts = [first for *_, first in pieces if first < S]
        assert np.flatnonzero(batch["position_ids"][r] == 0).tolist() == starts
    every = [((s + 1, d), k) for s, (_, lengths) in enumerate(made) for d, k in enumerate(lengths)]
    for (src, d), k in every:
        got = sorted(seen.get((src, d), []))
        if k == 0:
            assert not got
        elif k <= W:  # never cut: one piece, the whole document
            assert got == [(0, k)], (d, k, got)
        else:  # full windows overlapping by the extra token, and a rest
            covered = np.zeros(k, dtype=int)
            for a, b in got:
                assert b - a <= W
                covered[a + 1 : b] += 1  # the labels each piece trains on
            assert covered[1:].tolist() == [1] * (k - 1), (d, k, got)
    padding = (windows == 0).sum() / windows.size
    assert padding < 0.01, padding
    # no loss where the label is padding, full loss elsewhere
    assert ((batch["loss_mask"] > 0) == (batch["labels"] != 0)).all()


@ORDERS
def test_boundaries_position_ids_and_cu_seqlens_follow_the_documents(tmp_path, order) -> None:
    prefix, _ = corpus(tmp_path, 1, 600, seed=2)
    cfg = config(blend=[prefix], inter_document_masking=True, eod_id=1, order=order)
    train, _, _ = build_datasets(cfg, [200, 0, 0])
    assert train is not None
    batch = train.__getitems__(np.arange(len(train)))
    _, doc, p = unname(batch["tokens"])
    real = batch["loss_mask"] > 0
    for r in range(batch["tokens"].shape[0]):
        cu = batch["cu_seqlens"][r].tolist()
        assert cu[0] == 0 and max(cu) == S and cu == sorted(cu)
        inner = sorted({c for c in cu if 0 < c < S})
        restarts = np.flatnonzero(batch["position_ids"][r] == 0).tolist()
        assert restarts == [0, *inner]
        # every boundary starts another document; inside a segment the tokens run on
        for a in inner:
            assert doc[r, a] != doc[r, a - 1] or p[r, a] != p[r, a - 1] + 1
        for a, b in zip([0, *inner], [*inner, S], strict=True):
            n = int(real[r, a:b].sum()) + 1  # the last input's label may be padding
            n = min(n, b - a)
            assert (doc[r, a : a + n] == doc[r, a]).all()
            assert (np.diff(p[r, a : a + n]) == 1).all()
        assert batch["max_seqlen"][r] == np.diff(cu).max()


@ORDERS
def test_blend_rows_hold_one_source_and_shares_follow_the_weights(tmp_path, order) -> None:
    a, _ = corpus(tmp_path, 1, 2000, seed=3)
    b, _ = corpus(tmp_path, 2, 2000, seed=4)
    train, _, _ = build_datasets(config(blend=["0.25", a, "0.75", b], order=order), [400, 0, 0])
    assert train is not None
    batch = train.__getitems__(np.arange(400))
    src, _, _ = unname(batch["tokens"])
    real = batch["loss_mask"] > 0
    for r in range(400):
        sources = set(src[r][real[r]].tolist())
        assert sources == {int(batch["dataset_id"][r]) + 1}
    share = np.bincount(batch["dataset_id"], minlength=2) / 400
    assert abs(share[0] - 0.25) < 0.01


@ORDERS
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_on_fewer_ranks_with_another_micro_batch_gives_the_same_stream(
    tmp_path, workers, order
) -> None:
    a, _ = corpus(tmp_path, 1, 1500, seed=5)
    b, _ = corpus(tmp_path, 2, 1500, seed=6)
    cfg = config(blend=["0.5", a, "0.5", b], order=order)
    total = 96

    def stream(ranks: int, mbs: int, start: int, stop: int) -> list[np.ndarray]:
        """Global samples start..stop as the ranks receive them, in global order."""
        per_rank = []
        for rank in range(ranks):
            train, _, _ = build_datasets(cfg, [total, 0, 0])
            assert train is not None
            loader = build_dataloader(
                train,
                consumed_samples=start,
                micro_batch_size=mbs,
                dp_rank=rank,
                dp_size=ranks,
                num_workers=workers,
            )
            got = []
            it = iter(loader)
            for _ in range((stop - start) // (mbs * ranks)):
                got.append(np.asarray(next(it)["tokens"]))
            loader.close()
            per_rank.append(got)
        steps: list[np.ndarray] = []
        for step in range(len(per_rank[0])):
            steps.extend(per_rank[r][step] for r in range(ranks))
        return [row for mb in steps for row in mb]

    whole = stream(4, 2, 0, total)
    first = stream(4, 2, 0, 40)
    rest = stream(2, 4, 40, total)
    assert len(whole) == len(first) + len(rest)
    for x, y in zip(whole, first + rest, strict=True):
        assert (x == y).all()


def test_packing_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="packing"):
        config(packing="greedy")
    with pytest.raises(ConfigError, match="neox"):
        config(order="neox")
    with pytest.raises(ConfigError, match="max_documents_per_row"):
        config(packing="concat", max_documents_per_row=4)
    with pytest.raises(ConfigError, match="max_documents_per_row"):
        config(max_documents_per_row=0)
    with pytest.raises(ConfigError, match="block_size applies to packing='concat'"):
        config(block_size=64)
    assert config(packing="concat", block_size=64, blend=["a/b"]).block_size == 64


@ORDERS
@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_sequence_length_is_checked_alike_on_every_order_and_packing(tmp_path, order, packing) -> None:
    """Red-team findings: S=True was taken as 1 and 1.5 raised a raw TypeError on three of the
    four paths, 2**40 exhausted memory on the computed order, and a NumPy int S failed Megatron's
    cache description with a raw TypeError. One check in the config: NumPy integers are ints."""
    extra = {"path_to_cache": str(tmp_path / "c")} if order == "megatron" else {}
    for bad, words in ((True, "True; expected an int"), (1.5, "1.5; expected an int"), ("8", "'8'; expected an int"),
                       (0, "0; expected 1..2147483647"), (2**40, "1099511627776; expected 1..2147483647")):
        with pytest.raises(ConfigError, match=f"sequence_length is {words}"):
            config(order=order, packing=packing, sequence_length=bad, **extra)
    with pytest.raises(ConfigError, match=r"random_seed is 2\.0; expected an int"):
        config(order=order, packing=packing, random_seed=2.0, **extra)
    prefix, _ = corpus(tmp_path, 1, 200, seed=3)
    cap = {"max_documents_per_row": np.int64(3)} if packing == "best-fit" else {}
    numpy_ints = config(blend=[prefix], order=order, packing=packing, sequence_length=np.int64(S),
                        random_seed=np.int32(7), **cap, **extra)
    assert type(numpy_ints.sequence_length) is int and type(numpy_ints.random_seed) is int
    plain = config(blend=[prefix], order=order, packing=packing, **({"max_documents_per_row": 3} if cap else {}),
                   **extra)
    a, b = (build_datasets(c, [40, 0, 0])[0] for c in (numpy_ints, plain))
    assert a is not None and b is not None
    np.testing.assert_array_equal(a.__getitems__(np.arange(40))["tokens"], b.__getitems__(np.arange(40))["tokens"])


@ORDERS
@pytest.mark.parametrize("pad_id", [0, 1])
def test_reset_position_ids_and_attention_mask_keep_megatron_s_eod_rule(
    tmp_path, order, pad_id
) -> None:
    # without inter_document_masking, an EOD inside a document starts a segment too (as in a
    # concatenated sample); the padding (even when it is the EOD id) does not
    eod = 1
    rng = np.random.default_rng(3)
    docs = []
    for _ in range(150):
        doc = rng.integers(2, 500, int(rng.integers(1, 30)))
        doc[rng.random(doc.size) < 0.1] = eod  # EODs inside, and at some ends
        docs.append(doc)
    prefix = write_documents(tmp_path / "eods", docs, dtype=np.int32)
    base = dict(order=order, blend=[prefix], eod_id=eod)
    # the reference: the same rows with pad id 0 (no token is 0), positions per document only
    flags = dict(reset_position_ids=True, reset_attention_mask=True, create_attention_mask=True)
    served = []
    for fields in (dict(pad_id=0), dict(pad_id=pad_id, **flags)):
        train, _, _ = build_datasets(config(**base, **fields), [60, 0, 0])
        assert train is not None
        served.append(train.__getitems__(np.arange(60)))
    plain, reset = served
    seq = plain["tokens"].shape[1]
    at = np.arange(seq)
    documents = at - plain["position_ids"]  # where each position's document begins
    for r in range(60):
        row = plain["tokens"][r]
        held = int(np.flatnonzero(row)[-1]) + 1  # the row's tokens, then its padding (0)
        after_eod = np.zeros(seq, dtype=np.int64)
        for j in range(1, seq):
            new_segment = j < held and row[j - 1] == eod  # none in the padding
            after_eod[j] = j if new_segment else after_eod[j - 1]
        starts = np.maximum(documents[r], after_eod)
        assert (reset["position_ids"][r] == at - starts).all(), r
        same = starts[:, None] == starts[None, :]
        causal = np.tril(np.ones((seq, seq), dtype=bool))
        assert (reset["attention_mask"][r, 0] == ~(causal & same)).all(), r
    assert (reset["position_ids"] != plain["position_ids"]).any()  # the rule changed something


@ORDERS
def test_a_split_of_only_empty_documents_has_no_row(tmp_path, order) -> None:
    empty = write_documents(tmp_path / "empty", [[]] * 3, dtype=np.int32)
    with pytest.raises(ConfigError, match=r"no tokens|0 tokens"):
        build_datasets(config(order=order, blend=[empty]), [10, 0, 0])
    train, _, _ = build_datasets(config(order=order, blend=[empty]), [None, None, None])
    assert train is not None and len(train) == 0  # no request: an empty dataset (it used to search for a row forever)


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("folder", [None, "cache"])
def test_a_blend_s_missing_caches_are_a_cache_error_under_build_policy_none(
    tmp_path, weighted, folder
) -> None:
    a, _ = corpus(tmp_path, 1, 300, seed=13)
    b, _ = corpus(tmp_path, 2, 300, seed=14)
    blend = ["0.3", a, "0.7", b] if weighted else [a, b]
    cfg = config(
        order="megatron",
        blend=blend,
        build_policy="none",
        path_to_cache=None if folder is None else str(tmp_path / folder),
    )
    with pytest.raises(CacheError, match="missing"):
        build_datasets(cfg, [200, 0, 0])


@pytest.mark.parametrize("order", ["megatron"])
def test_rows_of_short_documents_only_are_cached_and_loaded(tmp_path, order) -> None:
    # no document is cut: the plan has no full window (an empty array in the cache)
    prefix = write_documents(
        tmp_path / "short", [named(1, d, 1 + d % 9) for d in range(60)], dtype=np.int32
    )
    cache = str(tmp_path / "cache")
    served = []
    for policy in ("auto", "auto", "none"):
        cfg = config(order=order, blend=[prefix], path_to_cache=cache, build_policy=policy)
        train, _, _ = build_datasets(cfg, [40, 0, 0])
        assert train is not None
        served.append(windows_of(train.__getitems__(np.arange(40))))
    assert served[0].shape == (40, W) and (served[0] == served[1]).all()
    assert (served[0] == served[2]).all()


@ORDERS
def test_documents_per_row_cap(tmp_path, order) -> None:
    prefix, _ = corpus(tmp_path, 1, 800, seed=8)
    train, _, _ = build_datasets(
        config(blend=[prefix], max_documents_per_row=2, order=order), [100, 0, 0]
    )
    assert train is not None
    batch = train.__getitems__(np.arange(100))
    starts = (batch["position_ids"] == 0).sum(axis=1)
    assert starts.max() <= 2


def served_pieces(batch) -> list[tuple[int, int, int]]:
    """(source, document, first position) of every piece of every row, checking that each row's
    pieces come from the source its dataset_id names."""
    out = []
    windows = windows_of(batch)
    ids = np.asarray(batch["dataset_id"])
    for r in range(windows.shape[0]):
        pieces = runs(windows[r])
        assert {src for src, *_ in pieces} == {int(ids[r]) + 1}
        out += [(src, doc, a) for src, doc, a, _, _ in pieces]
    return out


@ORDERS
def test_schedule_skip_and_mixture_change_at_a_resume_serve_no_piece_twice(tmp_path, order):
    a, _ = corpus(tmp_path, 1, 1200, seed=11)
    b, _ = corpus(tmp_path, 2, 1200, seed=12)
    change = {"mixture_change": "continue"} if order == "megatron" else {}
    schedule = [(0, [0.8, 0.2]), (48, [0.2, 0.8])]
    total = 200
    first_cfg = config(blend=["1", a, "1", b], order=order, weights_schedule=schedule, **change)
    first, _, _ = build_datasets(first_cfg, [total, 0, 0])
    loader = build_dataloader(first, micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=0)
    it = iter(loader)
    got = [next(it) for _ in range(20)]  # 80 samples, through the schedule's change at 48
    ids = np.concatenate([np.asarray(g["dataset_id"]) for g in got])
    assert (ids[:48] == 0).mean() > 0.7 and (ids[48:80] == 1).mean() > 0.7
    loader.skip(samples=8)
    skipped = served_pieces(first.__getitems__(np.arange(80, 88)))
    state = loader.state_dict()
    loader.close()
    # a resume under other weights, another micro-batch size and workers
    second_cfg = config(blend=["0.5", a, "0.5", b], order=order, **change)
    second, _, _ = build_datasets(second_cfg, [total, 0, 0])
    resumed = build_dataloader(second, micro_batch_size=8, dp_rank=0, dp_size=1, num_workers=2)
    resumed.load_state_dict(state)
    it = iter(resumed)
    got += [next(it) for _ in range(12)]  # 96 more samples
    resumed.close()
    pieces = [p for batch in got for p in served_pieces(batch)]
    assert len(pieces) == len(set(pieces)), "a piece served twice within its source's epoch"
    assert not set(skipped) & set(pieces), "a skipped sample was served"


@ORDERS
@pytest.mark.parametrize(
    ("cap", "workers", "mixture"),
    # cap 1: most rows padded; workers count them there; a Megatron-order blend that may change
    # at a resume (mixture_change="continue") is another dataset class (its rows were counted
    # as concatenated ones: no packing metrics, a resume's hint said packing='concat')
    [(None, 0, {}), (1, 0, {}), (None, 2, {}), (1, 2, {}), (None, 2, {"mixture_change": "continue"})],
)
def test_loader_metrics_count_documents_and_padding_of_the_rows_served(
    tmp_path, order, cap, workers, mixture
):
    a, _ = corpus(tmp_path, 1, 900, seed=13)
    b, _ = corpus(tmp_path, 2, 900, seed=14)
    if mixture and order == "megatron":
        mixture = {**mixture, "path_to_cache": str(tmp_path / "cache")}
    elif mixture:  # the computed order's blends always continue
        mixture = {}
    cfg = config(blend=["0.5", a, "0.5", b], order=order, max_documents_per_row=cap, **mixture)
    train, _, _ = build_datasets(cfg, [64, 0, 0])
    assert train is not None
    loader = build_dataloader(train, micro_batch_size=8, dp_rank=0, dp_size=1, num_workers=workers)
    batches = list(loader)
    loader.close()
    assert not any(k.startswith("_") for batch in batches for k in batch), "a private field"
    report = loader.metrics()["packing"]
    assert report is not None
    # the model: documents (pieces starting in an input slot) and empty label slots, counted
    # from the rows' own tokens
    per_row = [
        sum(first < S for *_, first in runs(windows_of(batch)[r]))
        for batch in batches
        for r in range(8)
    ]
    empty = sum(int((windows_of(batch)[:, 1:] == 0).sum()) for batch in batches)
    assert report["rows"] == 64
    assert report["documents"] == sum(per_row)
    assert report["padding_share"] == pytest.approx(empty / (64 * S))
    quantiles: tuple[tuple[int, Literal["p50", "p99"]], ...] = ((50, "p50"), (99, "p99"))
    for q, key in quantiles:
        want = int(np.percentile(per_row, q, method="inverted_cdf"))
        assert report["documents_per_row"][key] == want
    assert [s["name"] for s in report["sources"]] == [a, b]
    ids = np.concatenate([np.asarray(batch["dataset_id"]) for batch in batches])
    for s, source in enumerate(report["sources"]):
        assert source["rows"] == int((ids == s).sum())
        mine = [batch for batch in batches]
        real = sum(
            int((windows_of(batch)[np.asarray(batch["dataset_id"]) == s, 1:] != 0).sum())
            for batch in mine
        )
        assert source["tokens"] == real
    loader.close()


@ORDERS
def test_an_epoch_of_rows_is_the_plan_s_and_reading_it_is_no_repeat(tmp_path, order) -> None:
    prefix, _ = corpus(tmp_path, 1, 900, seed=13)
    train, _, _ = build_datasets(config(blend=[prefix], order=order), [None, None, None])
    assert train is not None
    rows = len(train)  # one epoch of rows, as planned
    assert train.epoch_sizes() == [rows]
    loader = build_dataloader(train, micro_batch_size=1, dp_rank=0, dp_size=1, num_workers=0)
    served = list(loader)
    report = loader.metrics()
    loader.close()
    assert len(served) == rows and report["repeating"] == []
    pieces = [piece[:4] for batch in served for piece in runs(windows_of(batch)[0])]
    assert len(pieces) == len(set(pieces))


@ORDERS
@pytest.mark.parametrize("workers", [0, 2])
def test_loader_metrics_of_packed_rows_continue_across_a_resume(tmp_path, order, workers) -> None:
    a, _ = corpus(tmp_path, 1, 900, seed=13)
    b, _ = corpus(tmp_path, 2, 900, seed=14)
    train, _, _ = build_datasets(config(blend=["0.5", a, "0.5", b], order=order), [96, 0, 0])
    assert train is not None
    kw = dict(micro_batch_size=8, dp_rank=0, dp_size=1, num_workers=workers)
    whole = build_dataloader(train, **kw)
    list(whole)
    want = whole.metrics()["packing"]
    whole.close()
    first = build_dataloader(train, **kw)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    first.close()
    resumed = build_dataloader(train, **kw)
    resumed.load_state_dict(state)
    list(resumed)
    got = resumed.metrics()["packing"]
    resumed.close()
    assert want is not None and got is not None and want["rows"] == 96
    assert got == want  # rows, documents, padding and each source's, as if never interrupted
    state["metrics"]["packing"]["rows"] = [1]  # a blend of two sources: counts of one
    with pytest.raises(StateError, match="packing rows"):
        build_dataloader(train, **kw).load_state_dict(state)


@ORDERS
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_killed_worker_is_replaced_and_the_packed_rows_are_the_fault_free_ones(
    tmp_path, order, method
) -> None:
    import os
    import signal

    a, _ = corpus(tmp_path, 1, 900, seed=15)
    b, _ = corpus(tmp_path, 2, 900, seed=16)
    train, _, _ = build_datasets(config(blend=["0.5", a, "0.5", b], order=order), [96, 0, 0])
    assert train is not None
    want = train.__getitems__(np.arange(96))["tokens"]
    loader = build_dataloader(
        train,
        micro_batch_size=4,
        dp_rank=0,
        dp_size=1,
        num_workers=2,
        multiprocessing_context=method,
    )
    try:
        it = iter(loader)
        got = [np.asarray(next(it)["tokens"]) for _ in range(3)]
        os.kill(loader.worker_processes[0].pid, signal.SIGKILL)
        got += [np.asarray(next(it)["tokens"]) for _ in range(21)]
        assert loader.metrics()["workers"]["restarts"] == 1
    finally:
        loader.close()
    np.testing.assert_array_equal(np.concatenate(got), want)


@pytest.mark.parametrize(
    "order, change", [("computed", None), ("megatron", "refuse"), ("megatron", "continue")]
)
def test_a_state_of_another_packing_does_not_resume(tmp_path, order, change):
    """Concatenated samples, packed rows and packed rows under another cap count different
    things: a state of one is refused by the others (with mixture_change="continue" too, which
    accepts other weights), and resumes into its own."""
    a, _ = corpus(tmp_path, 1, 400, seed=17)
    b, _ = corpus(tmp_path, 2, 400, seed=18)
    blend = ["0.5", a, "0.5", b]
    extra = {} if change is None else {"mixture_change": change}
    kinds = [{"packing": "concat"}, {}, {"max_documents_per_row": 2}]
    datasets = [
        build_datasets(config(blend=blend, order=order, **kind, **extra), [64, 0, 0])[0]
        for kind in kinds
    ]
    for i, saved in enumerate(datasets):
        loader = build_dataloader(saved, micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=0)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        want = next(it)["tokens"].numpy()
        for j, other in enumerate(datasets):
            resumed = build_dataloader(
                other, micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=0
            )
            if i == j:
                resumed.load_state_dict(state)
                np.testing.assert_array_equal(next(iter(resumed))["tokens"].numpy(), want)
            else:
                with pytest.raises(StateError):
                    resumed.load_state_dict(state)


@pytest.mark.parametrize("extra", [True, False])
@pytest.mark.parametrize("pad_id", [-1, 0, 5])
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"eod_mask_loss": True},
        {"inter_document_masking": True},
        {"create_attention_mask": True, "reset_attention_mask": True},
    ],
)
def test_rows_told_by_their_token_counts_give_the_fields_of_pad_filled_windows(
    extra, pad_id, fields
) -> None:
    """Packed rows keep the file's dtype and tell their padding by each row's token count; the
    item fields equal those of the same rows as int64 windows filled with the pad id (the rule
    for a padded window), tokens equal to the pad id inside documents included."""
    from tokenload.datasets.items import ItemConfig, build_items, document_bounds

    rng = np.random.default_rng(pad_id + 1 + 10 * extra)
    item = ItemConfig(sequence_length=S, add_extra_token=extra, eod_id=3, pad_id=pad_id, **fields)
    width = item.window
    row_tokens = rng.integers(1, width + 1, 12)
    row_tokens[:4] = width  # full rows beside short ones
    lengths: list[int] = []
    first: list[int] = []
    for n in row_tokens.tolist():
        first.append(len(lengths))
        cuts = np.sort(rng.choice(np.arange(1, n), size=min(3, n - 1), replace=False))
        lengths += np.diff(np.concatenate([[0], cuts, [n]])).tolist()
    compact = rng.integers(0, 8, (row_tokens.size, width)).astype(np.uint16)  # 3 = EOD, 5 = pad
    compact[np.arange(width)[None, :] >= row_tokens[:, None]] = 0
    padded = compact.astype(np.int64)
    padded[np.arange(width)[None, :] >= row_tokens[:, None]] = pad_id
    bounds = document_bounds(np.array(lengths), np.array(first), S, 0)
    want = build_items(padded, item, padded=True, bounds=bounds)
    got = build_items(compact, item, padded=True, bounds=bounds, row_tokens=row_tokens)
    # the packed read's own form: each row's pieces instead of the boundaries
    pieces = (np.array(first), np.array(lengths))
    fast = build_items(compact, item, padded=True, row_tokens=row_tokens, pieces=pieces)
    assert set(got) == set(want) == set(fast)
    # rows told by their pieces also keep Megatron's EOD rule with a reset attention mask
    # (test_reset_position_ids_and_attention_mask_keep_megatron_s_eod_rule); the boundaries
    # given here are the documents' only
    eod_rule = fields.get("reset_attention_mask", False)
    for key in want:
        assert got[key].dtype == want[key].dtype == fast[key].dtype, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        if not (eod_rule and key == "attention_mask"):
            np.testing.assert_array_equal(fast[key], want[key], err_msg=key)
    assert (got["loss_mask"][:4].sum(axis=1) > 0).all()  # the full rows keep their loss


def test_packed_row_bounds_equal_the_documents_rule() -> None:
    """The packed rows' boundaries (their pieces' starts, ``packed_rows.piece_starts``, made into
    boundaries by ``items.starts_bounds``) equal ``items.document_bounds`` without the extra
    token's rule, on rows of one to S + 1 one-token documents and full or short rows."""
    from tokenload.datasets.items import document_bounds, starts_bounds
    from tokenload.datasets.packed_rows import piece_starts

    rng = np.random.default_rng(3)
    for _ in range(200):
        lengths: list[int] = []
        first: list[int] = []
        for _row in range(int(rng.integers(1, 9))):
            first.append(len(lengths))
            n = int(rng.choice([W, S, int(rng.integers(1, W + 1))]))
            k = min(n, int(rng.choice([1, 2, n, int(rng.integers(1, n + 1))])))
            cuts: np.ndarray | list[int] = (
                np.sort(rng.choice(np.arange(1, n), size=k - 1, replace=False)) if k > 1 else []
            )
            lengths += np.diff(np.concatenate([[0], cuts, [n]])).astype(int).tolist()
        lengths_a, first_a = np.array(lengths), np.array(first)
        want = document_bounds(lengths_a, first_a, S, 0)
        got = starts_bounds(piece_starts(lengths_a, first_a), S)
        np.testing.assert_array_equal(got, want)


@ORDERS
@pytest.mark.parametrize("workers", [0, 2])
def test_a_blend_s_rows_keep_their_own_boundaries_through_the_loader(tmp_path, order, workers):
    """Rows of two sources in one micro-batch (the blend merges each source's rows), read by
    workers that read several micro-batches at once and cut them apart: each row's position ids
    restart exactly where its cu_seqlens say, at the first token of each of its documents."""
    a, _ = corpus(tmp_path, 1, 500, seed=21)
    b, _ = corpus(tmp_path, 2, 500, seed=22)
    cfg = config(blend=["0.5", a, "0.5", b], order=order, inter_document_masking=True, eod_id=1)
    train, _, _ = build_datasets(cfg, [96, 0, 0])
    assert train is not None
    loader = build_dataloader(train, micro_batch_size=8, num_workers=workers)
    mixed = 0
    for batch in loader:
        ids = np.asarray(batch["dataset_id"])
        mixed += len(set(ids.tolist())) > 1
        source, doc, pos = unname(np.asarray(batch["tokens"]))
        positions, cu = np.asarray(batch["position_ids"]), np.asarray(batch["cu_seqlens"])
        real = np.asarray(batch["loss_mask"]) > 0
        for r in range(ids.size):
            starts = [0] + [
                i
                for i in range(1, S)
                if (doc[r, i], source[r, i]) != (doc[r, i - 1], source[r, i - 1])
                or pos[r, i] != pos[r, i - 1] + 1
            ]
            starts = [i for i in starts if i == 0 or real[r, i - 1]]  # padding starts nothing
            assert np.flatnonzero(positions[r] == 0).tolist() == starts
            assert sorted({int(c) for c in cu[r] if 0 < c < S}) == starts[1:]
            assert (source[r][real[r]] == ids[r] + 1).all()  # one source per row
    loader.close()
    assert mixed  # the micro-batches did mix the sources


def test_rows_read_together_in_any_order_equal_rows_read_one_by_one(tmp_path) -> None:
    """The computed order's rows gathered in one read across many blocks, in a shuffled order with
    repeats (the path that packs, forgets and packs again the blocks it keeps only a few of), are
    the rows read one at a time by a fresh dataset."""
    from tokenload.datasets.computed.packed import ComputedPackedDataset

    prefix, _ = corpus(tmp_path, 1, 900, seed=21)
    train, _, _ = build_datasets(config(blend=[prefix]), [100, 0, 0])
    assert isinstance(train, ComputedPackedDataset)

    def small_blocks() -> ComputedPackedDataset:  # blocks of 64 documents: ~15 of them
        return ComputedPackedDataset(
            train.source, train.extent, train.item, seed=7, length=None, block_documents=64
        )

    together, alone = small_blocks(), small_blocks()
    assert together.rows.num_blocks >= 10
    shuffled = np.random.default_rng(3).permutation(len(together))[:120]
    shuffled = np.concatenate([shuffled, shuffled[:7]])  # repeats too
    consecutive = np.arange(5, 35)  # one slice of the block's pieces
    for rows in (shuffled, consecutive, consecutive[::-1]):
        got = together.read_batch(rows)
        for i, row in enumerate(rows.tolist()):
            one = alone.read_batch([row])
            assert int(got["row_tokens"][i]) == int(one["row_tokens"][0])
            n = int(one["row_tokens"][0])
            assert np.array_equal(got["windows"][i, :n], one["windows"][0, :n])
            mine, single = row_pieces(got, i), row_pieces(one, 0)
            assert np.array_equal(mine, single)


def row_pieces(read: dict, row: int) -> np.ndarray:
    """The token counts of a read's row's pieces (``read_batch``'s ``piece_first`` and
    ``piece_length``)."""
    first, length = read["piece_first"], read["piece_length"]
    end = first[row + 1] if row + 1 < first.size else length.size
    return np.asarray(length[first[row] : end])


@ORDERS
@pytest.mark.parametrize("sources", [1, 2])
def test_a_grouped_read_cut_by_rows_gives_each_micro_batch_its_own_read(
    tmp_path, order, sources
) -> None:
    """A worker reads several micro-batches in one ``read_batch`` and cuts the result by rows
    (``worker_main._split_rows``): each part, pieces included (they are not a row per sample),
    equals the micro-batch read alone, an empty one too; on a blend the merged pieces too."""
    from tokenload.loader.worker_main import _split_rows

    a, _ = corpus(tmp_path, 1, 400, seed=31)
    b, _ = corpus(tmp_path, 2, 400, seed=32)
    blend = [a] if sources == 1 else ["0.5", a, "0.5", b]
    train, _, _ = build_datasets(config(blend=blend, order=order), [80, 0, 0])
    assert train is not None
    lists = [list(range(0, 8)), [], list(range(40, 45)), list(range(8, 16)), [3, 1, 2]]
    raw = train.read_batch([i for idx in lists for i in idx])
    parts = _split_rows(raw, [len(idx) for idx in lists])
    for idx, part in zip(lists, parts):
        one = train.read_batch(idx)
        assert set(part) == set(one)
        for key in set(one) - {"padded"}:  # (a part keeps its read's flag: True is safe)
            # the plan's layout of the pieces (computed order) is cut with them too
            np.testing.assert_array_equal(part[key], one[key], err_msg=key)
        finished, alone = train.finish_batch(part), train.finish_batch(one)
        for key in alone:
            np.testing.assert_array_equal(finished[key], alone[key], err_msg=key)


@pytest.mark.parametrize("extra", [True, False])
@pytest.mark.parametrize("sources", [1, 2])
@ORDERS
def test_the_plan_s_layout_gives_the_fields_and_counts_worked_out_from_the_pieces(
    tmp_path, extra, sources, order
) -> None:
    """A packed read carries each row's documents (``ROW_COUNTS``) and, on the computed order,
    each piece's slot and input positions (``packed_rows.piece_layout``, laid once per block by
    the plan); the Megatron order's position ids are counted from the pieces' lengths over the
    windows laid end to end (``items._window_positions``). Every way gives the position ids and
    packing counts worked out from the pieces alone, and the position ids of each row's pieces
    laid one by one (short rows, a last piece on the label-only slot, a blend's merged rows, rows
    from two blocks)."""
    from tokenload.contract import PIECE_FIRST, PIECE_INPUTS, PIECE_LENGTH, PIECE_SLOT, ROW_COUNTS
    from tokenload.datasets import items
    from tokenload.loader.collate import PACKING_COUNTS, finish

    a, _ = corpus(tmp_path, 1, 400, seed=31)
    b, _ = corpus(tmp_path, 2, 400, seed=32)
    blend = [a] if sources == 1 else ["0.5", a, "0.5", b]
    cfg = config(blend=blend, add_extra_token=extra, inter_document_masking=True, order=order,
                 path_to_cache=str(tmp_path / "cache") if order == "megatron" else None)
    train, _, _ = build_datasets(cfg, [150, 0, 0])
    assert train is not None
    seq = cfg.sequence_length
    short = laid = 0
    for idx in (list(range(0, 16)), list(range(16, 150)), [149, 3, 77, 3]):
        raw = train.read_batch(idx)
        assert ROW_COUNTS in raw
        laid += PIECE_SLOT in raw
        bare = {k: v for k, v in raw.items() if k not in (PIECE_SLOT, PIECE_INPUTS, ROW_COUNTS)}
        got, want = finish(train, raw), finish(train, bare)
        assert set(got) == set(want) and PACKING_COUNTS in got
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        first, length = raw[PIECE_FIRST], raw[PIECE_LENGTH]
        tokens = raw["row_tokens"]
        short += int(np.count_nonzero(tokens < seq + int(extra)))
        by_layout = np.empty((len(idx), seq), dtype=np.int64)  # piece_layout of the pieces
        offsets = np.append(first, length.size)
        layout = items.piece_layout(offsets, length, seq, documents=False)
        items._lay_positions(layout.slot, layout.inputs, by_layout)
        by_windows = np.empty_like(by_layout)
        items._piece_positions(first, length, by_windows, (tokens, seq + int(extra), True))
        one_by_one = np.empty_like(by_layout)
        for row in range(len(idx)):
            slot = 0
            for n in row_pieces(raw, row).tolist():  # each piece counts on to the row's end
                one_by_one[row, slot:] = np.arange(max(0, seq - slot))
                slot += n
        for positions in (by_layout, by_windows, got["position_ids"]):
            np.testing.assert_array_equal(positions, one_by_one)
    assert laid == (3 if order == "computed" else 0)
    assert short or not extra  # the padding of short rows goes on counting their last piece


@pytest.mark.parametrize("seq", [1, 7, 2048, 65535, 65536, 70000])
@pytest.mark.parametrize("extra", [0, 1])
def test_window_positions_count_each_piece_from_its_first_slot(seq, extra) -> None:
    """``items._window_positions`` (2-byte wrapping counts up to W = 65,536, 4-byte past it)
    equals each row's pieces laid one by one, on random rows: full and short ones (the padding
    counts on the last piece), a last piece on the label-only slot, one piece filling the row."""
    from tokenload.datasets import items

    rng = np.random.default_rng(seq * 2 + extra)
    width = seq + extra
    rows: list[list[int]] = []
    for kind in range(12):
        held = width if kind % 3 else int(rng.integers(1, width + 1))  # a third may be short
        cuts = np.sort(rng.choice(np.arange(1, held), size=min(held - 1, kind), replace=False))
        sizes = np.diff(np.concatenate(([0], cuts, [held]))).tolist()
        if kind == 5 and extra and seq > 1:  # a last piece of one token on the label slot S
            sizes = [seq, 1]
        rows.append(sizes)
    first = np.cumsum([0] + [len(r) for r in rows[:-1]]).astype(np.int64)
    length = np.array([n for r in rows for n in r], dtype=np.int64)
    tokens = np.array([sum(r) for r in rows], dtype=np.int64)
    got = np.empty((len(rows), seq), dtype=np.int64)
    items._window_positions(first, length, tokens, width, True, got)
    want = np.empty_like(got)
    for i, sizes in enumerate(rows):
        slot = 0
        for n in sizes:
            want[i, slot:] = np.arange(max(0, seq - slot))
            slot += n
    np.testing.assert_array_equal(got, want)


def test_a_state_saved_without_packing_counts_starts_them_from_zero(tmp_path) -> None:
    """A state saved before the packing counts were kept (its ``packing`` None), loaded into a
    loader that has counted batches already: every counter restarts from zero, the packing
    counts with them, and counts the batches served after it."""
    prefix, _ = corpus(tmp_path, 1, 900, seed=13)
    train, _, _ = build_datasets(config(blend=[prefix]), [200, 0, 0])
    assert train is not None
    state = build_dataloader(train, micro_batch_size=2, num_workers=0).state_dict()
    state["metrics"]["packing"] = None  # as an older version saved it
    loader = build_dataloader(train, micro_batch_size=2, num_workers=0)

    def packing():
        counts = loader.metrics()["packing"]
        assert counts is not None
        return counts

    it = iter(loader)
    for _ in range(30):
        next(it)
    assert packing()["rows"] == 60
    loader.load_state_dict(state)
    assert loader.metrics()["samples"] == 0 and packing()["rows"] == packing()["documents"] == 0
    it = iter(loader)
    for _ in range(5):
        next(it)
    assert packing()["rows"] == 10


def test_the_packing_counts_kept_for_metrics_do_not_hold_the_workers_ring_slots(tmp_path) -> None:
    """The loader keeps each packed batch's counts until it adds them up (every 256 batches): it
    keeps copies, so a batch the training loop has dropped gives its worker's ring slot back."""
    prefix, _ = corpus(tmp_path, 1, 900, seed=41)
    train, _, _ = build_datasets(config(blend=[prefix]), [400, 0, 0])
    assert train is not None
    loader = build_dataloader(train, micro_batch_size=4, num_workers=2)
    try:
        for seen, batch in enumerate(loader, start=1):
            del batch
            if seen == 40:
                break
        assert loader._pool is not None
        loader._pool._reclaim()
        lent = sum(len(slots) for slots in loader._pool._lent)
        assert lent <= 2, lent  # the slot of the batch just taken, at most
        packing = loader.metrics()["packing"]
        assert packing is not None and packing["rows"] == 40 * 4
    finally:
        loader.close()


def test_a_dropped_packed_batch_gives_its_ring_slot_back_at_the_next_step(tmp_path) -> None:
    """The loader takes each packed batch's counts out of it (a view of the worker's ring slot)
    and does not hold them past the step: once the training loop drops a batch, the next
    ``next()`` frees its slot, as for concatenated batches (held one step longer, every slot
    was lent twice as long, and a worker's free slots bound how many micro-batches it reads at
    once)."""
    prefix, _ = corpus(tmp_path, 1, 900, seed=41)
    train, _, _ = build_datasets(config(blend=[prefix]), [400, 0, 0])
    assert train is not None
    loader = build_dataloader(train, micro_batch_size=4, num_workers=2)
    try:
        it = iter(loader)
        batch = next(it)
        del batch
        pool = loader._pool
        assert pool is not None
        lent_after: list[int] = []
        reclaim = pool._reclaim

        def counted() -> None:
            reclaim()
            lent_after.append(sum(len(w.now.lent) for w in pool._workers))

        pool._reclaim = counted  # type: ignore[method-assign]
        for _ in range(40):
            batch = next(it)
            del batch
        assert len(lent_after) >= 20
        assert max(lent_after) <= 1, lent_after  # a batch made but not yet taken, at most
    finally:
        loader.close()


@pytest.mark.parametrize("short_rows", [[], [0], [5], [7], [0, 1], [2, 3, 6], list(range(8))])
def test_a_read_lays_full_and_short_rows_in_their_windows(short_rows) -> None:
    """``packed_rows.read_rows`` lays each row's pieces from its slot 0 and zeroes the slots
    past its tokens, short rows anywhere among full ones (first, last, side by side, all)."""
    from tokenload.datasets.items import ItemConfig
    from tokenload.datasets.packed_rows import read_rows

    class Tokens:  # sequence i holds 1000 * i + position
        def read_pieces(self, sequences, offsets, lengths, dtype=None):
            return np.concatenate(
                [1000 * s + np.arange(o, o + n) for s, o, n in zip(sequences, offsets, lengths)]
            ).astype(np.int32)

    rng = np.random.default_rng(len(short_rows))
    item = ItemConfig(sequence_length=S, add_extra_token=True, eod_id=0, pad_id=-1)
    width = item.window
    first: list[int] = []
    sequence: list[int] = []
    start: list[int] = []
    length: list[int] = []
    want = np.zeros((8, width), np.int32)
    for row in range(8):
        held = int(rng.integers(1, width)) if row in short_rows else width
        first.append(len(length))
        cuts = np.sort(rng.choice(np.arange(1, held), size=min(2, held - 1), replace=False))
        at = 0
        for n in np.diff(np.concatenate([[0], cuts, [held]])).tolist():
            s, o = int(rng.integers(1, 50)), int(rng.integers(0, 100))
            sequence.append(s)
            start.append(o)
            length.append(n)
            want[row, at : at + n] = 1000 * s + np.arange(o, o + n)
            at += n
    arrays = [np.array(v, dtype=np.int64) for v in (first, sequence, start, length)]
    got = read_rows(Tokens(), item, *arrays)  # type: ignore[arg-type]
    np.testing.assert_array_equal(got.windows, want)
    assert got.row_tokens.tolist() == [int((want[r] != 0).sum()) for r in range(8)]
