"""Every fixture case megatron-core 0.19.2 ran (tests/fixtures/megatron/order) against tokenload.

Arrays (values and dtypes), description texts, md5 hashes, cache file names and lengths of
every split and every blend member; configurations megatron rejects or loops on must raise
ConfigError here. The token-item parts of the fixtures belong to the datasets tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from index_megatron_driver import build_config

from tokenload.errors import ConfigError

ORDER = Path(__file__).parents[2] / "fixtures" / "megatron" / "order"
MOCK = Path(__file__).parents[2] / "fixtures" / "megatron" / "mock.json"
CACHE = Path(__file__).parents[2] / "fixtures" / "megatron" / "cache"

CASES = json.loads((ORDER / "cases.json").read_text())
LENGTHS = {
    prefix: np.asarray(facts["sequence_lengths"], dtype=np.int32)
    for prefix, facts in CASES["data_files"].items()
}


@pytest.fixture(scope="module")
def npz():
    with np.load(ORDER / "cases.npz") as z:
        yield {k: z[k] for k in z.files}


def _ids(kind):
    return [c["id"] for c in CASES["cases"] if c["kind"] in kind]


def _case(case_id):
    return next(c for c in CASES["cases"] if c["id"] == case_id)


def _compare_gpt(rec, built, npz, key):
    assert built.description == rec["description"], key
    assert built.hash == rec["hash"], key
    assert built.length == rec["len"], key
    for name in ("document_index", "sample_index", "shuffle_index"):
        ours, theirs = built.arrays[name], npz[f"{key}/{name}"]
        assert ours.dtype == theirs.dtype, (key, name, ours.dtype, theirs.dtype)
        assert str(ours.dtype) == rec["dtypes"][name]
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{key}/{name}")


@pytest.mark.parametrize("case_id", _ids({"gpt", "blended", "mixed"}))
def test_case_matches_megatron(case_id, npz):
    case = _case(case_id)
    built = build_config(case["config"], LENGTHS)
    files = set()
    for split, rec in case["splits"].items():
        ours = built[split]
        if rec is None:
            assert ours is None, split
            continue
        assert ours is not None, split
        key = f"{case_id}/{split}"
        files |= set(ours.files())
        if rec["class"] == "GPTDataset":
            _compare_gpt(rec, ours, npz, key)
            continue
        assert ours.description == rec["description"] and ours.hash == rec["hash"], key
        assert ours.length == rec["len"]
        assert ours.identifiers["weights"] == rec["weights"]
        assert ours.identifiers["size"] == rec["size"]
        for name in ("dataset_index", "dataset_sample_index"):
            theirs = npz[f"{key}/{name}"]
            assert ours.arrays[name].dtype == theirs.dtype
            np.testing.assert_array_equal(ours.arrays[name], theirs, err_msg=f"{key}/{name}")
        assert len(ours.members) == len(rec["datasets"])
        for j, (member, mrec) in enumerate(zip(ours.members, rec["datasets"])):
            _compare_gpt(mrec, member, npz, f"{key}/d{j}")
    assert sorted(files) == case["cache_files"]


@pytest.mark.parametrize("case_id", _ids({"error", "not_run"}))
def test_megatron_failures_are_config_errors(case_id):
    case = _case(case_id)
    with pytest.raises(ConfigError):
        build_config(case["config"], LENGTHS)


def test_cache_folder_names_and_bytes():
    """The complete cache folder megatron wrote: same names, and .npy bytes equal ours."""
    expected = json.loads((CACHE / "expected.json").read_text())
    lengths = {p: LENGTHS[p] for p in ("gold/x", "rand/a")}
    built = build_config(expected["config"], lengths)
    names = set()
    for split, rec in expected["splits"].items():
        ours = built[split]
        assert ours.hash == rec["hash"] and ours.length == rec["len"]
        assert [m.hash for m in ours.members] == rec["member_hashes"]
        assert [m.length for m in ours.members] == rec["member_lens"]
        names |= set(ours.files())
    assert sorted(names) == sorted(expected["files"])
    import hashlib
    import io

    for split in ("train", "valid", "test"):
        for obj in (built[split], *built[split].members):
            for what, arr in obj.arrays.items():
                name = f"{obj.hash}-{obj.identifiers['class']}-{split}-{what}.npy"
                buf = io.BytesIO()
                np.save(buf, arr, allow_pickle=True)
                assert hashlib.md5(buf.getvalue()).hexdigest() == expected["files"][name], name
            desc = f"{obj.hash}-{obj.identifiers['class']}-{split}-description.txt"
            assert (CACHE / "index_cache" / desc).read_text() == obj.description


def test_mock_dataset_matches_megatron():
    mock = json.loads(MOCK.read_text())
    lengths = np.random.default_rng(seed=0).integers(
        low=1, high=4096, size=100000, dtype=np.int32
    )
    assert lengths[:20].tolist() == mock["low_level"]["sequence_lengths_head"]
    config = {"blend": None, "blend_per_split": None, "split": "1,1,1", "sizes": [10, 5, 5],
              "random_seed": 1234, "sequence_length": 16, "add_extra_token_to_sequence": True,
              "drop_last_partial_validation_sequence": True, "mid_level_dataset_surplus": 0.005}
    built = build_config(config, {None: lengths}, class_name="MockGPTDataset")
    for split in ("train", "valid", "test"):
        rec, ours = mock["splits"][split], built[split]
        assert ours.description == rec["description"] and ours.hash == rec["hash"]
        assert ours.length == rec["len"]
        assert ours.arrays["document_index"][:16].tolist() == rec["document_index_head"]
        assert ours.arrays["shuffle_index"][:16].tolist() == rec["shuffle_index_head"]
        assert ours.arrays["sample_index"][:8].tolist() == rec["sample_index_head"]
