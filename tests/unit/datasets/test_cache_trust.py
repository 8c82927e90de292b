"""Index caches are never trusted blindly, and a dataset's fingerprint is its content.

Token files written the way Megatron writes them (no tokenload sidecar) are rewritten, caches
are damaged value by value and header by header, and data is moved: every case gives correct
items, a rebuild, or a CacheError naming the damaged file, never wrong items or a bare error.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from support import FIXTURES, megatron_config, write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import CacheError, ConfigError, StateError
from tokenload.loader import build_dataloader

ORDER = FIXTURES / "megatron" / "order"
META = json.loads((ORDER / "cases.json").read_text())
SEQ = 8


def _documents(seed: int, count: int = 40) -> list[list[int]]:
    """Documents of distinct lengths (so a reordering changes the sequence lengths)."""
    rng = np.random.default_rng(seed)
    return [list(rng.integers(0, 1000, size=3 + i)) for i in range(count)]


def _reordered(docs: list[list[int]]) -> list[list[int]]:
    """The train split's documents (the first 90%) reversed: every split keeps its token count,
    so the caches keep their shapes, but the train split's sequence lengths move."""
    cut = len(docs) * 9 // 10
    return docs[:cut][::-1] + docs[cut:]


def _megatron_file(prefix, documents) -> str:
    """A token file as Megatron writes it: .bin and .idx, no tokenload sidecar."""
    write_documents(prefix, documents)
    os.remove(f"{prefix}.json")
    return str(prefix)


def _config(prefix, **overrides) -> MegatronDataConfig:
    return MegatronDataConfig(sequence_length=SEQ, blend=[prefix], split="90,10,0", **overrides)


def _tokens(ds) -> np.ndarray:
    return ds.__getitems__(list(range(len(ds))))["tokens"]


def _cache_file(folder, suffix: str, split: str = "train") -> str:
    (path,) = glob.glob(os.path.join(folder, f"*-{split}-{suffix}"))
    return path


# -- stale caches ----------------------------------------------------------------------------------


def test_same_size_rewrite_of_a_megatron_file_is_a_stale_cache(tmp_path):
    docs = _documents(0)
    prefix = _megatron_file(tmp_path / "data", docs)
    cache = tmp_path / "cache"
    before = build_datasets(_config(prefix, path_to_cache=str(cache)), [200, 20, 0])[0]
    _tokens(before)
    sizes = (os.path.getsize(f"{prefix}.bin"), os.path.getsize(f"{prefix}.idx"))
    _megatron_file(prefix, _reordered(docs))  # same sizes, same count, same split totals
    assert (os.path.getsize(f"{prefix}.bin"), os.path.getsize(f"{prefix}.idx")) == sizes

    with pytest.raises(CacheError, match="stale") as info:
        build_datasets(_config(prefix, path_to_cache=str(cache), cache="strict"), [200, 20, 0])
    assert "index_xxh3_64" in str(info.value) and "HINT" in str(info.value)
    rebuilt = build_datasets(_config(prefix, path_to_cache=str(cache)), [200, 20, 0])[0]
    fresh = build_datasets(_config(prefix, cache="off"), [200, 20, 0])[0]
    np.testing.assert_array_equal(_tokens(rebuilt), _tokens(fresh))
    # and the rebuilt cache is used as is from now on
    strict = _config(prefix, path_to_cache=str(cache), cache="strict")
    again = build_datasets(strict, [200, 20, 0])[0]
    np.testing.assert_array_equal(_tokens(again), _tokens(fresh))


def _without_sidecars(folder) -> None:
    """The cache as Megatron writes it: no tokenload sidecar, no build manifest."""
    for name in os.listdir(folder):
        if name.endswith(("-tokenload.json", "-tokenload-build.json")):
            os.remove(os.path.join(folder, name))


REWRITES = {
    "train documents reversed": _reordered,
    "documents rotated across the split boundary": lambda d: d[3:] + d[:3],
    "every length moved (same multiset)": lambda d: [d[(i * 7) % len(d)] for i in range(len(d))],
}


