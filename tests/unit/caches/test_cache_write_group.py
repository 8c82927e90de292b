"""Durability by group (format.atomic.WriteGroup, caches.CacheWriter) and the folder listing
that replaces a lookup per cache file: what is in place when, what one build costs in fsyncs,
syncfs and lookups, what a failed sync or a kill leaves, and the fallback to an fsync per file."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from support import write_small_blend
from tokenload.caches import (
    CacheFiles,
    CacheState,
    CacheWriter,
    check_cache,
    describe,
    gpt_identifiers,
    list_folder,
    write_cache,
)
from tokenload.caches import files as cache_io
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import CacheError
from tokenload.format import atomic


def _uid(path="gold/x", split="train"):
    return gpt_identifiers(dataset_path=path, num_samples=40, index_split=split, random_seed=1,
                           sequence_length=8, split=None, split_matrix=None, tokenizer=None)


def _arrays():
    return {"document_index": np.arange(6, dtype=np.int32),
            "sample_index": np.array([[0, 0], [1, 3], [4, 2]], dtype=np.int32),
            "shuffle_index": np.array([1, 0], dtype=np.uint32)}


class _Calls:
    """Counts os.fsync and syncfs calls and records renames, in order."""

    def __init__(self, monkeypatch):
        self.events: list[tuple[str, str]] = []
        real_fsync, real_replace, real_syncfs = os.fsync, os.replace, atomic.syncfs
        monkeypatch.setattr(atomic.os, "fsync", lambda fd: (self.events.append(("fsync", "")), real_fsync(fd))[1])
        monkeypatch.setattr(
            atomic.os,
            "replace",
            lambda a, b: (self.events.append(("rename", os.path.basename(b))), real_replace(a, b))[
                1
            ],
        )
        monkeypatch.setattr(atomic, "syncfs", lambda fd: (self.events.append(("syncfs", "")), real_syncfs(fd))[1])

    def count(self, kind):
        return sum(1 for k, _ in self.events if k == kind)


@pytest.fixture
def grouped_fs(tmp_path, monkeypatch):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        if not atomic.group_sync_supported(fd):
            pytest.skip("no syncfs for this filesystem or kernel")
    finally:
        os.close(fd)
    monkeypatch.setattr(atomic, "dirty_bytes", lambda: 0)  # no other writer's pages to avoid


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_nothing_is_in_place_before_publish_then_everything_in_order(tmp_path, monkeypatch, grouped_fs):
    calls = _Calls(monkeypatch)
    writer = CacheWriter()
    one, two = CacheFiles.of(tmp_path, _uid("p1")), CacheFiles.of(tmp_path / "sub", _uid("p2"))
    for files in (one, two):
        writer.add(files, description=describe(_uid()), arrays=_arrays(), fields={"x": 1})
    writer.write_last(str(tmp_path / "manifest.json"), b"{}")
    names = sorted(os.listdir(tmp_path))
    assert all(n.startswith(".") and ".tmp-" in n for n in names if n != "sub"), names
    assert check_cache(one, description=describe(_uid())).state is not CacheState.HIT
    assert calls.count("fsync") == 0 and calls.count("syncfs") == 0  # no fsync per file
    writer.publish()
    # one syncfs for the filesystem, one fsync per folder, the manifest's folder once more
    assert calls.count("syncfs") == 1 and calls.count("fsync") == 3
    renamed = [name for kind, name in calls.events if kind == "rename"]
    for files in (one, two):
        mine = [n for n in renamed if n.startswith(files.hash)]
        assert [n.split("-", 3)[3] for n in mine] == [
            "document_index.npy", "sample_index.npy", "shuffle_index.npy", "tokenload.json",
            "description.txt"]
    assert renamed[-1] == "manifest.json"
    sync_at = next(i for i, (k, _) in enumerate(calls.events) if k == "syncfs")
    first_rename = next(i for i, (k, _) in enumerate(calls.events) if k == "rename")
    assert sync_at < first_rename  # durable before anything is in place
    last_rename = len(calls.events) - 1 - [k for k, _ in calls.events][::-1].index("rename")
    assert calls.events[last_rename - 1][0] == "fsync"  # the caches' folder fsynced before it
    for files in (one, two):
        check = check_cache(files, description=describe(_uid()), fields={"x": 1})
        assert check.state is CacheState.HIT and check.has_sidecar
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_fsync_per_file_without_syncfs(tmp_path, monkeypatch):
    monkeypatch.setenv(atomic.SYNC_ENV, "fsync")
    calls = _Calls(monkeypatch)
    files = CacheFiles.of(tmp_path, _uid())
    write_cache(files, description=describe(_uid()), arrays=_arrays())
    assert calls.count("syncfs") == 0
    assert calls.count("fsync") == 5 + 1  # each of the 5 files, then the folder
    assert check_cache(files, description=describe(_uid())).state is CacheState.HIT


def test_unsupported_filesystem_falls_back_to_fsync_per_file(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "group_sync_supported", lambda fd: False)
    calls = _Calls(monkeypatch)
    files = CacheFiles.of(tmp_path, _uid())
    write_cache(files, description=describe(_uid()), arrays=_arrays())
    assert calls.count("syncfs") == 0 and calls.count("fsync") == 6


def test_a_failed_syncfs_puts_nothing_in_place_and_leaves_no_temporary(tmp_path, monkeypatch, grouped_fs):
    def broken(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(atomic, "syncfs", broken)
    monkeypatch.setattr(atomic, "KEEP_OPEN", 0)  # a cache's 5 files: the syncfs path
    files = CacheFiles.of(tmp_path, _uid())
    with pytest.raises(CacheError) as info:
        write_cache(files, description=describe(_uid()), arrays=_arrays())
    assert "Input/output error" in str(info.value) and "HINT" in str(info.value)
    assert os.listdir(tmp_path) == []


def test_a_failed_rename_leaves_no_temporary(tmp_path, monkeypatch):
    real = os.replace
    done = []

    def flaky(a, b):
        if len(done) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        done.append(b)
        return real(a, b)

    monkeypatch.setattr(atomic.os, "replace", flaky)
    files = CacheFiles.of(tmp_path, _uid())
    with pytest.raises(CacheError, match="No space"):
        write_cache(files, description=describe(_uid()), arrays=_arrays())
    left = sorted(os.listdir(tmp_path))
    assert left == sorted(os.path.basename(p) for p in done)  # two whole arrays, no temporary
    assert check_cache(files, description=describe(_uid())).state is CacheState.MISS


def test_discard_removes_the_temporaries(tmp_path):
    writer = CacheWriter()
    writer.add(CacheFiles.of(tmp_path, _uid()), description=describe(_uid()), arrays=_arrays())
    assert len(os.listdir(tmp_path)) == 5
    writer.discard()
    assert os.listdir(tmp_path) == []
    writer.publish()  # nothing left to publish: no error
    assert os.listdir(tmp_path) == []


_CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from tokenload.caches import CacheFiles, CacheWriter, describe, gpt_identifiers
    from tokenload.format import atomic
    folder, stop_after = sys.argv[1], int(sys.argv[2])
    uid = gpt_identifiers(dataset_path="gold/x", num_samples=40, index_split="train", random_seed=1,
                          sequence_length=8, split=None, split_matrix=None, tokenizer=None)
    arrays = {"document_index": np.arange(6, dtype=np.int32),
              "sample_index": np.array([[0, 0], [1, 3], [4, 2]], dtype=np.int32),
              "shuffle_index": np.array([1, 0], dtype=np.uint32)}
    real, done = os.replace, []
    def replace(a, b):
        if len(done) == stop_after:
            print("ready", flush=True)
            time.sleep(60)  # killed here
        done.append(b)
        return real(a, b)
    atomic.os.replace = replace
    writer = CacheWriter()
    writer.add(CacheFiles.of(folder, uid), description=describe(uid), arrays=arrays)
    writer.publish()
""")


