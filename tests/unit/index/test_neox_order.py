"""tokenload's GPT-NeoX order against the arrays GPT-NeoX's own data code built.

The fixtures (tests/fixtures/neox/, written by make_fixtures.py from NeoX's megatron/data) hold,
per case, NeoX's doc/sample/shuffle indices of every GPT2Dataset, the BlendableDataset indices,
the weights and per-dataset sample counts it used, the cache file names it wrote, and items it
served (including indices past a dataset's length, which take NeoX's IndexError fallback).
Each is rebuilt here from the recorded inputs through tokenload.datasets.neox.neox_indices and compared exactly,
dtype included; items are rebuilt from the arrays and the token formula of the fixture files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenload.datasets.neox.neox_indices import (
    NeoXIndices,
    build_neox_blending_indices,
    build_neox_gpt_indices,
    neox_blend_num_samples,
    neox_index_file_names,
    neox_item_position,
    neox_sample_index_dtype,
    neox_split_boundaries,
    neox_split_ranges,
    neox_weights_by_num_docs,
)
from tokenload.errors import ConfigError
from tokenload.index.gpt import GPTIndexConfig, build_gpt_indices

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "neox"
SPLITS = ("train", "valid", "test")
DATA = json.loads((FIXTURES / "cases.json").read_text())
ARRAYS = np.load(FIXTURES / "cases.npz")
CASES = {c["id"]: c for c in DATA["cases"]}
LENGTHS = {
    k: np.array(v["sequence_lengths"], dtype=np.int32) for k, v in DATA["data_files"].items()
}


def by_kind(kind: str, outcome: str = "ok") -> list[str]:
    return [cid for cid, c in CASES.items() if c["kind"] == kind and c["outcome"] == outcome]


def tokens_of(seq: int, lengths: np.ndarray) -> np.ndarray:
    """The fixture files' tokens: token j of sequence i is (i * 131 + j * 7) % 50000."""
    return (seq * 131 + np.arange(int(lengths[seq])) * 7) % 50000


def item_text(ix: NeoXIndices, lengths: np.ndarray, index: int, seq_length: int) -> np.ndarray:
    """What NeoX's GPT2Dataset[index] returns as "text", computed from tokenload's arrays."""
    j = int(ix.shuffle_index[int(neox_item_position(index, ix.num_built))])
    (b, bo), (e, eo) = ix.sample_index[j].tolist(), ix.sample_index[j + 1].tolist()
    seqs = [tokens_of(int(d), lengths) for d in ix.document_index[b : e + 1]]
    one = b == e
    parts = [seqs[0][bo : eo + 1]] if one else [seqs[0][bo:], *seqs[1:-1], seqs[-1][: eo + 1]]
    text = np.concatenate(parts)[: seq_length + 1]
    return np.pad(text, (0, seq_length + 1 - text.shape[0]))


def assert_same(ours: np.ndarray, key: str) -> None:
    theirs = ARRAYS[key]
    assert ours.dtype == theirs.dtype, key
    np.testing.assert_array_equal(ours, theirs, err_msg=key)


def check_gpt(ix: NeoXIndices, rec: dict, key: str, lengths: np.ndarray, seq_length: int) -> None:
    assert_same(ix.document_index, f"{key}/doc_idx")
    assert_same(ix.sample_index, f"{key}/sample_idx")
    assert_same(ix.shuffle_index, f"{key}/shuffle_idx")
    assert len(ix) == rec["len"]
    if rec["item_index"]:
        texts = np.stack([item_text(ix, lengths, i, seq_length) for i in rec["item_index"]])
        np.testing.assert_array_equal(texts, ARRAYS[f"{key}/item_text"])


def test_fixtures_cover_the_brief() -> None:
    ok = [c for c in CASES.values() if c["outcome"] == "ok"]
    assert len(ok) >= 20
    weighted = [c for c in ok if c["kind"] == "weighted"]
    assert {len(c["train"][0]) for c in weighted} >= {2, 3, 4}
    assert len({c["seed"] for c in ok}) >= 5 and len({c["seq_length"] for c in ok}) >= 5
    assert any(s["oversampled"] for c in weighted for s in c["splits"].values())


@pytest.mark.parametrize("cid", by_kind("split"))
def test_split_datasets_match_neox(cid: str) -> None:
    case = CASES[cid]
    lengths = LENGTHS[case["data_path"]]
    assert neox_split_boundaries(case["split"], lengths.shape[0]) == case["boundaries"]
    ranges = neox_split_ranges(case["split"], lengths.shape[0])
    names: list[str] = []
    for k, name in enumerate(SPLITS):
        rec = case["splits"][name]
        assert (ranges[k] is None) == (rec is None), name
        if rec is None:
            continue
        span = ranges[k]
        assert span is not None
        ix = build_neox_gpt_indices(
            lengths,
            np.arange(*span, dtype=np.int32),
            num_samples=case["num_samples"][k],
            sequence_length=case["seq_length"],
            seed=case["seed"],
            num_epochs=case["num_epochs"][k],
        )
        check_gpt(ix, rec, f"{cid}/{name}", lengths, case["seq_length"])
        files = neox_index_file_names(
            case["data_path"], name, num_samples=case["num_samples"][k],
            sequence_length=case["seq_length"], seed=case["seed"],
        )
        names += files.values()
    assert sorted(names) == case["cache_files"]