@pytest.mark.parametrize("rewrite", list(REWRITES))
def test_a_megatron_cache_over_a_same_size_rewrite_is_stale_or_correct(tmp_path, rewrite):
    """A cache Megatron wrote (no sidecar: no recorded facts, no hashes) over a token file
    rewritten to the same sizes: on first use its arrays are checked against the file's current
    lengths. Every split is refused by ``strict`` or serves the items an in-memory build serves;
    ``auto`` rebuilds what does not fit and serves the right items for every split."""
    docs = _documents(4, count=60)
    prefix = _megatron_file(tmp_path / "data", docs)
    cache = tmp_path / "cache"
    sizes = [200, 20, 0]
    build_datasets(_config(prefix, path_to_cache=str(cache)), sizes)
    _without_sidecars(cache)
    before = {n: os.path.getsize(f"{prefix}.{n}") for n in ("bin", "idx")}
    _megatron_file(prefix, REWRITES[rewrite](docs))
    assert {n: os.path.getsize(f"{prefix}.{n}") for n in ("bin", "idx")} == before
    fresh = build_datasets(_config(prefix, cache="off"), sizes)

    try:
        strict = build_datasets(_config(prefix, path_to_cache=str(cache), cache="strict"), sizes)
    except CacheError as exc:
        assert "stale" in str(exc) and "HINT" in str(exc)  # by shapes, or by the lengths check
    else:  # every split's cache fits the new lengths: its items are the right ones
        for got, want in zip(strict[:2], fresh[:2]):
            np.testing.assert_array_equal(_tokens(got), _tokens(want))
    auto = build_datasets(_config(prefix, path_to_cache=str(cache)), sizes)
    for got, want in zip(auto[:2], fresh[:2]):
        np.testing.assert_array_equal(_tokens(got), _tokens(want))


def test_the_megatron_cache_check_names_the_array_and_the_sample(tmp_path):
    docs = _documents(4, count=60)
    prefix = _megatron_file(tmp_path / "data", docs)
    cache = tmp_path / "cache"
    build_datasets(_config(prefix, path_to_cache=str(cache)), [200, 20, 0])
    _without_sidecars(cache)
    _megatron_file(prefix, _reordered(docs))
    named = (r"stale: sample_index: sample \d+ starts at (stream position|offset) \d+ .*in the "
             r"current token file.*checked against the current token file")
    with pytest.raises(CacheError, match=named):
        build_datasets(_config(prefix, path_to_cache=str(cache), cache="strict"), [200, 20, 0])


def test_default_cache_folder_is_checked_too(tmp_path):
    """No path_to_cache: Megatron's folder next to the prefix, the default a user takes."""
    docs = _documents(1)
    prefix = _megatron_file(tmp_path / "data", docs)
    build_datasets(_config(prefix), [100, 10, 0])
    assert os.path.isdir(os.path.join(prefix, "cache", "GPTDataset_indices"))
    _megatron_file(prefix, _reordered(docs))
    train = build_datasets(_config(prefix), [100, 10, 0])[0]
    fresh = build_datasets(_config(prefix, cache="off"), [100, 10, 0])[0]
    np.testing.assert_array_equal(_tokens(train), _tokens(fresh))


def test_cache_without_sidecar_and_a_wrong_shape_is_stale(tmp_path):
    """A cache Megatron wrote carries no tokenload sidecar: the arrays' shapes are still checked
    against those the configuration implies, for all three arrays."""
    prefix = _megatron_file(tmp_path / "data", _documents(2))
    cache = tmp_path / "cache"
    build_datasets(_config(prefix, path_to_cache=str(cache)), [100, 10, 0])
    os.remove(_cache_file(cache, "tokenload.json"))
    path = _cache_file(cache, "document_index.npy")
    np.save(path, np.load(path)[:-1])
    with pytest.raises(CacheError, match="document_index: cached shape"):
        build_datasets(_config(prefix, path_to_cache=str(cache), cache="strict"), [100, 10, 0])


OK = [c for c in META["cases"] if c["outcome"] == "ok"]