@pytest.mark.parametrize("stop_after", [0, 2, 4])
def test_kill_minus_9_during_publish_never_leaves_a_cache_that_looks_complete(tmp_path, stop_after):
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), str(stop_after)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    files = CacheFiles.of(tmp_path, _uid())
    check = check_cache(files, description=describe(_uid()), listing=list_folder(str(tmp_path)))
    assert check.state is CacheState.MISS
    assert check_cache(files, description=describe(_uid())).state is CacheState.MISS
    placed = [n for n in os.listdir(tmp_path) if not n.startswith(".")]
    assert len(placed) == stop_after  # whole files only; the rest are hidden temporaries
    for name in placed:
        if name.endswith(".npy"):
            assert np.load(tmp_path / name).size > 0


def test_listing_says_what_exists_without_a_lookup_per_file(tmp_path, monkeypatch):
    files = CacheFiles.of(tmp_path, _uid())
    assert list_folder(str(tmp_path / "absent")) == frozenset()
    assert list_folder("s3://bucket/cache") is None
    write_cache(files, description=describe(_uid()), arrays=_arrays(), fields={"x": 1})
    listing = list_folder(str(tmp_path))
    looked_up = []
    real = os.path.isfile
    monkeypatch.setattr(cache_io.os.path, "isfile", lambda p: (looked_up.append(p), real(p))[1])
    check = check_cache(files, description=describe(_uid()), fields={"x": 1}, listing=listing)
    assert check.state is CacheState.HIT and check.has_sidecar and looked_up == []
    other = CacheFiles.of(tmp_path, _uid(split="valid"))
    miss = check_cache(other, description=describe(_uid(split="valid")), listing=listing)
    assert miss.state is CacheState.MISS and looked_up == []
    os.remove(files.array("sample_index"))  # listed, gone since: unreadable, so stale
    gone = check_cache(files, description=describe(_uid()), fields={"x": 1}, listing=listing)
    assert gone.state is CacheState.STALE and "sample_index: unreadable" in gone.reasons[0]
    os.remove(files.sidecar)
    no_sidecar = check_cache(files, description=describe(_uid()), listing=list_folder(str(tmp_path)))
    assert no_sidecar.state is CacheState.MISS and not no_sidecar.has_sidecar


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    folder = tmp_path_factory.mktemp("blend")
    return write_small_blend(folder)


