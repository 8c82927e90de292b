"""Items read through tokenload's datasets equal megatron-core 0.19.2's items, given the same
index arrays (tests/fixtures/megatron/order: tokens, labels, loss_mask, position_ids and the
attention mask, for GPT and blended splits of every case that ran).

One deliberate difference: when no EOD/reset option is set, Megatron caches the loss mask across
items and then zeroes padded positions *in the cached array*, so after one padded (short last)
sample every later item read by that process loses its loss at those positions. tokenload's loss
mask is a pure function of the sample; the test accepts Megatron's extra zeros only in that case
and checks that ours are exactly the padded label positions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from support import FIXTURES, megatron_config
from tokenload.datasets.megatron.blended import BlendedDataset
from tokenload.datasets.megatron.gpt_dataset import GPTDataset, IndexArrays
from tokenload.format import TokenFile

ORDER = FIXTURES / "megatron" / "order"
META = json.loads((ORDER / "cases.json").read_text())
ARRAYS = np.load(ORDER / "cases.npz")
TOK = META["tokenizer"]
SPLITS = [
    (case, split)
    for case in META["cases"]
    if case["outcome"] == "ok"
    for split, rec in case["splits"].items()
    if rec is not None and rec.get("item_index")
]


def _gpt(case, rec, key):
    cfg = case["config"]
    arrays = {a: ARRAYS[f"{key}/{a}"] for a in ("document_index", "sample_index", "shuffle_index")}
    item = megatron_config(cfg, META["tokenizer"], create_attention_mask=True).item_config()
    return GPTDataset(TokenFile(ORDER / rec["dataset_path"]), IndexArrays(arrays), item, identity=rec["hash"])


@pytest.mark.parametrize("case,split", SPLITS, ids=[f"{c['id']}-{s}" for c, s in SPLITS])
def test_items_equal_megatron(case, split):
    rec = case["splits"][split]
    key = f"{case['id']}/{split}"
    if rec["class"] == "BlendedDataset":
        members = [_gpt(case, m, f"{key}/d{j}") for j, m in enumerate(rec["datasets"])]
        idx = IndexArrays({a: ARRAYS[f"{key}/{a}"] for a in ("dataset_index", "dataset_sample_index")})
        ds = BlendedDataset(members, idx, identity=rec["hash"])
    else:
        ds = _gpt(case, rec, key)
    assert len(ds) == rec["len"]
    got = ds.__getitems__(rec["item_index"])
    for field in ("tokens", "labels", "position_ids", "attention_mask"):
        np.testing.assert_array_equal(got[field], ARRAYS[f"{key}/item_{field}"], err_msg=field)
    theirs = ARRAYS[f"{key}/item_loss_mask"]
    cfg = case["config"]
    cacheable = not (cfg["eod_mask_loss"] or cfg["reset_position_ids"] or cfg["reset_attention_mask"])
    if cacheable:
        assert np.all((got["loss_mask"] == theirs) | ((got["loss_mask"] == 1) & (theirs == 0)))
        padded = _padded_label_positions(ds, rec["item_index"])
        np.testing.assert_array_equal(got["loss_mask"] == 0, padded)
    else:
        np.testing.assert_array_equal(got["loss_mask"], theirs)
    if rec["class"] == "BlendedDataset":
        assert got["dataset_id"].tolist() == ARRAYS[f"{key}/item_dataset_id"].tolist()
    # one at a time gives the same as the batch
    single = ds[rec["item_index"][-1]]
    np.testing.assert_array_equal(single["tokens"], ARRAYS[f"{key}/item_tokens"][-1])


def _padded_label_positions(ds, indices):
    """Where the label is padding, from the raw windows (pad id -1 before replacement)."""
    if isinstance(ds, BlendedDataset):
        which = ds.dataset_index[indices].astype(int)
        within = ds.dataset_sample_index[indices].astype(int)
        return np.stack([_padded_label_positions(ds.datasets[d], [i])[0] for d, i in zip(which, within)])
    windows = ds.windows(indices)
    if ds.item.add_extra_token:
        return windows[:, 1:] == -1
    labels = np.roll(windows, -1, axis=1)
    labels[:, -1] = -1
    return labels == -1


def test_enough_cases():
    assert len(SPLITS) >= 100


@pytest.mark.parametrize("dtype", [np.uint32, np.int64, np.uint64, np.int32])
def test_index_dtypes_give_the_same_items(dtype):
    """Megatron writes uint32 or int64 shuffle indices and int32 or int64 sample indices; arrays
    handed over in memory may be of any integer type (uint64 + int64 promotes to float64 in
    NumPy, which once broke the sample-index lookup)."""
    case, split = next((c, s) for c, s in SPLITS if c["splits"][s]["class"] == "GPTDataset")
    rec, key = case["splits"][split], f"{case['id']}/{split}"
    base = _gpt(case, rec, key)
    arrays = {a: ARRAYS[f"{key}/{a}"] for a in ("document_index", "sample_index", "shuffle_index")}
    arrays["shuffle_index"] = arrays["shuffle_index"].astype(dtype)
    arrays["sample_index"] = arrays["sample_index"].astype(np.int64 if dtype in (np.uint64, np.int64) else np.int32)
    other = GPTDataset(base.source, IndexArrays(arrays), base.item, identity=rec["hash"])
    indices = np.arange(len(base))
    got, want = other.__getitems__(indices), base.__getitems__(indices)
    for field in want:
        np.testing.assert_array_equal(got[field], want[field], err_msg=field)
