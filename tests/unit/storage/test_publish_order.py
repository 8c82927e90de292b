"""The order in which outputs go up to object storage, without a server: a token file's old
``.idx`` deleted first and the new one uploaded last (after ``.bin`` and the sidecar); a cache's
description last, after its arrays and sidecar, never deleted when the bucket holds the same cache
(another writer's), and each writer staging in a folder of its own. A changed order was caught
only by the SeaweedFS tests before; these run in well under a second."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tokenload.caches import bucket as cache_remote
from tokenload.caches.names import GPT_ARRAYS, CacheFiles
from tokenload.errors import StorageError
from tokenload.storage import upload

URL = "s3://bucket/out/part"


class Store:
    """An object store in memory that records each operation and can fail the n-th upload."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.objects: dict[str, bytes] = {}
        self.ops: list[tuple[str, str]] = []
        self.fail_at = fail_at
        self.uploads = 0

    def upload_file(self, local: str, url: str, options=None) -> None:
        self.uploads += 1
        if self.uploads == self.fail_at:
            raise StorageError("cannot upload it: connection dropped", path=url, hint="retry")
        with open(local, "rb") as f:
            self.objects[url] = f.read()
        self.ops.append(("put", url))

    def remove_object(self, url: str, options=None) -> None:
        self.objects.pop(url, None)
        self.ops.append(("rm", url))

    def read_object(self, url: str, options=None) -> bytes | None:
        self.ops.append(("read", url))
        return self.objects.get(url)


@pytest.fixture
def staged(tmp_path):
    def make(*suffixes: str) -> str:
        prefix = tmp_path / "part"
        for suffix in suffixes:
            prefix.with_name("part" + suffix).write_bytes(suffix.encode())
        return str(prefix)

    return make


def _patch(monkeypatch, module, store: Store) -> None:
    for name in ("upload_file", "remove_object", "read_object"):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, getattr(store, name))


def _short(ops, base: str) -> list[tuple[str, str]]:
    return [(op, url.removeprefix(base)) for op, url in ops]


def test_a_token_file_goes_up_bin_then_sidecar_then_index(monkeypatch, staged):
    store = Store()
    _patch(monkeypatch, upload, store)
    upload.publish_prefix(staged(".bin", ".idx", ".json"), URL)
    assert _short(store.ops, URL) == [
        ("rm", ".idx"), ("put", ".bin"), ("put", ".json"), ("put", ".idx")]


def test_a_token_file_without_sidecar_removes_the_old_sidecar_before_its_index(monkeypatch, staged):
    store = Store()
    store.objects[URL + ".json"] = b"an old sidecar describing other bytes"
    _patch(monkeypatch, upload, store)
    upload.publish_prefix(staged(".bin", ".idx"), URL)
    assert _short(store.ops, URL) == [
        ("rm", ".idx"), ("put", ".bin"), ("rm", ".json"), ("put", ".idx")]
    assert set(store.objects) == {URL + ".bin", URL + ".idx"}


@pytest.mark.parametrize("fail_at", [1, 2, 3])
def test_a_failed_token_file_upload_leaves_no_index(monkeypatch, staged, fail_at):
    """Whatever upload fails, the bucket holds no ``.idx`` (a reader sees no file), even where an
    old one was: a new ``.bin`` is never paired with an old index."""
    store = Store(fail_at=fail_at)
    store.objects[URL + ".idx"] = b"the old index"
    _patch(monkeypatch, upload, store)
    with pytest.raises(StorageError):
        upload.publish_prefix(staged(".bin", ".idx", ".json"), URL)
    assert URL + ".idx" not in store.objects


# -- index caches ------------------------------------------------------------------------------

REMOTE = CacheFiles(directory="s3://bucket/cache", hash="0123abcd", class_name="GPTDataset",
                    split="train", arrays=GPT_ARRAYS)


def _local_cache(tmp_path, name: str = "local", sidecar: bytes = b"{sidecar}") -> CacheFiles:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    local = CacheFiles(directory=str(folder), hash=REMOTE.hash, class_name=REMOTE.class_name,
                       split=REMOTE.split, arrays=REMOTE.arrays)
    for array in local.arrays:
        with open(local.array(array), "wb") as f:
            f.write(array.encode())
    with open(local.sidecar, "wb") as f:
        f.write(sidecar)
    with open(local.description, "wb") as f:
        f.write(b"{description}")
    return local


def _names(ops) -> list[tuple[str, str]]:
    return [(op, url.rsplit("-", 1)[1]) for op, url in ops if op != "read"]


def test_a_cache_goes_up_arrays_then_sidecar_then_description(monkeypatch, tmp_path):
    store = Store()
    _patch(monkeypatch, cache_remote, store)
    assert cache_remote.publish_cache(_local_cache(tmp_path), REMOTE) is True
    assert _names(store.ops) == [("put", f"{a}.npy") for a in GPT_ARRAYS] + [
        ("put", "tokenload.json"), ("put", "description.txt")]


