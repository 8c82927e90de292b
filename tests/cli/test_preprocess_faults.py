"""`tokenload preprocess` under faults, run as real commands: a kill during the final cleanup, a
failed run followed by another job, SIGKILL with worker processes, a full or read-only output
filesystem (real tmpfs mounts), unreadable inputs and tokenizers, and bad flags."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from support import run_cli
from tokenload.format import TokenFile

BYTES = ("--tokenizer-type", "ByteTokenizer")

#: Runs the CLI with os.unlink/os.remove hooked: HOOK_MODE=after-job exits right after job.json is
#: removed, HOOK_MODE=first-removal exits before the work folder's first file is removed.
#: os._exit skips every cleanup, like SIGKILL.
KILL_HOOK = r"""
import os, re, sys

def hooked(real):
    def remove(path, *args, **kwargs):
        name = os.path.basename(os.fspath(path))
        mode = os.environ["HOOK_MODE"]
        if mode == "first-removal" and (name == "job.json" or re.match(r"\d{6}", name)):
            try:
                os.stat(path, dir_fd=kwargs.get("dir_fd"))
            except FileNotFoundError:  # a writer clearing the way for a part it publishes
                pass
            else:
                os._exit(137)
        real(path, *args, **kwargs)
        if mode == "after-job" and name == "job.json":
            os._exit(137)
    return remove

os.unlink, os.remove = hooked(os.unlink), hooked(os.remove)
from tokenload.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def write_jsonl(path: Path, texts) -> str:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return str(path)


def texts(n: int, seed: int) -> list[str]:
    return [f"document {seed}-{i}: " + "alpha beta gamma " * (i % 9) for i in range(n)]


def train_tokenizer(path: Path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(200, 7), trainer)
    tok.save(str(path))
    return str(path)


def one_line_error(out: subprocess.CompletedProcess) -> str:
    """The CLI's error line; fails unless the run exited 2 with exactly one line on stderr."""
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenload preprocess: error: "), out.stderr
    return lines[0]