@pytest.mark.parametrize("case", OK, ids=[c["id"] for c in OK])
def test_every_megatron_case_reloads_its_own_cache_in_strict_mode(case, tmp_path, monkeypatch):
    """The expected shapes (GPT and blended arrays) match what was built, for every case."""
    monkeypatch.chdir(ORDER)
    cfg, sizes = case["config"], case["config"]["sizes"]
    build_datasets(megatron_config(cfg, META["tokenizer"], tmp_path), sizes)
    stamps = {n: os.path.getmtime(tmp_path / n) for n in os.listdir(tmp_path)}
    build_datasets(megatron_config(cfg, META["tokenizer"], tmp_path, cache="strict"), sizes)
    assert {n: os.path.getmtime(tmp_path / n) for n in os.listdir(tmp_path)} == stamps


@pytest.mark.parametrize("case", OK, ids=[c["id"] for c in OK])
def test_every_megatron_case_reloads_its_cache_without_sidecars_in_strict_mode(
    case, tmp_path, monkeypatch
):
    """A cache without sidecars (as Megatron writes it; the arrays are Megatron's, bit for bit:
    test_builder) is checked against the token files on first use and found to fit, in every
    case: the check has no false alarm."""
    monkeypatch.chdir(ORDER)
    cfg, sizes = case["config"], case["config"]["sizes"]
    build_datasets(megatron_config(cfg, META["tokenizer"], tmp_path), sizes)
    for name in os.listdir(tmp_path):
        if name.endswith(("-tokenload.json", "-tokenload-build.json")):
            os.remove(tmp_path / name)
    stamps = {n: os.path.getmtime(tmp_path / n) for n in os.listdir(tmp_path) if n.endswith(".npy")}
    build_datasets(megatron_config(cfg, META["tokenizer"], tmp_path, cache="strict"), sizes)
    assert {n: os.path.getmtime(tmp_path / n) for n in stamps} == stamps


# -- damaged headers -------------------------------------------------------------------------------


def _damage_header(path: str) -> None:
    """An unbalanced shape tuple: NumPy's header parser raises tokenize.TokenError on it."""
    raw = Path(path).read_bytes()
    head = raw[:128]
    assert b"shape': (" in head
    with open(path, "r+b") as f:
        f.write(head.replace(b",)", b", ", 1) if b",)" in head else head.replace(b")", b" ", 1))


@pytest.mark.parametrize("array", ["document_index", "sample_index", "shuffle_index"])
def test_damaged_npy_header_is_rebuilt_or_a_cache_error(tmp_path, array):
    prefix = _megatron_file(tmp_path / "data", _documents(3))
    cache = tmp_path / "cache"
    fresh = _tokens(build_datasets(_config(prefix, path_to_cache=str(cache)), [100, 10, 0])[0])
    path = _cache_file(cache, f"{array}.npy")
    _damage_header(path)
    with pytest.raises(CacheError, match=array) as info:
        build_datasets(_config(prefix, path_to_cache=str(cache), cache="strict"), [100, 10, 0])
    assert "stale" in str(info.value)
    rebuilt = build_datasets(_config(prefix, path_to_cache=str(cache)), [100, 10, 0])[0]
    np.testing.assert_array_equal(_tokens(rebuilt), fresh)


def test_damaged_header_met_by_a_deferred_mmap_is_a_cache_error(tmp_path):
    """A loader worker maps the cached arrays itself (the dataset travels as paths); a file
    damaged after the build fails there with a CacheError naming it."""
    prefix = _megatron_file(tmp_path / "data", _documents(4))
    cache = tmp_path / "cache"
    train = build_datasets(_config(prefix, path_to_cache=str(cache)), [100, 10, 0])[0]
    shipped = pickle.dumps(train)
    path = _cache_file(cache, "sample_index.npy")
    _damage_header(path)
    with pytest.raises(CacheError) as info:
        pickle.loads(shipped)[0]
    assert info.value.path == path and "HINT" in str(info.value)


# -- damaged values --------------------------------------------------------------------------------


def _rewrite(path: str, change) -> None:
    """New values, same dtype and shape: the sidecar and the headers still match."""
    old = np.load(path)
    new = change(old.copy()).astype(old.dtype)
    assert new.shape == old.shape
    np.save(path, new)