@pytest.mark.parametrize("cid", by_kind("split", "error"))
def test_split_that_neox_rejects_is_a_config_error(cid: str) -> None:
    case = CASES[cid]
    with pytest.raises(ConfigError, match="expected ids >= 0"):
        neox_split_ranges(case["split"], LENGTHS[case["data_path"]].shape[0])


def blend_weights(case: dict, split: str) -> list[float]:
    paths, weights = case[split]
    if case["weight_by_num_documents"]:
        return neox_weights_by_num_docs(
            [LENGTHS[p].shape[0] for p in paths], alpha=case["weighted_sampler_alpha"]
        )
    return weights


@pytest.mark.parametrize("cid", by_kind("weighted"))
def test_weighted_blends_match_neox(cid: str) -> None:
    case = CASES[cid]
    names: list[str] = []
    for k, split in enumerate(SPLITS):
        rec = case["splits"][split]
        weights, counts = neox_blend_num_samples(blend_weights(case, split), case["num_samples"][k])
        assert weights == rec["weights"] and counts == rec["num_samples"]
        members = []
        for j, path in enumerate(case[split][0]):
            lengths = LENGTHS[path]
            ix = build_neox_gpt_indices(
                lengths, np.arange(lengths.shape[0], dtype=np.int32), num_samples=counts[j],
                sequence_length=case["seq_length"], seed=case["seed"],
                num_epochs=case["num_epochs"][k],
            )
            check_gpt(ix, rec["members"][j], f"{cid}/{split}/d{j}", lengths, case["seq_length"])
            members.append(ix)
            names += neox_index_file_names(
                path, f"{split}_{j}", num_samples=counts[j], sequence_length=case["seq_length"],
                seed=case["seed"],
            ).values()
        lens = [len(m) for m in members]
        dataset_index, sample_index = build_neox_blending_indices(weights, lens)
        assert_same(dataset_index, f"{cid}/{split}/dataset_index")
        assert_same(sample_index, f"{cid}/{split}/dataset_sample_index")
        assert len(dataset_index) == rec["len"]
        texts = []
        for i in rec["item_index"]:
            d = int(dataset_index[i])
            lengths = LENGTHS[case[split][0][d]]
            texts.append(item_text(members[d], lengths, int(sample_index[i]), case["seq_length"]))
        np.testing.assert_array_equal(np.stack(texts), ARRAYS[f"{cid}/{split}/item_text"])
    assert sorted(names) == case["cache_files"]


def test_single_epoch_equals_megatron_order() -> None:
    """Spec 2.15: with one epoch NeoX's arrays are megatron-core's (drop-last, extra token)."""
    lengths = LENGTHS["a"]
    docs = np.arange(50, dtype=np.int32)
    neox = build_neox_gpt_indices(lengths, docs, num_samples=20, sequence_length=16, seed=9)
    core = build_gpt_indices(
        lengths, docs, num_samples=20, config=GPTIndexConfig(sequence_length=16, random_seed=9)
    )
    assert neox.num_epochs == core.epochs.num_epochs == 1
    np.testing.assert_array_equal(neox.document_index, core.document_index)
    np.testing.assert_array_equal(neox.sample_index, core.sample_index)
    np.testing.assert_array_equal(neox.shuffle_index, core.shuffle_index)
    assert len(neox) == len(core) - 1


def test_sample_index_dtype_follows_the_sample_count() -> None:
    # 2 * ((E*T - 1) / S + 1) < 2**31 - 1, float division: int32 just below, int64 at the edge.
    assert neox_sample_index_dtype(1, 2**31 - 3, 2) == np.int32
    assert neox_sample_index_dtype(1, 2**31 - 2, 2) == np.int64
    assert neox_sample_index_dtype(3, 10**9, 4096) == np.int32


def test_item_position_fallback() -> None:
    # n = 5 built: 0..4 read directly (4 == len is still served), 5 -> 5 % 4, 13 -> 13 % 4
    np.testing.assert_array_equal(neox_item_position([0, 3, 4, 5, 13], 5), [0, 3, 4, 1, 1])
    # n = 1 (a blend member asked for one sample, as GPT-NeoX ea7aefd builds it when the weights
    # leave a small source ceil(0.05 x 20 x 1.005) = 1 sample): its IndexError fallback reads
    # shuffle_idx[index % 0], NumPy's 0, so every index serves the one sample
    np.testing.assert_array_equal(neox_item_position([0, 1, 22], 1), [0, 0, 0])
    with pytest.raises(ConfigError, match="built 0 samples"):
        neox_item_position([0], 0)


def gpt(lengths: list[int], **kwargs) -> NeoXIndices:
    return build_neox_gpt_indices(lengths, np.arange(len(lengths)), **kwargs)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: gpt([5, 6], num_samples=3, sequence_length=1), "seq_length > 1"),
        (lambda: gpt([1, 0], num_samples=3, sequence_length=4), "at least 2"),
        (lambda: gpt([5, 6], num_samples=None, sequence_length=4), "both unset"),
        (lambda: neox_blend_num_samples([1.0, 0.0], 10), "positive finite"),
        (lambda: neox_blend_num_samples([1.0] * 255, 10), "at most 254"),
        (lambda: neox_split_boundaries("98,x,0", 100), "malformed"),
        (lambda: neox_split_boundaries("0,0,0", 100), "positive sum"),
    ],
)
def test_inputs_neox_cannot_handle_are_config_errors(call, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        call()
