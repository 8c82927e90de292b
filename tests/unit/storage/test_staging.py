"""Temporary folders under the staging root: named by host and process, and the orphans of
killed processes on this host removed by the next one, never a live or a foreign one."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tokenload.storage import upload
from tokenload.storage.owners import host_name


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENLOAD_STAGING_DIR", str(tmp_path / "staging"))
    return tmp_path / "staging"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def folder(root, name: str, age: float, files: int = 1):
    path = root / name
    path.mkdir(parents=True)
    for i in range(files):
        (path / f"part{i}.bin").write_bytes(b"x" * 10)
    then = time.time() - age
    for p in [*path.iterdir(), path]:
        os.utime(p, (then, then))
    return path


def test_a_temporary_folder_is_named_by_host_and_process(root):
    made = upload.temporary_folder(".part-corpus-")
    name = os.path.basename(made)
    assert name.startswith(f".part-corpus-@{host_name()}@{os.getpid()}@")
    assert os.path.isdir(made) and os.path.dirname(made) == str(root)


def test_orphans_of_dead_processes_on_this_host_are_removed_by_the_next_folder(root):
    host, old = host_name(), upload.ORPHAN_SECONDS + 60
    pid = dead_pid()
    orphan = folder(root, f".part-a-@{host}@{pid}@abc", old)
    fetch_orphan = folder(root, f".fetch-@{host}@{pid}@def", old, files=0)
    live = folder(root, f".part-b-@{host}@{os.getppid()}@ghi", old)
    recent = folder(root, f".part-c-@{host}@{pid}@jkl", 60)
    foreign = folder(root, f".part-d-@another-host.example@{pid}@mno", old)
    output = folder(root, "corpus-0123456789abcdef", old)  # a staged output: resumable, kept
    made = upload.temporary_folder(".part-e-")
    assert not orphan.exists() and not fetch_orphan.exists()
    assert live.exists() and recent.exists() and foreign.exists() and output.exists()
    assert os.path.isdir(made)


def test_a_file_written_recently_keeps_an_old_folder(root):
    host, pid = host_name(), dead_pid()
    busy = folder(root, f".part-a-@{host}@{pid}@abc", upload.ORPHAN_SECONDS + 60, files=2)
    os.utime(busy / "part1.bin")  # written to a moment ago
    assert upload.remove_orphans(str(root)) == []
    assert busy.exists()


def test_the_sweep_returns_what_it_removed_and_tolerates_a_missing_root(tmp_path):
    assert upload.remove_orphans(str(tmp_path / "nothing")) == []
    root = tmp_path / "r"
    gone = folder(root, f".fetch-@{host_name()}@{dead_pid()}@x", upload.ORPHAN_SECONDS + 1)
    assert upload.remove_orphans(str(root)) == [str(gone)]
