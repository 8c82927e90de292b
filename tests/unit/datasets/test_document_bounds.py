"""``items.document_bounds`` and ``build_items(bounds=)`` against a line-by-line model of
megatron-core 0.19.2's ``GPTDataset.__getitem__`` (inter_document_masking), on random pieces;
the computed and NeoX orders take the same boundaries from their pieces."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.datasets.items import ItemConfig, build_items, document_bounds
from tokenload.errors import ConfigError

EOD = 999


def megatron_cu(parts: list[int], seq: int, extra: int) -> list[int]:
    """megatron-core's steps: document_lengths; the extra token off the last (popped when it
    empties); the shortfall into the last (or appended); cumsum from 0; padded to S + 1 with S."""
    lengths = list(parts)
    if extra:
        lengths[-1] -= 1
        if lengths[-1] == 0:
            lengths.pop()
    shortfall = seq - sum(lengths)
    if shortfall > 0:
        if lengths:
            lengths[-1] += shortfall
        else:
            lengths.append(shortfall)
    cu = np.cumsum([0, *lengths]).tolist()
    if len(cu) > seq + 1:
        raise OverflowError("megatron-core fails: the boundaries do not fit S + 1 entries")
    return cu + [seq] * (seq + 1 - len(cu))


def megatron_positions(cu: list[int], seq: int) -> list[int]:
    positions = list(range(seq))
    for i in range(1, len(cu)):
        start, end = cu[i - 1], cu[i]
        positions[start:end] = range(end - start)
    return positions


@st.composite
def samples(draw):
    seq = draw(st.integers(1, 12))
    extra = draw(st.integers(0, 1))
    rows = []
    for _ in range(draw(st.integers(1, 5))):
        drawn = draw(st.lists(st.integers(0, 5), min_size=1, max_size=seq + 4))
        parts = [n for n, end in zip(drawn, np.cumsum(drawn)) if end <= seq + extra]
        while parts and not parts[-1]:  # a sample ends inside a document
            parts.pop()
        rows.append(parts or [1])  # (a short one is padded)
    return seq, extra, rows


@settings(max_examples=300, deadline=None)
@given(samples())
# more parts than S - 1 boundaries hold, whose last loses the extra token: the empty ones go first
@example((2, 1, [[0, 1, 0, 1]]))
def test_bounds_and_positions_follow_megatron_cores_steps(case):
    seq, extra, rows = case
    lengths = np.array([n for parts in rows for n in parts], dtype=np.int64)
    first = np.cumsum([0] + [len(p) for p in rows[:-1]])
    bounds = document_bounds(lengths, first, seq, extra)
    assert bounds.dtype == np.int32 and bounds.shape == (len(rows), seq + 1)
    text = np.zeros((len(rows), seq + extra), dtype=np.int64)
    cfg = ItemConfig(
        sequence_length=seq, add_extra_token=bool(extra), eod_id=EOD, inter_document_masking=True
    )
    items = build_items(text, cfg, bounds=bounds)
    for r, parts in enumerate(rows):
        try:
            want = megatron_cu(parts, seq, extra)
        except OverflowError:  # more than S parts: the empty ones' repeats are left out
            want = megatron_cu([n for n in parts[:-1] if n] + parts[-1:], seq, extra)
        assert bounds[r].tolist() == want
        assert items["cu_seqlens"][r].tolist() == want
        assert items["max_seqlen"][r] == max(np.diff(want).max(), 0)
        assert items["position_ids"][r].tolist() == megatron_positions(want, seq)


def test_bounds_decide_positions_and_the_mask_not_eods():
    """Given boundaries, EOD tokens decide only the loss mask; packed rows reset positions even
    without inter_document_masking (no cu_seqlens then)."""
    text = np.array([[1, EOD, 3, 4, 5, 6, 7]])
    bounds = np.array([[0, 4, 6, 6, 6, 6, 6]], dtype=np.int32)
    cfg = ItemConfig(
        sequence_length=6,
        eod_id=EOD,
        eod_mask_loss=True,
        create_attention_mask=True,
        reset_attention_mask=True,
    )
    out = build_items(text, cfg, bounds=bounds)
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1]]
    assert out["loss_mask"].tolist() == [[1, 0, 1, 1, 1, 1]]
    assert "cu_seqlens" not in out
    visible = ~out["attention_mask"][0, 0]
    assert visible[3, 0] and not visible[4, 3] and visible[5, 4]
    # no boundaries: the EOD rule, unchanged
    plain = build_items(text, ItemConfig(sequence_length=6, eod_id=EOD, reset_position_ids=True))
    assert plain["position_ids"].tolist() == [[0, 1, 0, 1, 2, 3]]


@pytest.fixture(scope="module")
def no_eod(tmp_path_factory):
    """Documents without EOD, some empty, of 0-40 tokens."""
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, EOD, size=int(n)) for n in rng.integers(0, 40, size=200)]
    return write_documents(tmp_path_factory.mktemp("no_eod") / "docs", docs)


@pytest.mark.parametrize("order", ["computed", "neox"])
def test_other_orders_take_boundaries_from_their_pieces(no_eod, order):
    cfg = MegatronDataConfig(
        sequence_length=32,
        blend=[no_eod],
        split="100,0,0",
        eod_id=EOD,
        order=order,
        inter_document_masking=True,
    )
    train = build_datasets(cfg, [50, 0, 0])[0]
    idx = np.arange(min(len(train), 40))
    got = train.__getitems__(idx)
    if order == "computed":
        _, first, lengths, _ = train.documents(idx)
    else:  # NeoX's datasets read Megatron's way: the same pieces
        first, lengths = _megatron_pieces(train, idx)
    ends = np.append(first[1:], lengths.size)
    for r, (a, b) in enumerate(zip(first, ends)):
        want = megatron_cu(lengths[a:b].tolist(), 32, 1)
        assert got["cu_seqlens"][r].tolist() == want
        assert got["position_ids"][r].tolist() == megatron_positions(want, 32)
    assert (got["cu_seqlens"][:, 1] < 32).any()  # documents end inside samples, with no EOD


def _megatron_pieces(ds, idx):
    from tokenload.datasets.neox.neox_indices import neox_item_position

    arrays = ds._arrays()
    samples = arrays["shuffle_index"][neox_item_position(idx, ds.num_built)]
    _, first, lengths, _, _ = ds._pieces(arrays, samples)
    return first, lengths


def test_boundaries_need_no_eod_id(no_eod, tmp_path):
    """The documents' lengths make the boundaries: a tokenizer without an EOD id is enough;
    only a caller without boundaries needs one (the EOD rule)."""
    cfg = MegatronDataConfig(
        sequence_length=32,
        blend=[no_eod],
        split="100,0,0",
        inter_document_masking=True,
        path_to_cache=str(tmp_path),
    )
    train = build_datasets(cfg, [None, 0, 0])[0]
    assert (train.__getitems__(np.arange(10))["cu_seqlens"][:, 1] < 32).any()
    with pytest.raises(ConfigError, match="eod_id"):
        build_items(
            np.zeros((1, 5), np.int64), ItemConfig(sequence_length=4, inter_document_masking=True)
        )
