"""Item fields built from token windows: EOD handling, position resets, cu_seqlens, padding."""

from __future__ import annotations

import numpy as np
import pytest

from tokenload.datasets.items import ItemConfig, build_items
from tokenload.errors import ConfigError

EOD = 9


def _items(window, **options):
    cfg = ItemConfig(sequence_length=len(window[0]) - 1, eod_id=EOD, **options)
    return build_items(np.asarray(window, dtype=np.int64), cfg)


def test_plain_fields():
    out = _items([[1, 2, EOD, 4, 5, 6]])
    assert out["tokens"].tolist() == [[1, 2, EOD, 4, 5]]
    assert out["labels"].tolist() == [[2, EOD, 4, 5, 6]]
    assert out["loss_mask"].tolist() == [[1, 1, 1, 1, 1]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 4]]
    assert set(out) == {"tokens", "labels", "loss_mask", "position_ids"}  # no S x S mask by default


def test_eod_mask_and_position_reset():
    out = _items([[1, EOD, 3, 4, EOD, 6, 7]], eod_mask_loss=True, reset_position_ids=True)
    assert out["loss_mask"].tolist() == [[1, 0, 1, 1, 0, 1]]
    assert out["position_ids"].tolist() == [[0, 1, 0, 1, 2, 0]]


def test_attention_mask_blocks_across_documents_when_reset():
    out = _items([[1, EOD, 3, 4, 5]], create_attention_mask=True, reset_attention_mask=True)
    mask = out["attention_mask"][0, 0]  # True = masked
    assert mask.shape == (4, 4)
    assert not mask[1, 0] and mask[2, 1] and mask[2, 0] and not mask[3, 2] and mask[0, 1]
    plain = _items([[1, EOD, 3, 4, 5]], create_attention_mask=True)["attention_mask"][0, 0]
    assert np.array_equal(plain, ~np.tril(np.ones((4, 4), dtype=bool)))


def test_cu_seqlens_follow_eods():
    out = _items([[1, 2, EOD, 4, EOD, 6, 7, 8, 0]], inter_document_masking=True)
    cu, max_len = out["cu_seqlens"][0], out["max_seqlen"][0]
    assert cu.dtype == np.int32 and cu.shape == (9,)
    assert cu.tolist() == [0, 3, 5, 8, 8, 8, 8, 8, 8]  # padded to S + 1 with S
    assert max_len == 3
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert "attention_mask" not in out
    eod_last = _items([[1, 2, EOD, 4, EOD]], inter_document_masking=True)["cu_seqlens"][0]
    assert eod_last.tolist() == [0, 3, 4, 4, 4]  # an EOD at the end closes the last segment once


def test_padding_is_masked_and_zeroed():
    out = _items([[1, 2, 3, -1, -1]])
    assert out["tokens"].tolist() == [[1, 2, 3, 0]]
    assert out["labels"].tolist() == [[2, 3, 0, 0]]
    assert out["loss_mask"].tolist() == [[1, 1, 0, 0]]


def test_without_extra_token_the_last_label_is_padding():
    cfg = ItemConfig(sequence_length=4, add_extra_token=False, eod_id=EOD)
    out = build_items(np.array([[1, 2, 3, 4]], dtype=np.int64), cfg)
    assert out["tokens"].tolist() == [[1, 2, 3, 4]]
    assert out["labels"].tolist() == [[2, 3, 4, 0]]
    assert out["loss_mask"].tolist() == [[1, 1, 1, 0]]


def test_eod_options_need_an_eod_id():
    with pytest.raises(ConfigError, match="eod_id"):
        ItemConfig(sequence_length=4, reset_position_ids=True)


@pytest.mark.parametrize("pad_id", [0, 7, -1])
@pytest.mark.parametrize("dtype", [np.uint16, np.int64])
def test_fields_match_megatrons_steps_and_are_independent_arrays(pad_id, dtype):
    """A pad id the tokenizer has (>= 0) is zeroed wherever it occurs in the windows, its labels
    lose their loss after the EOD mask is taken from the inputs (Megatron's order); every field
    is its own contiguous, writable array of its dtype, sharing memory with no other."""
    rng = np.random.default_rng(pad_id + 10)
    window = rng.integers(0, 12, size=(5, 33)).astype(dtype)
    cfg = ItemConfig(sequence_length=32, eod_id=EOD, pad_id=pad_id, eod_mask_loss=True)
    out = build_items(window, cfg, padded=False)
    wide = window.astype(np.int64)
    tokens, labels = wide[:, :-1].copy(), wide[:, 1:].copy()
    loss_mask = np.where(tokens == EOD, 0.0, 1.0)
    if pad_id >= 0:
        loss_mask[labels == pad_id] = 0.0
        tokens[tokens == pad_id] = 0
        labels[labels == pad_id] = 0
    np.testing.assert_array_equal(out["tokens"], tokens)
    np.testing.assert_array_equal(out["labels"], labels)
    np.testing.assert_array_equal(out["loss_mask"], loss_mask)
    np.testing.assert_array_equal(out["position_ids"], np.broadcast_to(np.arange(32), (5, 32)))
    wanted = {"tokens": "int64", "labels": "int64", "loss_mask": "float32", "position_ids": "int64"}
    assert {k: v.dtype.name for k, v in out.items()} == wanted
    assert all(v.flags.c_contiguous and v.flags.writeable for v in out.values())
    fields = list(out.values())
    assert not any(np.shares_memory(a, b) for i, a in enumerate(fields) for b in fields[i + 1 :])
    assert not any(np.shares_memory(a, window) for a in fields)


def test_position_ids_restart_at_every_boundary_whatever_their_layout():
    """Position ids from document boundaries: each position counts from the largest boundary at
    or before it (boundaries of S and past are ends, negative ones are ignored), on the usual
    layout (rising from 0, inner ones first: the fast path), on rows with more inner boundaries
    than the fast path looks at, and on unsorted ones."""
    import numpy as np

    from tokenload.datasets.items import ItemConfig, build_items

    rng = np.random.default_rng(0)
    for seq in (8, 31, 32, 33, 100):
        cfg = ItemConfig(sequence_length=seq)
        for case in range(60):
            batch = int(rng.integers(1, 6))
            bounds = np.full((batch, seq + 1), seq, dtype=np.int32)
            bounds[:, 0] = 0
            for r in range(batch):
                k = int(rng.integers(0, seq))
                inner = np.sort(rng.integers(0, seq + 2, k))
                if case % 3 == 1:
                    inner = rng.permutation(inner)  # unsorted
                if case % 5 == 2 and k:
                    inner[0] = -3
                bounds[r, 1 : k + 1] = inner
            want = np.empty((batch, seq), dtype=np.int64)
            for r in range(batch):
                starts = [int(b) for b in bounds[r] if 0 <= b < seq]
                for p in range(seq):
                    want[r, p] = p - max(b for b in starts if b <= p)
            text = rng.integers(0, 50, (batch, seq + 1))
            got = build_items(text, cfg, padded=False, bounds=bounds)["position_ids"]
            np.testing.assert_array_equal(got, want, err_msg=f"S={seq} case {case}")