def test_a_build_on_an_empty_cache_syncs_once_and_looks_nothing_up(blend, tmp_path, monkeypatch, grouped_fs):
    """auto, one process, 3 prefixes x 2 splits + 2 blends: 8 caches and the manifest, made
    durable by one syncfs and 2 folder fsyncs; the folder listed once, no file stat'ed, no mkdir
    of the existing folder; the datasets read what was published."""
    calls = _Calls(monkeypatch)
    listed, made = [], []
    real_listdir, real_makedirs = os.listdir, os.makedirs
    monkeypatch.setattr(cache_io.os, "listdir", lambda p: (listed.append(p), real_listdir(p))[1])
    monkeypatch.setattr(atomic.os, "makedirs", lambda p, **k: (made.append(p), real_makedirs(p, **k))[1])
    cache = tmp_path / "cache"
    cache.mkdir()
    blend_list = [x for n, w in (("a", "2"), ("b", "3"), ("c", "5")) for x in (w, str(blend / n))]
    config = MegatronDataConfig(sequence_length=8, blend=blend_list, split="90,10,0", eod_id=999,
                                path_to_cache=str(cache))
    got = build_datasets(config, [200, 20, 0])
    assert calls.count("syncfs") == 1 and calls.count("fsync") == 2
    assert listed == [str(cache)] and made == []
    assert calls.count("rename") == 8 * 5 - 2 * 1 + 1  # blends have 2 arrays, + the manifest
    assert not [n for n in os.listdir(cache) if n.startswith(".")]
    again = build_datasets(config, [200, 20, 0])  # a hit, read from the published files
    for ds, other in zip(got[:2], again[:2]):
        items = list(range(len(ds)))
        np.testing.assert_array_equal(ds.__getitems__(items)["tokens"], other.__getitems__(items)["tokens"])
    assert calls.count("rename") == 39  # nothing written again


def test_a_failed_build_publishes_nothing(blend, tmp_path, monkeypatch):
    import tokenload.datasets.megatron.builder as builder

    cache = tmp_path / "cache"
    blend_list = [x for n, w in (("a", "2"), ("b", "3"), ("c", "5")) for x in (w, str(blend / n))]
    config = MegatronDataConfig(sequence_length=8, blend=blend_list, split="90,10,0", eod_id=999,
                                path_to_cache=str(cache))

    def fail(*a, **k):
        raise RuntimeError("blending failed")

    monkeypatch.setattr(builder, "build_blending_indices", fail)
    with pytest.raises(RuntimeError, match="blending failed"):
        build_datasets(config, [200, 20, 0])
    assert os.listdir(cache) == []  # the members' caches were written, never put in place