GPT_DAMAGE = {
    "document_index, bits flipped (negative: NumPy would wrap)": ("document_index", np.invert),
    "document_index past the file": ("document_index", lambda a: a + 1000),
    "sample_index, bits flipped": ("sample_index", np.invert),
    "sample_index offsets past their sequence": ("sample_index", lambda a: a + np.array([[0, 5000]])),
    "sample_index positions past the document index": ("sample_index", lambda a: a + np.array([[10**6, 0]])),
    "sample_index, a sample ending before it starts": ("sample_index", lambda a: a[::-1]),
    "shuffle_index, bits flipped": ("shuffle_index", np.invert),
}


IN_RANGE_DAMAGE = {
    "shuffle_index, one entry duplicated": ("shuffle_index", lambda a: np.r_[a[:5], a[6], a[6:]]),
    "document_index, two entries swapped": ("document_index", lambda a: np.r_[a[1], a[0], a[2:]]),
    "sample_index, one offset moved by one":
        ("sample_index", lambda a: a + (np.arange(a.size).reshape(a.shape) == 7)),
}
ALL_DAMAGE = {**GPT_DAMAGE, **IN_RANGE_DAMAGE}


MEGATRON_CACHE_DAMAGE = list(IN_RANGE_DAMAGE)[:1] + list(GPT_DAMAGE)


@pytest.mark.parametrize("damage", MEGATRON_CACHE_DAMAGE, ids=MEGATRON_CACHE_DAMAGE)
def test_a_megatron_cache_with_damaged_values_is_stale_on_first_use(tmp_path, damage):
    """Without a sidecar there is no hash; the check against the lengths still finds a
    duplicated shuffle entry and every out-of-range value, before any batch."""
    array, change = {**GPT_DAMAGE, **IN_RANGE_DAMAGE}[damage]
    prefix = _megatron_file(tmp_path / "data", _documents(5))
    cache = tmp_path / "cache"
    build_datasets(_config(prefix, path_to_cache=str(cache)), [300, 10, 0])
    _without_sidecars(cache)
    _rewrite(_cache_file(cache, f"{array}.npy"), change)
    named = rf"stale: .*{array}: .*checked against the current token file"
    with pytest.raises(CacheError, match=named):
        build_datasets(_config(prefix, path_to_cache=str(cache), cache="strict"), [300, 10, 0])


@pytest.mark.parametrize("damage", list(ALL_DAMAGE), ids=list(ALL_DAMAGE))
def test_damaged_values_of_a_hashed_cache_are_rebuilt_or_refused(tmp_path, damage):
    """The sidecar records each array's xxh3-64: a damaged value, even one in range (a duplicated
    shuffle entry serves wrong items with no range check failing), makes the cache stale:
    ``strict`` refuses it naming the array, ``auto`` rebuilds it and serves the right items."""
    array, change = ALL_DAMAGE[damage]
    prefix = _megatron_file(tmp_path / "data", _documents(5))
    cache = tmp_path / "cache"
    build_datasets(_config(prefix, path_to_cache=str(cache)), [300, 10, 0])
    for manifest in glob.glob(str(cache / "*-tokenload-build.json")):
        os.remove(manifest)  # each cache checked on its own (the manifest path: next test)
    _rewrite(_cache_file(cache, f"{array}.npy"), change)
    named = rf"stale: .*{array}: data's xxh3-64 is \w+, the sidecar recorded"
    with pytest.raises(CacheError, match=named):
        build_datasets(_config(prefix, path_to_cache=str(cache), cache="strict"), [300, 10, 0])
    rebuilt = build_datasets(_config(prefix, path_to_cache=str(cache)), [300, 10, 0])[0]
    fresh = build_datasets(_config(prefix, cache="off"), [300, 10, 0])[0]
    np.testing.assert_array_equal(_tokens(rebuilt), _tokens(fresh))


