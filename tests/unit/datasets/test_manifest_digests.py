"""A build manifest carries each cached array's digest (issue 34, point 8): ``build_policy="none"``
verifies every array it maps against the manifest, so a damaged array is a ``CacheError`` naming
the file even when the cache's sidecar is gone or unreadable (it was served unchecked: other
samples, no error). The digests are the xxh3-64 of each ``.npy``'s data bytes, computed here
with xxhash itself."""

from __future__ import annotations

import glob
import json
import os
import pickle

import numpy as np
import pytest
import xxhash

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import CacheError

SEQ = 8
SIZES = [200, 10, 0]


def _documents(seed: int, count: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.integers(0, 1000, size=3 + i)) for i in range(count)]


def _tokens(ds) -> np.ndarray:
    return ds.__getitems__(list(range(len(ds))))["tokens"]


def _config(tmp_path, **overrides) -> MegatronDataConfig:
    a = write_documents(tmp_path / "a", _documents(6))
    b = write_documents(tmp_path / "b", _documents(7))
    return MegatronDataConfig(sequence_length=SEQ, blend=["30", a, "70", b], split="90,10,0",
                              path_to_cache=str(tmp_path / "cache"), **overrides)


def _none(cfg: MegatronDataConfig) -> MegatronDataConfig:
    return MegatronDataConfig(**{**cfg.__dict__, "build_policy": "none"})


def _array(cache, kind: str, array: str) -> str:
    return sorted(glob.glob(os.path.join(cache, f"*-{kind}-train-{array}.npy")))[0]


def _swap_two(path: str) -> None:
    """Two entries of different values swapped: every value still in range, same dtype and
    shape (the per-batch range checks cannot see it)."""
    a = np.load(path)
    other = int(np.flatnonzero(a != a[0])[0])
    a[0], a[other] = a[other], a[0]
    np.save(path, a)


def _sidecar(path: str) -> str:
    return path.rsplit("-", 1)[0] + "-tokenload.json"


def _garble(sidecar: str) -> None:
    with open(sidecar, "wb") as f:
        f.write(b"\x00{not json")


def _drop_digests(sidecar: str) -> None:
    with open(sidecar) as f:
        data = json.load(f)
    for record in data["arrays"].values():
        record.pop("xxh3_64")
    with open(sidecar, "w") as f:
        json.dump(data, f)


SIDECAR_DAMAGE = {
    "removed": os.remove,
    "garbled": lambda p: _garble(p),
    "without digests": _drop_digests,
}
ARRAYS = [("GPTDataset", "shuffle_index"), ("GPTDataset", "document_index"),
          ("BlendedDataset", "dataset_sample_index"), ("BlendedDataset", "dataset_index")]


@pytest.mark.parametrize("sidecar", list(SIDECAR_DAMAGE))
@pytest.mark.parametrize(("kind", "array"), ARRAYS, ids=[a for _, a in ARRAYS])
def test_a_damaged_array_without_its_sidecar_is_a_cache_error_under_none(tmp_path, kind, array,
                                                                          sidecar):
    cfg = _config(tmp_path)
    sound = _tokens(build_datasets(cfg, SIZES)[0])
    path = _array(cfg.path_to_cache, kind, array)
    _swap_two(path)
    SIDECAR_DAMAGE[sidecar](_sidecar(path))
    train = build_datasets(_none(cfg), SIZES)[0]
    assert len(train) == len(sound)
    shipped = pickle.loads(pickle.dumps(train))  # a loader worker maps the arrays itself
    with pytest.raises(CacheError, match=r"xxh3-64 is .* the index cache is damaged") as info:
        _tokens(shipped)
    assert info.value.path == path and "build manifest" in str(info.value)
    assert "HINT" in str(info.value)


@pytest.mark.parametrize("sidecar", list(SIDECAR_DAMAGE))
def test_a_sound_cache_without_its_sidecars_serves_the_same_samples_under_none(tmp_path,
                                                                               sidecar):
    cfg = _config(tmp_path)
    sound = _tokens(build_datasets(cfg, SIZES)[0])
    for path in glob.glob(os.path.join(cfg.path_to_cache, "*-tokenload.json")):
        SIDECAR_DAMAGE[sidecar](path)
    np.testing.assert_array_equal(_tokens(build_datasets(_none(cfg), SIZES)[0]), sound)


def test_the_manifest_records_each_arrays_xxh3_of_its_data(tmp_path):
    cfg = _config(tmp_path)
    build_datasets(cfg, SIZES)
    (manifest,) = glob.glob(os.path.join(cfg.path_to_cache, "*-tokenload-build.json"))
    with open(manifest) as f:
        splits = json.load(f)["splits"]
    entries = [e for e in splits if e is not None]
    entries += [m for e in entries for m in e.get("members", [])]
    checked = 0
    for entry in entries:
        assert set(entry["digests"]) == set(entry["arrays"])
        for name, file in entry["arrays"].items():
            data = np.ascontiguousarray(np.load(os.path.join(cfg.path_to_cache, file)))
            assert entry["digests"][name] == xxhash.xxh3_64_hexdigest(data.tobytes())
            checked += 1
    assert checked == 2 * 3 + 2 + 2 * 3 + 2  # train and valid: 2 GPT datasets and a blend each


