"""The dataset builder against megatron-core 0.19.2: every fixture configuration gives the same
splits, lengths, cache file names, arrays and items; Megatron's own cache folder loads with
identical items; stale caches are detected; mock data matches."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from support import FIXTURES, megatron_config
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.datasets.megatron.blended import BlendedDataset
from tokenload.errors import CacheError, ConfigError

MEG = FIXTURES / "megatron"
ORDER = MEG / "order"
META = json.loads((ORDER / "cases.json").read_text())
ARRAYS = np.load(ORDER / "cases.npz")
TOK = META["tokenizer"]
OK = [c for c in META["cases"] if c["outcome"] == "ok"]
FAILING = [c for c in META["cases"] if c["outcome"] != "ok"]


def _config(cfg, cache_dir, **overrides):
    return megatron_config(cfg, META["tokenizer"], cache_dir, **overrides)


def _megatron_names(folder):
    return sorted(n for n in os.listdir(folder) if "-tokenload" not in n and not n.startswith("."))


@pytest.mark.parametrize("case", OK, ids=[c["id"] for c in OK])
def test_builder_matches_megatron(case, tmp_path, monkeypatch):
    monkeypatch.chdir(ORDER)  # megatron saw the prefixes relative to this folder
    cache = tmp_path / "cache"
    splits = build_datasets(_config(case["config"], cache), case["config"]["sizes"])
    for name, ds in zip(("train", "valid", "test"), splits):
        rec = case["splits"][name]
        if rec is None:
            assert ds is None, name
            continue
        key = f"{case['id']}/{name}"
        assert len(ds) == rec["len"], name
        if rec["class"] == "BlendedDataset":
            assert isinstance(ds, BlendedDataset)
            np.testing.assert_array_equal(ds.dataset_index, ARRAYS[f"{key}/dataset_index"])
            np.testing.assert_array_equal(ds.dataset_sample_index, ARRAYS[f"{key}/dataset_sample_index"])
        else:
            for a in ("document_index", "sample_index", "shuffle_index"):
                got, want = getattr(ds, a), ARRAYS[f"{key}/{a}"]
                assert got.dtype == want.dtype, a
                np.testing.assert_array_equal(got, want, err_msg=a)
        if rec.get("item_index"):
            got = ds.__getitems__(rec["item_index"])
            np.testing.assert_array_equal(got["tokens"], ARRAYS[f"{key}/item_tokens"])
            np.testing.assert_array_equal(got["labels"], ARRAYS[f"{key}/item_labels"])
    assert _megatron_names(cache) == case["cache_files"]


@pytest.mark.parametrize("case", FAILING, ids=[c["id"] for c in FAILING])
def test_configs_megatron_rejects_or_loops_on_are_config_errors(case, tmp_path, monkeypatch):
    monkeypatch.chdir(ORDER)
    with pytest.raises(ConfigError) as info:
        build_datasets(_config(case["config"], tmp_path), case["config"]["sizes"])
    assert "HINT" in str(info.value) or "expected" in str(info.value)


def test_megatron_cache_folder_loads_with_identical_items(tmp_path, monkeypatch):
    expected = json.loads((MEG / "cache" / "expected.json").read_text())
    cache = tmp_path / "megatron_cache"
    shutil.copytree(MEG / "cache" / "index_cache", cache)
    before = {n: os.path.getmtime(cache / n) for n in os.listdir(cache)}
    monkeypatch.chdir(ORDER)
    splits = build_datasets(_config(expected["config"], cache, cache="strict"), expected["config"]["sizes"])
    after = {n: os.path.getmtime(cache / n) for n in os.listdir(cache)}
    added = [n for n in after if n not in before]
    assert [n.endswith("-tokenload-build.json") for n in added] == [True]  # the manifest only
    assert {n: after[n] for n in before} == before  # loaded, nothing rebuilt
    fast = build_datasets(_config(expected["config"], cache, build_policy="none"), expected["config"]["sizes"])
    assert [len(d) for d in fast] == [len(d) for d in splits]
    for name, ds in zip(("train", "valid", "test"), splits):
        rec = expected["splits"][name]
        assert len(ds) == rec["len"]
        got = ds.__getitems__(list(range(len(rec["items"]))))
        for i, item in enumerate(rec["items"]):
            for field in ("tokens", "labels", "loss_mask", "position_ids", "dataset_id"):
                np.testing.assert_array_equal(
                    np.asarray(got[field][i]),
                    np.asarray(item[field]),
                    err_msg=f"{name} {i} {field}",
                )


def test_cache_is_reused_and_stale_cache_is_never_silently_used(tmp_path, monkeypatch):
    monkeypatch.chdir(ORDER)
    case = next(c for c in OK if c["label"] == "spec10_A")
    cache = tmp_path / "c"
    build_datasets(_config(case["config"], cache), case["config"]["sizes"])
    stamps = {n: os.path.getmtime(cache / n) for n in os.listdir(cache)}
    train, _, _ = build_datasets(_config(case["config"], cache, cache="strict"), case["config"]["sizes"])
    assert {n: os.path.getmtime(cache / n) for n in os.listdir(cache)} == stamps
    # Megatron's hash forgets add_extra_token: the same file names, different arrays.
    other = dict(case["config"], add_extra_token_to_sequence=False)
    with pytest.raises(CacheError, match="stale") as info:
        build_datasets(_config(other, cache, cache="strict"), other["sizes"])
    assert "HINT" in str(info.value)
    rebuilt, _, _ = build_datasets(_config(other, cache), other["sizes"])
    fresh, _, _ = build_datasets(_config(other, tmp_path / "fresh", cache="off"), other["sizes"])
    np.testing.assert_array_equal(rebuilt.sample_index, fresh.sample_index)
    original, _, _ = build_datasets(_config(case["config"], tmp_path / "orig", cache="off"), case["config"]["sizes"])
    assert len(train) == len(original)
    assert not np.array_equal(rebuilt.sample_index, original.sample_index)


def test_mock_matches_megatron():
    mock = json.loads((MEG / "mock.json").read_text())
    cfg = MegatronDataConfig(
        sequence_length=mock["config"]["sequence_length"],
        random_seed=mock["config"]["random_seed"],
        tokenizer=mock["tokenizer"]["unique_identifiers"],
        vocab_size=mock["tokenizer"]["vocab_size"],
        eod_id=mock["tokenizer"]["eod"],
    )
    splits = build_datasets(cfg, mock["config"]["sizes"])
    for name, ds in zip(("train", "valid", "test"), splits):
        rec = mock["splits"][name]
        assert len(ds) == rec["len"], name
        assert np.asarray(ds.document_index[:16]).tolist() == rec["document_index_head"]
        assert np.asarray(ds.shuffle_index[:16]).tolist() == rec["shuffle_index_head"]
        assert ds.identity.startswith(rec["hash"])
        if name == "train":
            got = ds.__getitems__([0, 1])
            for i, item in enumerate(rec["items"]):
                assert got["tokens"][i].tolist() == item["tokens"]
                assert got["labels"][i].tolist() == item["labels"]


def test_a_blend_of_uint16_and_int32_files_serves_megatron_cores_samples(tmp_path):
    """megatron-core 0.19.2 builds a blend whose token files differ in dtype (each IndexedDataset
    reads its own) and returns int64 tokens: tokenload serves the same samples, also int64 (its
    40 samples recorded in fixtures/megatron/mixed_dtype_blend.json), with and without a cache."""
    expected = json.loads((FIXTURES / "megatron" / "mixed_dtype_blend.json").read_text())
    fmt = FIXTURES / "megatron" / "format"
    u16, i32 = str(fmt / "random_u16"), str(fmt / "int32_large")
    for options in ({"cache": "off"}, {"path_to_cache": str(tmp_path / "c")}):
        cfg = MegatronDataConfig(sequence_length=4, random_seed=1234, split="100,0,0",
                                 blend=["1.0", u16, "1.0", i32], **options)
        train = build_datasets(cfg, [40, 0, 0])[0]
        assert len(train) == len(expected["samples"])
        got = train.__getitems__(list(range(len(train))))
        assert str(got["tokens"].dtype) == expected["token_dtype"] == str(train[1]["tokens"].dtype)
        assert [[t.tolist(), lab.tolist()] for t, lab in zip(got["tokens"], got["labels"],
                                                              strict=True)] == expected["samples"]
        assert max(map(max, got["tokens"].tolist())) > 65535  # the int32 file's samples are there


def test_unwritable_cache_folder_is_a_config_error(tmp_path):
    from support import write_documents

    a = write_documents(tmp_path / "a", [[1, 2, 3, 4]] * 20)
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the cache folder should be")
    cfg = MegatronDataConfig(sequence_length=4, blend=[a], split="1,0,0", path_to_cache=str(blocker / "cache"))
    with pytest.raises(ConfigError, match="cannot write the index cache") as info:
        build_datasets(cfg, [10, 0, 0])
    assert isinstance(info.value, CacheError) and "HINT" in str(info.value)
    assert build_datasets(MegatronDataConfig(**{**cfg.__dict__, "cache": "off"}), [10, 0, 0])[0] is not None


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_a_mixed_dtype_blend_loads_as_the_same_blend_in_one_dtype(tmp_path, packing):
    """The loader's micro-batches of a uint16 + int32 blend equal those of the same tokens written
    as two int32 files (the order depends on no dtype), in both packings."""
    from support import write_documents
    from tokenload.loader import build_dataloader

    rng = np.random.default_rng(4)
    docs = [rng.integers(0, 65535, int(rng.integers(1, 30))).tolist() for _ in range(120)]
    wide = [rng.integers(0, 200_000, int(rng.integers(1, 30))).tolist() for _ in range(120)]
    b = write_documents(tmp_path / "b", wide, dtype=np.int32)
    batches = []
    for dtype in (np.uint16, np.int32):
        a = write_documents(tmp_path / f"a-{np.dtype(dtype).name}", docs, dtype=dtype)
        cfg = MegatronDataConfig(sequence_length=16, blend=["1", a, "2", b], split="100,0,0",
                                 packing=packing, cache="off")
        loader = build_dataloader(build_datasets(cfg, [200, 0, 0])[0], micro_batch_size=4,
                                  num_workers=0)
        batches.append([{k: (str(v.dtype), v.tolist()) for k, v in batch.items()
                         if hasattr(v, "dtype")} for batch in loader])
    assert batches[0] == batches[1] and len(batches[0]) >= 50
    assert {b["tokens"][0] for b in batches[0]} == {"torch.int64"}


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_the_computed_order_serves_a_mixed_dtype_blend(tmp_path, packing):
    """The computed order blends uint16 and int32 files too (its sources are keyed by their
    content, dtype included, so the same tokens in another dtype are another order: here each
    row is checked against its source). Source a's tokens are below 1,000, b's from 70,000 (int32
    only); every row holds tokens of its dataset_id's source only, and a concatenated row is a
    stretch of that source's token stream."""
    from support import write_documents
    from tokenload.loader import build_dataloader

    rng = np.random.default_rng(5)
    docs = {
        0: [rng.integers(1, 1000, int(rng.integers(1, 30))).tolist() for _ in range(150)],
        1: [rng.integers(70_000, 200_000, int(rng.integers(1, 30))).tolist() for _ in range(150)],
    }
    a = write_documents(tmp_path / "a", docs[0], dtype=np.uint16)
    b = write_documents(tmp_path / "b", docs[1], dtype=np.int32)
    cfg = MegatronDataConfig(sequence_length=16, blend=["1", a, "2", b], split="100,0,0",
                             packing=packing, order="computed", eod_id=None)
    loader = build_dataloader(build_datasets(cfg, [240, 0, 0])[0], micro_batch_size=4,
                              num_workers=0)
    streams = {d: np.concatenate([np.array(x, dtype=np.int64) for x in docs[d]]) for d in docs}
    stretches = {d: {tuple(streams[d][i : i + 16]) for i in range(streams[d].size - 15)}
                 for d in docs}
    rows = 0
    for batch in loader:
        for tokens, source, mask in zip(batch["tokens"].numpy(), batch["dataset_id"].numpy(),
                                        batch["loss_mask"].numpy()):
            held = tokens[mask > 0] if packing == "best-fit" else tokens
            low, high = (1, 999) if source == 0 else (70_000, 199_999)
            assert ((held >= low) & (held <= high)).all(), (source, held)
            if packing == "concat":
                assert tuple(tokens) in stretches[int(source)]
            rows += 1
    assert rows == 240 and str(batch["tokens"].dtype) == "torch.int64"


