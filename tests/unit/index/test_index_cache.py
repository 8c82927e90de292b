"""Cache identity (description JSON, md5, names) and cache files (atomic writes, checks)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from index_megatron_driver import NULL_TOKENIZER

from tokenload.caches import (
    CacheFiles,
    CacheState,
    blended_identifiers,
    check_cache,
    default_cache_dir,
    describe,
    description_hash,
    gpt_identifiers,
    load_cache,
    write_cache,
)
from tokenload.caches import files as cache_io
from tokenload.errors import CacheError
from tokenload.index import split_matrix


def _gold(path="gold/x", num_samples=40, split="train"):
    return gpt_identifiers(dataset_path=path, num_samples=num_samples, index_split=split,
                           random_seed=1234, sequence_length=8, split="80,20,0",
                           split_matrix=split_matrix("80,20,0"), tokenizer=NULL_TOKENIZER)


def test_golden_hashes():
    assert description_hash(describe(_gold())) == "c8a387995ea324804756a4d0236dea68"
    assert description_hash(describe(_gold(num_samples=5, split="valid"))) == (
        "5fb979aa2b07de39f62d8b80a87a7111")
    blended = blended_identifiers(datasets=[_gold("gold/x", 13), _gold("gold/y", 29)],
                                  split="train", weights=[0.3, 0.7], size=40)
    assert description_hash(describe(blended)) == "4ae5187173fef3a2732ce61fccd4d22c"


def test_description_shape():
    text = describe(_gold())
    assert list(json.loads(text)) == ["class", "dataset_path", "num_samples", "index_split",
                                      "random_seed", "sequence_length", "split", "split_matrix",
                                      "tokenizer"]
    assert '    "split_matrix": [\n        [\n            0,\n            0.8\n' in text
    assert not text.endswith("\n")
    per_split = gpt_identifiers(dataset_path="p", num_samples=None, index_split="train",
                                random_seed=1, sequence_length=8, split=None, split_matrix=None,
                                tokenizer=NULL_TOKENIZER)
    assert '"num_samples": null' in describe(per_split) and '"split": null' in describe(per_split)


def test_file_names_and_default_dir():
    files = CacheFiles.of("/c", _gold())
    assert files.array("sample_index") == (
        "/c/c8a387995ea324804756a4d0236dea68-GPTDataset-train-sample_index.npy")
    assert files.description.endswith("-GPTDataset-train-description.txt")
    assert files.sidecar.endswith("-GPTDataset-train-tokenload.json")
    assert len(files.megatron_files) == 4
    blended = CacheFiles.of("/c", blended_identifiers(datasets=[_gold()], split="valid",
                                                      weights=[1.0], size=3))
    assert blended.class_name == "BlendedDataset" and blended.split == "valid"
    assert [os.path.basename(p).split("-", 3)[3] for p in blended.megatron_files] == [
        "description.txt", "dataset_index.npy", "dataset_sample_index.npy"]
    assert default_cache_dir("/data/web") == "/data/web/cache/GPTDataset_indices"


def _arrays():
    return {"document_index": np.arange(6, dtype=np.int32)[::-1].copy(),
            "sample_index": np.array([[0, 0], [1, 3], [4, 2]], dtype=np.int32),
            "shuffle_index": np.array([1, 0], dtype=np.uint32)}


FIELDS = {"add_extra_token": True, "drop_last": True, "sources": {"gold/x": "abc"}}


def test_write_load_and_hit(tmp_path):
    uid = _gold()
    files = CacheFiles.of(tmp_path / "cache", uid)
    assert check_cache(files, description=describe(uid)).state is CacheState.MISS
    write_cache(files, description=describe(uid), arrays=_arrays(), fields=FIELDS)
    loaded = load_cache(files)
    for name, arr in _arrays().items():
        np.testing.assert_array_equal(loaded[name], arr)
        assert loaded[name].dtype == arr.dtype
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=True)  # what Megatron writes
        with open(files.array(name), "rb") as f:
            assert f.read() == buf.getvalue()
    with open(files.description) as f:
        assert f.read() == describe(uid)
    shapes = {"sample_index": (3, 2), "shuffle_index": (2,)}
    check = check_cache(files, description=describe(uid), fields=FIELDS, expected_shapes=shapes)
    assert check.state is CacheState.HIT and check.reasons == () and check.has_sidecar
    assert not [p for p in os.listdir(files.directory) if ".tmp" in p]


def test_an_empty_array_is_written_checked_and_loaded(tmp_path):
    # as an empty split's arrays are
    uid = _gold()
    files = CacheFiles.of(tmp_path / "cache", uid)
    arrays = {**_arrays(), "sample_index": np.zeros((0, 2), dtype=np.int32)}
    write_cache(files, description=describe(uid), arrays=arrays, fields=FIELDS)
    check = check_cache(files, description=describe(uid), fields=FIELDS)
    assert check.state is CacheState.HIT and check.reasons == ()
    loaded = load_cache(files)
    assert loaded["sample_index"].shape == (0, 2) and loaded["sample_index"].dtype == np.int32
    assert cache_io.array_digests({"e": np.zeros(0)}) != cache_io.array_digests({"e": np.zeros(1)})


def test_stale_when_the_hash_forgets_something(tmp_path):
    uid = _gold()
    files = CacheFiles.of(tmp_path, uid)
    write_cache(files, description=describe(uid), arrays=_arrays(), fields=FIELDS)
    other = dict(FIELDS, add_extra_token=False)
    check = check_cache(files, description=describe(uid), fields=other)
    assert check.state is CacheState.STALE and "add_extra_token" in check.reasons[0]
    check = check_cache(files, description=describe(uid), fields=FIELDS,
                        expected_shapes={"sample_index": (4, 2)})
    assert check.state is CacheState.STALE


def test_stale_on_truncated_array_and_foreign_description(tmp_path):
    uid = _gold()
    files = CacheFiles.of(tmp_path, uid)
    write_cache(files, description=describe(uid), arrays=_arrays(), fields=FIELDS)
    with open(files.array("document_index"), "r+b") as f:
        f.truncate(os.path.getsize(files.array("document_index")) - 4)
    check = check_cache(files, description=describe(uid), fields=FIELDS)
    assert check.state is CacheState.STALE and "truncated" in " ".join(check.reasons)
    with open(files.description, "w") as f:
        f.write("{}")
    assert check_cache(files, description=describe(uid), fields=FIELDS).state is CacheState.STALE


def test_megatron_built_cache_without_sidecar(tmp_path):
    """Megatron's own cache: a hit checked on description and array shapes only."""
    uid = _gold()
    files = CacheFiles.of(tmp_path, uid)
    for name, arr in _arrays().items():
        np.save(files.array(name), arr, allow_pickle=True)
    with open(files.description, "w") as f:
        f.write(describe(uid))
    check = check_cache(files, description=describe(uid), fields=FIELDS)
    assert check.state is CacheState.HIT and not check.has_sidecar
    bad = check_cache(files, description=describe(uid), expected_shapes={"shuffle_index": (9,)})
    assert bad.state is CacheState.STALE