@pytest.mark.parametrize("damage", list(IN_RANGE_DAMAGE), ids=list(IN_RANGE_DAMAGE))
def test_damaged_values_met_through_the_build_manifest_are_a_cache_error(tmp_path, damage):
    """With a build manifest no cache file is opened at build time: the array's hash is verified
    where it is first mapped, before the first batch reads through it."""
    array, change = IN_RANGE_DAMAGE[damage]
    prefix = _megatron_file(tmp_path / "data", _documents(5))
    cache = tmp_path / "cache"
    cfg = _config(prefix, path_to_cache=str(cache))
    build_datasets(cfg, [300, 10, 0])
    assert glob.glob(str(cache / "*-tokenload-build.json"))
    path = _cache_file(cache, f"{array}.npy")
    _rewrite(path, change)
    loading = MegatronDataConfig(**{**cfg.__dict__, "build_policy": "none"})  # READ: the manifest
    train = build_datasets(loading, [300, 10, 0])[0]
    shipped = pickle.dumps(train)  # a loader worker maps the arrays itself
    with pytest.raises(CacheError, match=r"xxh3-64 is .* the index cache is damaged") as info:
        _tokens(pickle.loads(shipped))
    assert info.value.path == path and "HINT" in str(info.value)


@pytest.mark.parametrize("policy", ["auto", "strict"])
@pytest.mark.parametrize("damage", list(GPT_DAMAGE), ids=list(GPT_DAMAGE))
def test_damaged_gpt_index_values_are_a_cache_error_naming_the_file(tmp_path, damage, policy):
    """Values damaged after the cache was checked, in a cache without a sidecar: the per-batch
    range checks name the file."""
    array, change = GPT_DAMAGE[damage]
    prefix = _megatron_file(tmp_path / "data", _documents(5))
    cache = tmp_path / "cache"
    build_datasets(_config(prefix, path_to_cache=str(cache)), [300, 10, 0])
    train = build_datasets(_config(prefix, path_to_cache=str(cache), cache=policy), [300, 10, 0])[0]
    os.remove(_cache_file(cache, "tokenload.json"))
    path = _cache_file(cache, f"{array}.npy")
    _rewrite(path, change)
    with pytest.raises(CacheError, match="damaged") as info:
        _tokens(pickle.loads(pickle.dumps(train)))
    assert info.value.path == path and "HINT" in str(info.value)


BLEND_DAMAGE = {
    "dataset_index, bits flipped": ("dataset_index", np.invert),
    "dataset_index past the blend": ("dataset_index", lambda a: a + 2),
    "dataset_sample_index, bits flipped": ("dataset_sample_index", np.invert),
    "dataset_sample_index past the dataset": ("dataset_sample_index", lambda a: a + 10**6),
}


@pytest.mark.parametrize("damage", list(BLEND_DAMAGE), ids=list(BLEND_DAMAGE))
def test_damaged_blend_index_values_are_a_cache_error_naming_the_file(tmp_path, damage):
    array, change = BLEND_DAMAGE[damage]
    a = _megatron_file(tmp_path / "a", _documents(6))
    b = _megatron_file(tmp_path / "b", _documents(7))
    cache = tmp_path / "cache"
    cfg = MegatronDataConfig(
        sequence_length=SEQ, blend=["30", a, "70", b], split="90,10,0", path_to_cache=str(cache)
    )
    build_datasets(cfg, [200, 10, 0])
    os.remove(glob.glob(str(cache / "*-BlendedDataset-train-tokenload.json"))[0])  # no hash
    path = _cache_file(cache, f"{array}.npy")
    _rewrite(path, change)
    strict = MegatronDataConfig(**{**cfg.__dict__, "cache": "strict"})
    train = build_datasets(strict, [200, 10, 0])[0]
    with pytest.raises(CacheError, match="damaged") as info:
        _tokens(train)
    assert info.value.path == path


