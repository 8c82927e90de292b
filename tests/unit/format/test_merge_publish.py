"""A merge killed at each step of publishing its output: what a reader sees (the old pair, the new
pair, or a clear error, never a mix), and the next merge removing the killed one's temporaries.
The steps and what each kill leaves are the table in docs/FORMAT.md ("Writing")."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from support import write_documents
from tokenload.format import TokenFile, merge_token_files, read_sidecar, verify
from tokenload.format.atomic import STALE_AFTER_S, remove_stale_temporaries, temp_path

# Runs merge_token_files(inputs, out) and exits (os._exit, no cleanup: a kill) just before the
# KILL_AT-th unlink or rename of one of the output's three final names.
KILLED_MERGE = """
import os, sys
from tokenload.format import merge_token_files

out, kill_at, inputs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
finals = {out + ext for ext in (".bin", ".idx", ".json")}
steps = 0
real_replace, real_unlink = os.replace, os.unlink

def step(target):
    global steps
    if os.fspath(target) in finals:
        steps += 1
        if steps == kill_at:
            os._exit(9)

def replace(src, dst, **kw):
    step(dst)
    return real_replace(src, dst, **kw)

def unlink(path, **kw):
    step(path)
    return real_unlink(path, **kw)

os.replace, os.unlink = replace, unlink
merge_token_files(inputs, out)
"""

# Killed before step k (the steps are the unlinks and renames of the three final names; the new
# .idx and sidecar were renamed to their ready names before step 1): what a reader of PREFIX
# reads, whether PREFIX.json exists after that read, and the hidden files left after it.
STATES = {
    1: ("old", True, 3),  # all three new files complete and ready; nothing touched yet
    2: ("old", False, 3),  # old sidecar removed
    3: ("new", True, 0),  # old .idx removed: the reader finishes the killed merge's publish
    4: ("new", True, 0),  # new .bin in place, new .idx not yet: the reader finishes it too
    5: ("new", False, 1),  # new pair in place (the .idx is the commit), sidecar not yet
    6: ("new", True, 0),  # complete (the merge ran to its end)
}


@pytest.fixture
def inputs(tmp_path):
    """Two inputs whose merges in either order have the same file sizes but different content:
    the case where a .bin and .idx of different merges would pass every O(1) check."""
    rng = np.random.default_rng(5)
    a = write_documents(tmp_path / "a", [rng.integers(0, 60000, n) for n in (5, 9, 2)])
    b = write_documents(tmp_path / "b", [rng.integers(0, 60000, n) for n in (7, 1)])
    return a, b


def _content(prefix: str) -> list[list[int]]:
    tf = TokenFile(prefix)
    return [tf.document(d).tolist() for d in range(tf.num_documents)]


def _hidden(folder, name: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith(f".{name}."))


@pytest.mark.parametrize("kill_at", sorted(STATES))
def test_a_kill_at_each_publish_step_leaves_old_new_or_nothing(tmp_path, inputs, kill_at):
    a, b = inputs
    out = str(tmp_path / "m")
    merge_token_files([b, a], out)
    old, new = _content(out), _content(a) + _content(b)
    assert old != new and os.path.getsize(out + ".bin") == sum(os.path.getsize(p + ".bin") for p in inputs)

    done = subprocess.run([sys.executable, "-c", KILLED_MERGE, out, str(kill_at), a, b], capture_output=True, text=True)
    assert done.returncode == (0 if kill_at == 6 else 9), done.stderr

    reader, has_sidecar, left = STATES[kill_at]
    assert _content(out) == (old if reader == "old" else new)  # never a mix, never nothing
    assert verify(out) == []
    assert os.path.exists(out + ".json") == has_sidecar
    if has_sidecar:
        assert verify(out, hashes=True) == []  # a sidecar present always describes the pair present
    killed_temporaries = _hidden(tmp_path, "m")
    assert len(killed_temporaries) == left, killed_temporaries

    merge_token_files([a, b], out)  # the next merge removes what the killed one left
    assert _hidden(tmp_path, "m") == []
    assert _content(out) == new and verify(out, hashes=True) == []


def test_a_merge_killed_while_copying_leaves_temporaries_the_next_merge_removes(tmp_path):
    big = write_documents(tmp_path / "big", [np.arange(4_000_000) % 60000])
    code = (
        "import sys, time, tokenload.format.writer as w\n"
        "real = w.TokenFileWriter._write_bytes\n"
        "def slow(self, data):\n"
        "    real(self, data); print('copying', flush=True); time.sleep(60)\n"
        "w.TokenFileWriter._write_bytes = slow\n"
        "from tokenload.format import merge_token_files\n"
        f"merge_token_files([{big!r}], {str(tmp_path / 'm')!r})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "copying"
    assert _hidden(tmp_path, "m")  # a live merge's temporary: another merge must leave it alone
    assert remove_stale_temporaries(tmp_path / "m.bin") == []
    proc.kill()
    proc.wait(timeout=30)
    leftover = _hidden(tmp_path, "m")
    assert len(leftover) == 1 and os.path.getsize(tmp_path / leftover[0]) > 0
    merge_token_files([big], tmp_path / "m")
    assert _hidden(tmp_path, "m") == []
    assert sorted(os.listdir(tmp_path)) == ["big.bin", "big.idx", "big.json", "m.bin", "m.idx", "m.json"]


def test_which_temporaries_count_as_stale(tmp_path):
    final = tmp_path / "m.bin"
    mine = temp_path(final)  # this process: alive
    host = mine.name.split("-")[1]  # .m.bin.tmp-HOST-PID-TOKEN
    dead = tmp_path / f".m.bin.tmp-{host}-{_dead_pid()}-0123abcd"
    other_host_recent = tmp_path / ".m.bin.tmp-otherhost-1-89abcdef"
    other_host_old = tmp_path / ".m.bin.tmp-otherhost-2-89abcdef"
    legacy_dead = tmp_path / f".m.bin.tmp-{_dead_pid()}-00000000"  # the pre-host naming
    not_ours = [
        tmp_path / ".m.bin.tmp-notes",
        tmp_path / ".mm.bin.tmp-x-1-0123abcd",
        tmp_path / ".m.idx.tmp-x-1-0123abcd",
    ]
    for path in [mine, dead, other_host_recent, other_host_old, legacy_dead, *not_ours]:
        path.write_bytes(b"x")
    day_ago = time.time() - STALE_AFTER_S - 60
    os.utime(other_host_old, (day_ago, day_ago))
    removed = remove_stale_temporaries(final)
    assert sorted(p.name for p in removed) == sorted(p.name for p in (dead, other_host_old, legacy_dead))
    for path in [mine, other_host_recent, *not_ours]:
        assert path.exists()


def _dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_sidecar_of_a_killed_publish_never_describes_another_pair(tmp_path, inputs):
    """Spelled out for step 5 (the only one where a new pair is up without its sidecar): the new
    pair has no sidecar rather than the old one's, whose hashes and counts would be wrong."""
    a, b = inputs
    out = str(tmp_path / "m")
    merge_token_files([b, a], out)
    subprocess.run([sys.executable, "-c", KILLED_MERGE, out, "5", a, b], check=False)
    assert read_sidecar(out) is None


def test_a_pair_replaced_between_the_two_opens_is_opened_again(tmp_path, inputs, monkeypatch):
    """A reader opens the ``.idx``, then the ``.bin``; a merge replacing both in between would
    pair the old index with the new tokens (same sizes here: every O(1) check passes). The
    ``.idx`` is the commit point, so the reader checks that it is still the one it opened and
    opens both again when it is not: the new pair, whole."""
    import tokenload.format.opening as opening

    a, b = inputs
    out = str(tmp_path / "m")
    merge_token_files([b, a], out)
    new = _content(a) + _content(b)
    real, raced = opening.open_bin, []

    def racing(path, dtype, mode):
        if not raced:
            raced.append(path)
            merge_token_files([a, b], out)  # a writer replaces the pair right now
        return real(path, dtype, mode)

    monkeypatch.setattr(opening, "open_bin", racing)
    assert _content(out) == new and raced