def test_crash_mid_write_never_leaves_a_complete_cache(tmp_path, monkeypatch):
    uid = _gold()
    files = CacheFiles.of(tmp_path, uid)
    real_save, calls = np.save, []

    def flaky_save(f, arr, **kw):
        calls.append(1)
        if len(calls) == 2:
            f.write(b"partial")
            raise KeyboardInterrupt  # a kill in the middle of the second array
        return real_save(f, arr, **kw)

    monkeypatch.setattr(cache_io.np, "save", flaky_save)
    with pytest.raises(KeyboardInterrupt):
        write_cache(files, description=describe(uid), arrays=_arrays(), fields=FIELDS)
    assert os.listdir(tmp_path) == []  # no file is put in place before all are written
    assert check_cache(files, description=describe(uid)).state is CacheState.MISS


def test_unwritable_folder_is_a_cache_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    files = CacheFiles.of(blocker / "cache", _gold())
    with pytest.raises(CacheError, match="HINT"):
        write_cache(files, description=describe(_gold()), arrays=_arrays())
    with pytest.raises(CacheError):
        write_cache(CacheFiles.of(tmp_path, _gold()), description="", arrays={})


def test_load_refuses_broken_arrays(tmp_path):
    files = CacheFiles.of(tmp_path, _gold())
    with pytest.raises(CacheError):
        load_cache(files)