@pytest.mark.parametrize("add_extra_token", [True, False])
def test_a_blend_member_with_an_empty_split_asked_for_0_samples(tmp_path, add_extra_token):
    """Checked side by side with megatron-core 0.19.2 (a weighted blend, split 969,30,1, one
    member's test share empty, sizes [50, 0, 0]): with the extra token its _get_num_epochs asks
    0 x S + 1 tokens of the empty split and loops forever; without it, the split is built empty
    (lens [50, 0, 0] on both sides). The loop is a ConfigError naming the split, its cause and the
    fix, not the bare "0 tokens but 0 samples" of before."""
    from support import write_documents

    rng = np.random.default_rng(0)
    big = write_documents(tmp_path / "big", [rng.integers(0, 250, rng.integers(20, 400)) for _ in range(400)])
    small = write_documents(tmp_path / "small", [np.arange(1, 30)] * 100)
    cfg = MegatronDataConfig(sequence_length=64, blend=["0.4", big, "0.6", small], split="969,30,1",
                             add_extra_token=add_extra_token, path_to_cache=str(tmp_path / "c"))
    if add_extra_token:
        with pytest.raises(ConfigError, match=r"the test split of .*big holds no tokens .*even 0 samples need"
                           r" 1 token with add_extra_token \(megatron-core loops forever\)") as info:
            build_datasets(cfg, [50, 0, 0])
        assert "give the test split a weight of 0 in the split string" in str(info.value)
    else:
        assert [len(d) for d in build_datasets(cfg, [50, 0, 0])] == [50, 0, 0]
    packed = MegatronDataConfig(**{**cfg.__dict__, "packing": "best-fit"})
    assert [len(d) for d in build_datasets(packed, [50, 0, 0])] == [50, 0, 0]  # not megatron-core's rule


def test_mock_data_under_build_policy_none_builds_in_memory(tmp_path):
    """Mock data has no caches to prepare (prepare-cache refuses it): under ``none`` its indices
    are made in memory, the same samples as under ``auto``, and nothing is written (it raised a
    CacheError whose prepare-cache command had no data and failed: a new user's finding)."""
    mock = json.loads((MEG / "mock.json").read_text())
    fields = dict(sequence_length=mock["config"]["sequence_length"], random_seed=mock["config"]["random_seed"],
                  vocab_size=mock["tokenizer"]["vocab_size"], eod_id=mock["tokenizer"]["eod"],
                  path_to_cache=str(tmp_path / "cache"))
    none = build_datasets(MegatronDataConfig(**fields, build_policy="none"), mock["config"]["sizes"])
    assert not (tmp_path / "cache").exists()
    auto = build_datasets(MegatronDataConfig(**fields), mock["config"]["sizes"])
    for a, b in zip(none, auto):
        np.testing.assert_array_equal(a.__getitems__([0, 1, 5])["tokens"], b.__getitems__([0, 1, 5])["tokens"])