# -- work folders ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kill", ["after-job", "first-removal-then-job-lost"])
def test_a_kill_during_cleanup_never_hands_old_parts_to_a_run_with_another_tokenizer(tmp_path, kill):
    inputs = [write_jsonl(tmp_path / f"in{i}.jsonl", texts(40, i)) for i in range(3)]
    hf = ("--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", train_tokenizer(tmp_path / "t.json"))
    common = ["preprocess", "--input", *inputs, "--append-eod", "--no-progress"]
    prefix = tmp_path / "out"
    work = Path(str(prefix) + ".tokenload-work")
    mode = "after-job" if kill == "after-job" else "first-removal"
    killed = subprocess.run(
        [sys.executable, "-c", KILL_HOOK, *common, *BYTES, "--output-prefix", str(prefix)],
        env=dict(os.environ, HOOK_MODE=mode), capture_output=True, text=True, timeout=300,
    )
    assert killed.returncode == 137, killed.stderr
    assert work.exists()
    if kill != "after-job":  # the state a kill leaves after removing job.json before the markers
        assert len(list(work.glob("*.done"))) == 3
        (work / "job.json").unlink()
    rerun = run_cli(*common, *hf, "--output-prefix", prefix)
    assert rerun.returncode == 0, rerun.stderr
    assert "resumed" not in rerun.stdout
    clean = run_cli(*common, *hf, "--output-prefix", tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr
    for ext in (".bin", ".idx"):
        got = Path(f"{prefix}_text_document{ext}").read_bytes()
        assert got == Path(f"{tmp_path}/clean_text_document{ext}").read_bytes(), ext
    assert not work.exists()


def test_a_failed_run_does_not_block_the_next_and_restart_discards_its_work(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", texts(30, 1))
    other = write_jsonl(tmp_path / "other.jsonl", texts(30, 2))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": \n')
    prefix = tmp_path / "out"
    work = Path(str(prefix) + ".tokenload-work")
    args = ["preprocess", *BYTES, "--no-progress", "--output-prefix", prefix]

    first = run_cli(*args, "--input", bad)  # stops on the first file: nothing to resume
    assert "bad.jsonl:2: malformed_json" in one_line_error(first)
    assert not work.exists()
    assert run_cli(*args, "--input", other).returncode == 0

    stopped = run_cli(*args, "--input", good, bad)  # good.jsonl finished, kept for a resume
    assert "bad.jsonl:2" in one_line_error(stopped)
    assert len(list(work.glob("*.done"))) == 1
    refused = one_line_error(run_cli(*args, "--input", other))
    assert "stopped before it finished" in refused and "differs in: inputs" in refused
    assert "good.jsonl" in refused and "--restart" in refused
    restarted = run_cli(*args, "--input", other, "--restart")
    assert restarted.returncode == 0, restarted.stderr
    expected = [list(t.encode()) for t in texts(30, 2)]
    tf = TokenFile(f"{prefix}_text_document")
    assert [tf[i].tolist() for i in range(tf.num_sequences)] == expected
    assert not work.exists()


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; its new parent may never reap it in a container


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the workers")
def test_sigkill_of_the_cli_ends_its_worker_processes(tmp_path):
    inputs = [write_jsonl(tmp_path / f"in{i}.jsonl", texts(40000, i)) for i in range(3)]  # ~10 s of work
    tokenizer = train_tokenizer(tmp_path / "t.json")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenload.cli.main", "preprocess", "--input", *inputs,
         "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer, "--engine", "native",
         "--executor", "processes", "--workers", "2", "--no-progress", "--output-prefix", str(tmp_path / "o")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    workers: set[int] = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and len(workers) < 2:
        workers = _descendants(proc.pid)
        time.sleep(0.05)
    assert proc.poll() is None and len(workers) >= 2, "the run ended before its workers started"
    time.sleep(1.0)  # workers past their initializer, encoding
    workers = _descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.1)
    left = [p for p in workers if _alive(p)]
    for pid in left:  # do not leak them into the rest of the session
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of {len(workers)} worker processes outlived the killed CLI"


# -- storage faults -------------------------------------------------------------------------------
@pytest.fixture
def mount(request):
    """A fresh tmpfs mounted with the options given by indirect parametrization; unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")  # the tests' own setup, not a library dependency
    point = tempfile.mkdtemp(prefix="preprocess-mnt-", dir="/tmp")
    subprocess.run(["mount", "-t", "tmpfs", "-o", request.param, "tmpfs", point], check=True)
    try:
        yield Path(point)
    finally:
        subprocess.run(["umount", point], check=True)
        os.rmdir(point)


@pytest.mark.parametrize("mount", ["size=1m"], indirect=True)
def test_a_full_disk_is_a_storage_error_and_leaves_nothing(tmp_path, mount):
    src = write_jsonl(tmp_path / "in.jsonl", texts(12000, 3))
    assert os.path.getsize(src) > 1 << 20  # 2 bytes per token: twice that written
    out = run_cli("preprocess", *BYTES, "--input", src, "--output-prefix", mount / "out", "--no-progress")
    line = one_line_error(out)
    assert "No space left on device" in line and "free space" in line.split("HINT:", 1)[1]
    assert sorted(os.listdir(mount)) == []  # no temporaries, no work folder, no output


@pytest.mark.parametrize("mount", ["ro"], indirect=True)
def test_a_read_only_output_folder_is_a_storage_error(tmp_path, mount):
    src = write_jsonl(tmp_path / "in.jsonl", texts(10, 3))
    line = one_line_error(run_cli("preprocess", *BYTES, "--input", src, "--output-prefix", mount / "out"))
    assert "read-only" in line and "choose a writable --output-prefix" in line


def _without_read_override(*args):
    """Run the CLI unable to bypass file permissions (root keeps its uid, loses DAC override)."""
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to drop root's permission override"
        cmd = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]
    else:
        cmd = []
    cmd += [sys.executable, "-m", "tokenload.cli.main", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_permission_denied_input_and_tokenizer_say_permissions(tmp_path):
    src = tmp_path / "in.jsonl"
    write_jsonl(src, texts(10, 1))
    tokenizer = Path(train_tokenizer(tmp_path / "t.json"))
    src.chmod(0)
    line = one_line_error(
        _without_read_override(
            "preprocess", *BYTES, "--input", src, "--output-prefix", tmp_path / "a"
        )
    )
    assert "in.jsonl: cannot read the input file (Permission denied)" in line
    assert "permissions" in line and "damaged" not in line
    src.chmod(0o644)
    tokenizer.chmod(0)
    line = one_line_error(_without_read_override(
        "preprocess", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer,
        "--input", src, "--output-prefix", tmp_path / "b"))
    assert "t.json: cannot read the tokenizer file (Permission denied)" in line and "permissions" in line
    assert not list(tmp_path.glob("[ab]*"))


# -- flags and messages ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags, found, hint",
    [
        (("--chunk-mb", "0"), "--chunk-mb is 0, expected", "default of 4 MB"),
        (("--chunk-mb", "-1"), "--chunk-mb is -1, expected", "default of 4 MB"),
        (("--chunk-mb", "nan"), "--chunk-mb is nan, expected", "default of 4 MB"),
        (("--workers", "0"), "--workers is 0, expected at least 1", "usable CPU"),
    ],
)
def test_bad_sizes_are_refused_with_a_hint(tmp_path, flags, found, hint):
    src = write_jsonl(tmp_path / "in.jsonl", ["x"])
    line = one_line_error(run_cli("preprocess", *BYTES, "--input", src, "--output-prefix", tmp_path / "o", *flags))
    assert found in line and hint in line.split("HINT:", 1)[1]
    assert not list(tmp_path.glob("o*"))


def test_the_tokenizer_type_is_required_and_the_hint_lists_the_types(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ["x"])
    line = one_line_error(run_cli("preprocess", "--input", src, "--output-prefix", tmp_path / "o"))
    assert "no --tokenizer-type given" in line
    for name in ("ByteTokenizer", "HuggingFaceTokenizer", "GPT2BPETokenizer", "TikTokenizer"):
        assert name in line
    ok = run_cli("preprocess", *BYTES, "--input", src, "--output-prefix", tmp_path / "o", "--no-progress")
    assert ok.returncode == 0, ok.stderr


def test_skip_warnings_are_one_short_line_each(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "a"}\n{broken\n{"text": 3}\n')
    out = run_cli("preprocess", *BYTES, "--input", src, "--output-prefix", tmp_path / "o",
                  "--on-bad-record", "skip", "--no-progress")
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 2, out.stderr
    assert lines[0].startswith(f"tokenload preprocess: skipped {src}:2: malformed_json: not valid JSON")
    assert lines[1].startswith(f"tokenload preprocess: skipped {src}:3: not_text: ")