def _damage(path: str, old: bytes, new: bytes) -> None:
    raw = Path(path).read_bytes()
    assert old in raw[:128]
    with open(path, "wb") as f:
        f.write(raw.replace(old, new, 1))


@pytest.mark.parametrize(
    "old,new",
    [(b",)", b", "), (b"'descr'", b"'descr "), (b"NUMPY\x01", b"NUMPY\x07")],
    ids=["tokenize-error", "value-error", "npy-version"],
)
def test_damaged_npy_header_is_stale_and_a_cache_error_naming_the_file(tmp_path, old, new):
    """NumPy raises tokenize.TokenError, ValueError or SyntaxError on a damaged header: check_cache
    reports it as stale and load_cache as a CacheError naming the file."""
    files = CacheFiles.of(tmp_path, _gold())
    write_cache(files, description=describe(_gold()), arrays=_arrays())
    _damage(files.array("shuffle_index"), old, new)
    check = check_cache(files, description=describe(_gold()))
    assert check.state is CacheState.STALE and "shuffle_index: unreadable" in check.reasons[0]
    with pytest.raises(CacheError) as info:
        load_cache(files)
    assert info.value.path == files.array("shuffle_index") and "HINT" in str(info.value)


def test_non_integer_cache_array_is_stale(tmp_path):
    """A Megatron cache (no sidecar) whose array is not of an integer dtype cannot be an index."""
    files = CacheFiles.of(tmp_path, _gold())
    arrays = _arrays()
    write_cache(files, description=describe(_gold()), arrays=arrays)
    os.remove(files.sidecar)
    np.save(files.array("shuffle_index"), arrays["shuffle_index"].astype(np.float64))
    check = check_cache(files, description=describe(_gold()))
    assert check.state is CacheState.STALE
    assert "expected an integer dtype" in "; ".join(check.reasons)


def test_a_failed_write_says_when_the_filesystem_is_full(tmp_path, monkeypatch):
    import errno

    path = str(tmp_path / "x.npy")
    full = OSError(errno.ENOSPC, "No space left on device")
    assert "the filesystem is full" in cache_io.write_failure(full, path)
    short = OSError("4386 requested and 992 written")  # numpy's short write: no errno
    assert cache_io.write_failure(short, path) == "4386 requested and 992 written"  # room left

    class Stats:
        f_bavail, f_frsize = 3, 4096

    monkeypatch.setattr(cache_io.os, "statvfs", lambda folder: Stats())
    assert "the filesystem is full (12,288 bytes free)" in cache_io.write_failure(short, path)


def test_a_failed_write_into_a_folder_asks_that_folder_s_filesystem(tmp_path, monkeypatch):
    """A cache folder that is a mount point (a full tmpfs) is its own filesystem: the room left
    is the folder's, not its parent's (red-team finding: the message lacked "the filesystem is
    full" when the cache folder was the mount point itself)."""
    asked: list[str] = []

    class Stats:
        f_bavail, f_frsize = 3, 4096

    def statvfs(folder):
        asked.append(folder)
        return Stats()

    monkeypatch.setattr(cache_io.os, "statvfs", statvfs)
    short = OSError("4386 requested and 992 written")
    assert "the filesystem is full" in cache_io.write_failure(short, str(tmp_path))
    assert "the filesystem is full" in cache_io.write_failure(short, str(tmp_path / "x.npy"))
    assert asked == [str(tmp_path), str(tmp_path)]
