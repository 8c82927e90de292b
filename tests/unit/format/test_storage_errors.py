"""A full disk, a read-only filesystem and unreadable or unwritable files: StorageError with the
cause's hint (CLI: one line, exit 2), and no temporaries left behind. Real filesystems: small
tmpfs mounts (root, as in CI) and a subprocess that runs as an unprivileged user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support import mounted_tmpfs, run_cli, write_documents
from tokenload.errors import StorageError
from tokenload.format import TokenFile, TokenFileWriter, merge_token_files


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs."""
    with mounted_tmpfs(tmp_path / "full", "size=1m") as path:
        yield path


@pytest.fixture
def read_only(tmp_path):
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as path:
        yield path


def _fill(folder: Path, leave: int) -> None:
    """Fill ``folder``'s filesystem until about ``leave`` bytes are free."""
    free = shutil.disk_usage(folder).free
    (folder / "filler").write_bytes(bytes(max(free - leave, 0)))


def _leftovers(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n != "filler")


def _assert_full_disk_error(info) -> None:
    text = str(info.value)
    assert "No space left on device" in text
    assert "HINT: the filesystem is full" in text


def test_writer_on_a_full_disk_while_writing_tokens(full_disk):
    w = TokenFileWriter(full_disk / "t", np.uint16)
    with pytest.raises(StorageError) as info:
        for _ in range(8):  # 8 x 256 KiB into a 1 MiB filesystem
            w.add_document(np.zeros(128 << 10, dtype=np.uint16))
    _assert_full_disk_error(info)
    assert str(info.value).startswith(f"{full_disk / 't.bin'}: cannot write the token file")
    assert _leftovers(full_disk) == []


def test_writer_on_a_full_disk_at_finalize_keeps_the_old_file(full_disk):
    old = write_documents(full_disk / "t", [[1, 2, 3]])
    _fill(full_disk, leave=16 << 10)
    w = TokenFileWriter(full_disk / "t", np.uint16)
    w.add_document(np.arange(6000) % 100)  # fits the write buffer; the full disk shows at finalize
    with pytest.raises(StorageError) as info:
        w.finalize()
    _assert_full_disk_error(info)
    assert _leftovers(full_disk) == ["t.bin", "t.idx", "t.json"]
    assert TokenFile(old)[0].tolist() == [1, 2, 3]


def test_merge_onto_a_full_disk(tmp_path, full_disk):
    inputs = [write_documents(tmp_path / f"in{i}", [np.arange(150_000) % 60000]) for i in range(4)]
    with pytest.raises(StorageError) as info:
        merge_token_files(inputs, full_disk / "m")
    _assert_full_disk_error(info)
    assert _leftovers(full_disk) == []
    cli = run_cli("merge", *inputs, "--output-prefix", full_disk / "m")
    assert cli.returncode == 2
    assert cli.stderr.count("\n") == 1 and "Traceback" not in cli.stderr
    assert "No space left on device" in cli.stderr and "HINT: the filesystem is full" in cli.stderr
    assert _leftovers(full_disk) == []


def test_read_only_output_folder(tmp_path, read_only):
    with pytest.raises(StorageError, match="Read-only file system") as info:
        TokenFileWriter(read_only / "t", np.uint16)
    assert "HINT: the filesystem is mounted read-only" in str(info.value)
    source = write_documents(tmp_path / "s", [[1, 2]])
    cli = run_cli("merge", source, "--output-prefix", read_only / "m")
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    assert "Read-only file system" in cli.stderr and "HINT: the filesystem is mounted read-only" in cli.stderr


# -- permissions: a real process without root's permission override --------------------------

_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _PR_CAPBSET_DROP = 1, 2, 24


def _drop_permission_override() -> None:
    """In the child before exec: drop the capabilities that let root ignore file permissions
    (from the bounding set, so the exec'd interpreter never gets them back)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            os._exit(99)


def _run_unprivileged(*args, cwd):
    """``tokenload ARGS`` in a process that file permissions apply to (also when run as root)."""
    return subprocess.run(
        [sys.executable, "-m", "tokenload.cli.main", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_drop_permission_override if os.geteuid() == 0 else None,
    )


def _one_line_error(done) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


@pytest.mark.parametrize("ext", [".idx", ".bin"])
@pytest.mark.parametrize("command", [["info"], ["verify"], ["merge", "--output-prefix", "{folder}/out/m"]])
def test_unreadable_input_gets_a_permission_hint(tmp_path, ext, command):
    prefix = write_documents(tmp_path / "t", [[1, 2, 3]])
    (tmp_path / "out").mkdir()
    Path(prefix + ext).chmod(0o000)
    args = [a.format(folder=tmp_path) for a in command]
    err = _one_line_error(_run_unprivileged(*args, prefix, cwd=tmp_path))
    assert f"{prefix}{ext}: cannot read" in err and "Permission denied" in err
    assert "HINT: this user may not read the file: check its permissions" in err
    assert "damaged" not in err


def test_unwritable_output_folder(tmp_path):
    prefix = write_documents(tmp_path / "t", [[1, 2, 3]])
    tmp_path.chmod(0o555)
    try:
        done = _run_unprivileged("merge", prefix, "--output-prefix", tmp_path / "m", cwd=tmp_path)
    finally:
        tmp_path.chmod(0o755)
    err = _one_line_error(done)
    assert "Permission denied" in err and "HINT: this user may not write in the output folder" in err
    assert sorted(os.listdir(tmp_path)) == ["t.bin", "t.idx", "t.json"]


def test_library_read_of_an_unreadable_index(tmp_path, monkeypatch):
    """In process (as root no file is unreadable): the index open refused with EACCES."""
    import builtins

    prefix = write_documents(tmp_path / "t", [[1]])
    real_open = builtins.open

    def refusing_open(file, *args, **kwargs):
        if os.fspath(file).endswith(".idx"):
            raise PermissionError(13, "Permission denied", os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing_open)
    with pytest.raises(StorageError, match="cannot read the index \\(Permission denied\\)") as info:
        TokenFile(prefix).num_sequences
    assert "HINT: this user may not read the file" in str(info.value)