def test_a_writing_build_removes_the_cache_temporaries_killed_writers_left(blend, tmp_path):
    from tokenload.storage.owners import host_name

    cache = tmp_path / "cache"
    cache.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    md5 = "0123456789abcdef0123456789abcdef"
    host = host_name()
    stale = [f".{md5}-GPTDataset-train-sample_index.npy.tmp-{host}-{dead}-0000abcd",
             f".{md5}-tokenload-build.json.tmp-{host}-{dead}-0000abce"]
    kept = [f".{md5}-GPTDataset-train-sample_index.npy.tmp-{host}-{os.getpid()}-0000abcf",  # live
            f".p0001.idx.tmp-{host}-{dead}-0000abd0.ready",  # a token file's publish: not ours
            f".p0001.bin.tmp-{host}-{dead}-0000abd0"]
    for name in stale + kept:
        (cache / name).write_bytes(b"x")
    blend_list = [x for n, w in (("a", "2"), ("b", "3")) for x in (w, str(blend / n))]
    config = MegatronDataConfig(sequence_length=8, blend=blend_list, split="90,10,0", eod_id=999,
                                path_to_cache=str(cache))
    build_datasets(config, [100, 10, 0])
    hidden = sorted(n for n in os.listdir(cache) if n.startswith("."))
    assert hidden == sorted(kept)


def test_large_files_start_their_writeback_when_written(tmp_path, monkeypatch, grouped_fs):
    started = []
    real = atomic.start_writeback
    monkeypatch.setattr(atomic, "start_writeback", lambda fd: (started.append(os.fstat(fd).st_size), real(fd))[1])
    group = atomic.WriteGroup()
    group.write(tmp_path / "big", lambda f: f.write(bytes(atomic.EARLY_WRITEBACK_BYTES)))
    group.write(tmp_path / "small", lambda f: f.write(b"x"))
    assert started == [atomic.EARLY_WRITEBACK_BYTES]
    group.publish()
    assert (tmp_path / "big").stat().st_size == atomic.EARLY_WRITEBACK_BYTES
    assert (tmp_path / "small").read_bytes() == b"x"


def test_a_small_group_fsyncs_its_open_files_and_never_syncs_the_filesystem(tmp_path, monkeypatch, grouped_fs):
    """Up to KEEP_OPEN files: each kept open and fsynced at publish (no wait for other writers'
    pages), none reopened; no descriptor left open after publish or discard."""
    calls = _Calls(monkeypatch)
    opened = []
    real_open = os.open
    monkeypatch.setattr(atomic.os, "open", lambda p, *a, **k: (opened.append(str(p)), real_open(p, *a, **k))[1])
    before = _open_fds()
    files = CacheFiles.of(tmp_path, _uid())
    writer = CacheWriter()
    writer.add(files, description=describe(_uid()), arrays=_arrays())
    assert _open_fds() == before + 5 + 1  # the 5 temporaries and the folder
    assert calls.count("fsync") == 0
    writer.publish()
    assert calls.count("syncfs") == 0 and calls.count("fsync") == 5 + 1
    assert opened == [str(tmp_path)]  # the folder, once; no temporary reopened
    assert _open_fds() == before
    assert check_cache(files, description=describe(_uid())).state is CacheState.HIT
    writer.add(CacheFiles.of(tmp_path, _uid(split="valid")), description="d", arrays=_arrays())
    writer.discard()
    assert _open_fds() == before
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_a_large_group_fsyncs_each_file_when_other_writers_dirty_the_system(tmp_path, monkeypatch, grouped_fs):
    monkeypatch.setattr(atomic, "dirty_bytes", lambda: atomic.FOREIGN_DIRTY_BYTES + (1 << 30))
    calls = _Calls(monkeypatch)
    writer = CacheWriter()
    for split in ("train", "valid"):
        writer.add(CacheFiles.of(tmp_path, _uid(split=split)), description=describe(_uid(split=split)),
                   arrays=_arrays())
    writer.publish()
    assert calls.count("syncfs") == 0 and calls.count("fsync") == 10 + 1
    for split in ("train", "valid"):
        files = CacheFiles.of(tmp_path, _uid(split=split))
        assert check_cache(files, description=describe(_uid(split=split))).state is CacheState.HIT


def test_dirty_bytes_reads_the_system_figure():
    got = atomic.dirty_bytes()
    assert got is None or got >= 0
