"""Object storage on a Ray cluster: the tasks read their files (and byte ranges of a large one)
from the SeaweedFS test server with the driver's AWS_* settings, which the cluster's nodes were
not started with; with an ``s3://`` output prefix they write their parts under a work prefix in
the bucket (no folder is shared), the driver concatenates them and publishes the output, and a
driver killed mid-run resumes from the parts in the bucket. Outputs equal a one-machine run over
local copies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

from ray_corpus import docs, jsonl_bytes, rerun_resumes

from storage.conftest import BUCKET
from support import run_cli

COMMON = ("--tokenizer-type", "ByteTokenizer", "--append-eod", "--no-progress", "--chunk-mb", "0.03")


def _published(s3, url: str, local_prefix, suffixes=(".bin", ".idx", ".json")) -> None:
    """The token file at ``url`` has the bytes of the local one (the sidecar too, unless its
    recorded inputs differ)."""
    key = url.removeprefix("s3://")
    for ext in suffixes:
        with open(f"{local_prefix}{ext}", "rb") as f:
            assert s3.cat(key + ext) == f.read(), ext


def test_s3_inputs_and_output_on_ray_give_the_bytes_of_a_local_run(tmp_path, s3, s3_env, ray_env):
    local = tmp_path / "local"
    local.mkdir()
    files = {"a.jsonl": jsonl_bytes(docs(300, 1)), "b.jsonl": jsonl_bytes(docs(6000, 2))}  # b: ~0.5 MB
    for name, data in files.items():
        (local / name).write_bytes(data)
        s3.pipe(f"{BUCKET}/ray/{name}", data)
    out = f"s3://{BUCKET}/ray-out-{uuid.uuid4().hex[:8]}/remote"
    env = dict(s3_env, **ray_env, TOKENLOAD_STAGING_DIR=str(tmp_path / "staging"))
    remote = run_cli("preprocess", *COMMON, "--input", f"s3://{BUCKET}/ray/", "--output-prefix", out,
                     "--executor", "ray", "--range-mb", "0.125", "--progress", env=env, timeout=240)
    assert remote.returncode == 0, remote.stderr
    assert "(1 split into" in remote.stderr
    assert "files 2/2" in remote.stderr.split("\r")[-1]  # the bar ends with every file counted
    here = run_cli("preprocess", *COMMON, "--input", local, "--output-prefix", tmp_path / "local", "--workers", "2")
    assert here.returncode == 0, here.stderr
    _published(s3, out + "_text_document", tmp_path / "local_text_document", (".bin", ".idx"))
    s3.invalidate_cache()
    assert not s3.find(out.removeprefix("s3://") + ".tokenload-work")  # the work prefix is removed
    assert not list((tmp_path / "staging").iterdir())


def test_a_killed_driver_with_an_s3_output_resumes_from_the_parts_in_the_bucket(tmp_path, s3, s3_env, ray_env):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(8):
        (corpus / f"{i:02d}.jsonl").write_bytes(jsonl_bytes(docs(1500, i)))
    out = f"s3://{BUCKET}/ray-kill-{uuid.uuid4().hex[:8]}/ray"
    work = out.removeprefix("s3://") + ".tokenload-work"
    command = [sys.executable, "-m", "tokenload.cli.main", "preprocess", *COMMON, "--input", str(corpus),
               "--output-prefix", out, "--executor", "ray"]
    env = dict(os.environ, **s3_env, **ray_env, TOKENLOAD_STAGING_DIR=str(tmp_path / "staging"))
    run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def markers() -> list[str]:
        try:
            return [p for p in s3.ls(work, refresh=True) if p.endswith(".done")]
        except FileNotFoundError:
            return []

    deadline = time.monotonic() + 120
    while run.poll() is None and time.monotonic() < deadline:
        if len(markers()) >= 2:
            run.kill()
            break
        time.sleep(0.05)
    _, killed_err = run.communicate(timeout=60)
    assert run.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not s3.exists(out.removeprefix("s3://") + "_text_document.idx")
    kept = len(markers())
    rerun_resumes(command, env, killed_err, kept)
    assert not markers()
    one = run_cli("preprocess", *COMMON, "--input", corpus, "--output-prefix", tmp_path / "one", "--workers", "2")
    assert one.returncode == 0, one.stderr
    _published(s3, out + "_text_document", tmp_path / "one_text_document")
