"""Faults on a Ray cluster: a worker process killed while it runs a task (Ray reruns the task,
which rewrites its part atomically), and a driver killed mid-run and started again (it resumes
from the finished parts); both end with the bytes of an undisturbed one-machine run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ray_corpus import docs, jsonl_bytes, rerun_resumes, same_outputs

from support import run_cli


def _corpus(folder: Path, files: int, docs_per_file: int) -> None:
    folder.mkdir()
    for i in range(files):
        (folder / f"{i:02d}.jsonl").write_bytes(jsonl_bytes(docs(docs_per_file, i)))


def _command(corpus: Path, prefix: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tokenload.cli.main", "preprocess", "--no-progress", "--input", str(corpus),
            "--tokenizer-type", "ByteTokenizer", "--append-eod", "--chunk-mb", "0.02", "--output-prefix", str(prefix),
            *extra]


def _task_pids() -> list[int]:
    """Ray worker processes running a part task now (Ray titles them ``ray::FUNCTION``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ray::_run_part"):
                found.append(int(entry))
    return found


def _reference(corpus: Path, prefix: Path) -> None:
    one = run_cli("preprocess", "--no-progress", "--input", corpus, "--tokenizer-type", "ByteTokenizer", "--append-eod",
                  "--executor", "processes", "--workers", "2", "--output-prefix", prefix)
    assert one.returncode == 0, one.stderr


def test_a_worker_killed_mid_task_is_retried_and_the_output_is_the_same(tmp_path, ray_env):
    corpus = tmp_path / "corpus"
    _corpus(corpus, 1, 40000)  # one file of about 4 MB, in byte ranges of 0.25 MB
    run = subprocess.Popen(_command(corpus, tmp_path / "ray", "--executor", "ray", "--range-mb", "0.25"),
                           env=dict(os.environ, **ray_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and run.poll() is None and time.monotonic() < deadline:
        for pid in _task_pids():
            os.kill(pid, signal.SIGKILL)
            killed = pid
            break
        time.sleep(0.01)
    _out, err = run.communicate(timeout=150)
    assert killed is not None, f"no task was seen running: {err}"
    assert run.returncode == 0, err
    _reference(corpus, tmp_path / "one")
    same_outputs(tmp_path / "ray_text_document", tmp_path / "one_text_document")


def test_a_killed_driver_resumes_from_finished_parts_with_the_same_output(tmp_path, ray_env):
    corpus = tmp_path / "corpus"
    _corpus(corpus, 10, 2000)  # 0.2 MB each: a task each
    (corpus / "zz-big.jsonl").write_bytes(jsonl_bytes(docs(20000, 77)))  # about 2 MB: 8 byte ranges
    command = _command(corpus, tmp_path / "ray", "--executor", "ray", "--range-mb", "0.25")
    env = dict(os.environ, **ray_env)
    work = tmp_path / "ray.tokenload-work"
    run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while run.poll() is None and time.monotonic() < deadline:
        if work.is_dir() and len(list(work.glob("*.done"))) >= 2:
            run.kill()
            break
        time.sleep(0.01)
    _, killed_err = run.communicate(timeout=60)
    assert run.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    kept = len(list(work.glob("*.done")))
    rerun_resumes(command, env, killed_err, kept)
    assert not work.exists()
    _reference(corpus, tmp_path / "one")
    same_outputs(tmp_path / "ray_text_document", tmp_path / "one_text_document")