def test_short_samples_still_read_with_the_checks(tmp_path):
    """The last partial sample of a valid split kept by drop_last_partial_validation_sequence=False
    is padded; the range checks accept it (and every other valid sample)."""
    prefix = _megatron_file(tmp_path / "data", _documents(8))
    cfg = _config(
        prefix, path_to_cache=str(tmp_path / "c"), drop_last_partial_validation_sequence=False
    )
    valid = build_datasets(cfg, [None, None, 0])[1]
    padded = [i for i in range(len(valid)) if valid.read_batch([i])["padded"]]
    assert len(padded) == 1
    loss_mask = np.asarray(valid.__getitems__(list(range(len(valid))))["loss_mask"])
    assert loss_mask[padded[0]][-1] == 0  # the pad carries no loss
    assert (loss_mask[np.arange(len(valid)) != padded[0]] == 1).all()


# -- empty split -----------------------------------------------------------------------------------


def test_empty_split_error_names_the_split_and_the_file(tmp_path):
    prefix = write_documents(tmp_path / "tiny", [[1, 2, 3, 4, 5]] * 10)
    with pytest.raises(ConfigError, match="valid split") as info:
        cfg = MegatronDataConfig(sequence_length=4, blend=[prefix], split="98,2,0")
        build_datasets(cfg, [100, 10, 0])
    assert str(info.value).startswith(f"{prefix}.bin: ")
    assert "sequences 10..10 of 10" in str(info.value) and "HINT" in str(info.value)


# -- fingerprints ----------------------------------------------------------------------------------


def _fingerprints(prefixes, **overrides):
    blend = [x for p in prefixes for x in ("1", p)] if len(prefixes) > 1 else prefixes
    cfg = MegatronDataConfig(sequence_length=SEQ, blend=blend, split="90,10,0", **overrides)
    train, valid, _ = build_datasets(cfg, [200, 20, 0])
    return train, valid


@pytest.mark.parametrize("sidecar", [True, False], ids=["tokenload-file", "megatron-file"])
@pytest.mark.parametrize("blend", [False, True], ids=["one-prefix", "blend"])
def test_moved_data_keeps_its_fingerprint_and_resumes(tmp_path, sidecar, blend):
    names = ["a", "b"] if blend else ["a"]
    (tmp_path / "old").mkdir()
    for i, n in enumerate(names):
        write_documents(tmp_path / "old" / n, _documents(10 + i))
        if not sidecar:
            os.remove(tmp_path / "old" / f"{n}.json")
    train, valid = _fingerprints([str(tmp_path / "old" / n) for n in names])
    loader = build_dataloader(train, micro_batch_size=2)
    batches = list(itertools.islice(loader, 5))
    state = loader.state_dict()

    shutil.copytree(tmp_path / "old", tmp_path / "new" / "mount")
    shutil.rmtree(tmp_path / "old")
    moved, moved_valid = _fingerprints([str(tmp_path / "new" / "mount" / n) for n in names])
    assert (moved.fingerprint, moved_valid.fingerprint) == (train.fingerprint, valid.fingerprint)
    resumed = build_dataloader(moved, micro_batch_size=2)
    resumed.load_state_dict(state)
    fresh = build_dataloader(moved, micro_batch_size=2)
    expected = list(itertools.islice(fresh, 7))[5:]
    got = list(itertools.islice(resumed, 2))
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g["tokens"].numpy(), e["tokens"].numpy())
    assert len(batches) == 5


@pytest.mark.parametrize("blend", [False, True], ids=["one-prefix", "blend"])
def test_other_data_under_the_same_names_refuses_to_resume(tmp_path, blend):
    """Same paths, same file sizes, documents reordered (a Megatron file has no sidecar hash):
    the fingerprint must change, and a saved state must not load."""
    names = ["a", "b"] if blend else ["a"]
    prefixes = [str(tmp_path / n) for n in names]
    docs = [_documents(20 + i) for i in range(len(names))]
    for p, d in zip(prefixes, docs):
        _megatron_file(p, d)
    train, _ = _fingerprints(prefixes, cache="off")
    state = build_dataloader(train, micro_batch_size=2).state_dict()

    _megatron_file(prefixes[-1], _reordered(docs[-1]))
    other, _ = _fingerprints(prefixes, cache="off")
    assert other.fingerprint != train.fingerprint
    with pytest.raises(StateError, match="fingerprint"):
        build_dataloader(other, micro_batch_size=2).load_state_dict(state)