def test_a_manifest_over_megatron_caches_carries_the_digests_of_what_was_checked(tmp_path):
    """Caches without sidecars (Megatron's) and no manifest: the writer of the next build checks
    them against the token files, and its manifest records their digests; damage after that is
    refused under none."""
    cfg = _config(tmp_path)
    sound = _tokens(build_datasets(cfg, SIZES)[0])
    for path in glob.glob(os.path.join(cfg.path_to_cache, "*tokenload*.json")):
        os.remove(path)
    np.testing.assert_array_equal(_tokens(build_datasets(cfg, SIZES)[0]), sound)
    assert glob.glob(os.path.join(cfg.path_to_cache, "*-tokenload-build.json"))
    assert not glob.glob(os.path.join(cfg.path_to_cache, "*-tokenload.json"))
    np.testing.assert_array_equal(_tokens(build_datasets(_none(cfg), SIZES)[0]), sound)
    path = _array(cfg.path_to_cache, "GPTDataset", "shuffle_index")
    _swap_two(path)
    with pytest.raises(CacheError, match="xxh3-64") as info:
        _tokens(pickle.loads(pickle.dumps(build_datasets(_none(cfg), SIZES)[0])))
    assert info.value.path == path


@pytest.mark.parametrize("change", ["version 1", "an entry without digests"])
def test_a_manifest_without_digests_is_ignored(tmp_path, change, caplog):
    """A manifest written before digests were recorded (version 1), or one that lost an entry's,
    is not used: the caches are checked one by one, as ``auto`` checks them (here: their
    sidecars record the damage)."""
    cfg = _config(tmp_path)
    build_datasets(cfg, SIZES)
    (manifest,) = glob.glob(os.path.join(cfg.path_to_cache, "*-tokenload-build.json"))
    with open(manifest) as f:
        data = json.load(f)
    if change == "version 1":
        data["version"] = 1
        for entry in filter(None, data["splits"]):
            for e in [entry, *entry.get("members", [])]:
                e.pop("digests")
    else:
        data["splits"][0]["members"][1]["digests"].pop("shuffle_index")
    with open(manifest, "w") as f:
        json.dump(data, f)
    path = _array(cfg.path_to_cache, "GPTDataset", "shuffle_index")
    _swap_two(path)
    with pytest.raises(CacheError, match=r"stale|damaged"):
        _tokens(build_datasets(_none(cfg), SIZES)[0])
    assert "ignoring build manifest" in caplog.text


def test_the_damaged_array_hint_under_none_leads_back_to_a_sound_cache(tmp_path):
    """What the damaged-array error says to do under ``build_policy="none"`` works as written
    (a new user's finding: it told a job already on ``cache='auto'`` to use ``cache='auto'``,
    which rebuilds nothing under ``none``): the hint names this build's prepare-cache command;
    deleting the files of that hash and running it makes the same samples again. A load from
    the build manifest probes no file, so the command is in the damage's hint itself."""
    import shlex

    from support import run_cli

    cfg = _config(tmp_path)
    sound = _tokens(build_datasets(cfg, SIZES)[0])
    path = _array(cfg.path_to_cache, "GPTDataset", "shuffle_index")
    _swap_two(path)
    with pytest.raises(CacheError, match="the index cache is damaged") as info:
        _tokens(pickle.loads(pickle.dumps(build_datasets(_none(cfg), SIZES)[0])))  # a worker's
    hint = info.value.hint
    assert "cache='auto'" not in hint
    command = hint.split("prepare them again with: ", 1)[1]
    for stale in glob.glob(path.rsplit("-", 1)[0] + "-*"):  # same name up to '-{array}.npy'
        os.remove(stale)
    done = run_cli(*shlex.split(command)[1:])
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(_tokens(build_datasets(_none(cfg), SIZES)[0]), sound)
    train = build_datasets(_none(cfg), SIZES)[0]
    member = train.datasets[0].indices  # values out of range name the same command
    assert member.corrupt("shuffle_index", "x", "y").hint.endswith(f"again with: {command}")
    with open(path, "wb") as f:  # unreadable
        f.write(b"not a npy file")
    with pytest.raises(CacheError, match="cannot load the cached index array") as unreadable:
        _tokens(pickle.loads(pickle.dumps(train)))
    assert unreadable.value.hint.endswith(f"prepare them again with: {command}")