def test_a_stale_cache_loses_its_description_before_any_array_changes(monkeypatch, tmp_path):
    store = Store()
    _patch(monkeypatch, cache_remote, store)
    cache_remote.publish_cache(_local_cache(tmp_path, sidecar=b"{old fields}"), REMOTE)
    store.ops.clear()
    cache_remote.publish_cache(_local_cache(tmp_path, "new", sidecar=b"{new fields}"), REMOTE)
    assert _names(store.ops) == [("rm", "description.txt"),
                                 *[("put", f"{a}.npy") for a in GPT_ARRAYS],
                                 ("put", "tokenload.json"), ("put", "description.txt")]
    assert store.objects[REMOTE.sidecar] == b"{new fields}"


def test_the_same_cache_published_by_another_writer_is_kept_in_place(monkeypatch, tmp_path, caplog):
    """The loser of two writers of one job: the description never disappears (a reader of the
    winner's cache never sees a miss); the arrays go up again (the same bytes, or a repair)."""
    caplog.set_level("INFO", logger="tokenload")
    store = Store()
    _patch(monkeypatch, cache_remote, store)
    cache_remote.publish_cache(_local_cache(tmp_path, "winner"), REMOTE)
    store.ops.clear()
    assert cache_remote.publish_cache(_local_cache(tmp_path, "loser"), REMOTE) is False
    assert _names(store.ops) == [("put", f"{a}.npy") for a in GPT_ARRAYS]
    assert "already published" in caplog.text and "another writer" in caplog.text


def _complete_looking_is_whole(store: Store, want: dict[str, bytes]) -> None:
    """A description in the bucket means every array and the sidecar are there, as written."""
    if REMOTE.description in store.objects:
        for url in [REMOTE.sidecar, *(REMOTE.array(a) for a in REMOTE.arrays)]:
            assert store.objects.get(url) == want[url], url


@pytest.mark.parametrize("first_fails_at", [1, 2, 3, 4, 5])
def test_two_failed_writers_never_leave_a_cache_that_looks_complete(monkeypatch, tmp_path,
                                                                   first_fails_at):
    """Writer one fails at each of its uploads in turn, then writer two at each of its own (a
    stale cache was there before): no state between or after looks complete unless it is."""
    stale = {REMOTE.description: b"{description}", REMOTE.sidecar: b"{old fields}",
             **{REMOTE.array(a): b"old " + a.encode() for a in REMOTE.arrays}}
    local = _local_cache(tmp_path, sidecar=b"{new fields}")
    want = {url: Path(url.replace(REMOTE.directory, local.directory)).read_bytes() for url in stale}
    for second_fails_at in range(1, 6):
        store = Store(fail_at=first_fails_at)
        store.objects.update(stale)
        _patch(monkeypatch, cache_remote, store)
        with pytest.raises(StorageError):
            cache_remote.publish_cache(local, REMOTE)
        _complete_looking_is_whole(store, want)
        store.uploads, store.fail_at = 0, second_fails_at
        with pytest.raises(StorageError):
            cache_remote.publish_cache(local, REMOTE)
        _complete_looking_is_whole(store, want)


def test_each_cache_writer_stages_in_a_folder_of_its_own(monkeypatch, tmp_path):
    """Two writers of one cache on one host (two prepare-cache runs): the first to finish removes
    only its own staged files, never the other's still to upload."""
    monkeypatch.setenv("TOKENLOAD_STAGING_DIR", str(tmp_path / "staging"))
    with cache_remote.staged_cache(REMOTE) as first, cache_remote.staged_cache(REMOTE) as second:
        assert first.directory != second.directory
        for local in (first, second):
            with open(local.description, "wb") as f:
                f.write(b"{description}")
    assert not list((tmp_path / "staging").iterdir())  # both removed once done
    writers = [cache_remote.staged_cache(REMOTE) for _ in range(2)]
    _one, two = (w.__enter__() for w in writers)
    with open(two.description, "wb") as f:
        f.write(b"{description}")
    writers[0].__exit__(None, None, None)
    with open(two.description, "rb") as f:  # still there for its upload
        assert f.read() == b"{description}"
    writers[1].__exit__(None, None, None)
    assert not any(itertools.chain((tmp_path / "staging").iterdir()))


def test_an_upload_whose_local_file_is_gone_says_so(monkeypatch, tmp_path):
    """Not "the object does not exist" with a hint about PREFIX.idx (what a staged file removed
    by another writer used to give): the local file is named, and the staging folder."""
    for name, value in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k",
                        "AWS_SECRET_ACCESS_KEY": "s", "TOKENLOAD_RETRIES": "0"}.items():
        monkeypatch.setenv(name, value)
    gone = tmp_path / "staged-description.txt"
    with pytest.raises(StorageError) as caught:
        upload.upload_file(str(gone), "s3://bucket/cache/x-description.txt")
    assert f"the local file {gone} is gone" in caught.value.message
    assert "TOKENLOAD_STAGING_DIR" in caught.value.hint