def test_fingerprint_follows_the_configuration_not_the_cache_folder(tmp_path):
    prefix = _megatron_file(tmp_path / "data", _documents(30))
    a = _fingerprints([prefix], path_to_cache=str(tmp_path / "c1"))[0].fingerprint
    b = _fingerprints([prefix], path_to_cache=str(tmp_path / "c2"))[0].fingerprint
    c = _fingerprints([prefix], cache="off")[0].fingerprint
    other_seed = _fingerprints([prefix], cache="off", random_seed=7)[0].fingerprint
    assert a == b == c != other_seed


def test_an_empty_split_fails_before_any_cache_is_written(tmp_path):
    """prepare-cache over a blend whose test split is empty wrote the train and valid caches (to a
    bucket: uploaded them) before the test split's error; every split is checked first now."""
    prefix = write_documents(tmp_path / "tiny", [[1, 2, 3, 4, 5]] * 10)
    cache = tmp_path / "cache"
    cache.mkdir()
    cfg = MegatronDataConfig(sequence_length=4, blend=[prefix], split="90,9,1", path_to_cache=str(cache))
    with pytest.raises(ConfigError, match="test split"):
        build_datasets(cfg, [20, 2, 3])
    assert not [p for p in cache.rglob("*") if p.is_file()]


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_a_blend_s_cache_serves_every_item_layout(tmp_path, packing, caplog):
    # the blend's arrays change with no item field: a cache written with one layout is a hit,
    # never rebuilt nor refused, with another (each member's own cache is one already)
    a = write_documents(tmp_path / "a", _documents(1), dtype=np.int32)
    b = write_documents(tmp_path / "b", _documents(2), dtype=np.int32)
    cache = str(tmp_path / "cache")

    def build(**fields):
        cfg = MegatronDataConfig(
            sequence_length=SEQ,
            blend=["0.3", a, "0.7", b],
            split="1,0,0",
            packing=packing,
            path_to_cache=cache,
            eod_id=1,
            **fields,
        )
        train = build_datasets(cfg, [100, 0, 0])[0]
        assert train is not None
        return train.__getitems__(list(range(100)))

    plain = build()
    written = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(cache, "*Blended*"))}
    assert written
    with caplog.at_level("INFO", logger="tokenload"):
        masked = build(cache="strict", inter_document_masking=True, eod_mask_loss=True)
        again = build(build_policy="none", reset_position_ids=True)
    assert not [r for r in caplog.records if "stale" in r.getMessage()]
    assert written == {p: os.path.getmtime(p) for p in written}  # nothing rewritten
    for served in (masked, again):
        assert (served["tokens"] == plain["tokens"]).all()
        assert (served["dataset_id"] == plain["dataset_id"]).all()


def test_a_packed_plan_without_its_sidecar_is_never_used(tmp_path):
    # only tokenload writes packed plans, always with a sidecar of digests: without it a flipped
    # bit would be a valid-looking row, so the plan is stale (rebuilt, or a CacheError)
    prefix = write_documents(tmp_path / "a", _documents(1, count=300), dtype=np.int32)
    cache = str(tmp_path / "cache")

    def rows(**fields):
        cfg = MegatronDataConfig(
            sequence_length=SEQ,
            blend=[prefix],
            split="1,0,0",
            packing="best-fit",
            path_to_cache=cache,
            **fields,
        )
        train = build_datasets(cfg, [200, 0, 0])[0]
        assert train is not None
        return train.__getitems__(list(range(200)))["tokens"]

    want = rows()
    os.remove(_cache_file(cache, "tokenload.json"))
    pieces = _cache_file(cache, "piece_index.npy")
    data = bytearray(Path(pieces).read_bytes())
    data[-8] ^= 1  # another sequence, still in range
    Path(pieces).write_bytes(bytes(data))
    with pytest.raises(CacheError, match="sidecar"):
        rows(cache="strict")
    assert (rows() == want).all()  # auto: rebuilt, with its sidecar
    assert os.path.exists(_cache_file(cache, "tokenload.json"))
    assert (rows(build_policy="none") == want).all()
