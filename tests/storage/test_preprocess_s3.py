"""`tokenload preprocess` reads s3:// inputs from a real S3-compatible server (SeaweedFS), with
the same bytes as a local run, and an unreachable endpoint is a one-line StorageError."""

from __future__ import annotations

import gzip
import json
import time

from support import run_cli

from .conftest import BUCKET


def _docs(n, seed):
    return [{"text": f"document {seed}-{i}: " + "token " * (i % 37)} for i in range(n)]


def test_s3_inputs_give_the_same_bytes_as_local_files(tmp_path, s3, s3_env):
    local = tmp_path / "local"
    local.mkdir()
    files = {"a.jsonl": _docs(200, 1), "b.jsonl": _docs(150, 2)}
    for name, docs in files.items():
        data = "".join(json.dumps(d) + "\n" for d in docs).encode()
        (local / name).write_bytes(data)
        s3.pipe(f"{BUCKET}/corpus/{name}", data)
    gz = gzip.compress("".join(json.dumps(d) + "\n" for d in _docs(50, 3)).encode())
    (local / "c.jsonl.gz").write_bytes(gz)
    s3.pipe(f"{BUCKET}/corpus/c.jsonl.gz", gz)
    (tmp_path / "out").mkdir()
    remote = run_cli(
        "preprocess",
        "--tokenizer-type",
        "ByteTokenizer",
        "--input",
        f"s3://{BUCKET}/corpus/",
        "--output-prefix",
        tmp_path / "out" / "remote",
        "--append-eod",
        "--no-progress",
        env=s3_env,
    )
    assert remote.returncode == 0, remote.stderr
    here = run_cli(
        "preprocess",
        "--tokenizer-type",
        "ByteTokenizer",
        "--input",
        local,
        "--output-prefix",
        tmp_path / "out" / "local",
        "--append-eod",
        "--no-progress",
    )
    assert here.returncode == 0, here.stderr
    for ext in (".bin", ".idx"):
        a = (tmp_path / "out" / f"remote_text_document{ext}").read_bytes()
        b = (tmp_path / "out" / f"local_text_document{ext}").read_bytes()
        assert a == b and len(a) > 0
    info = json.loads(run_cli("info", "--json", tmp_path / "out" / "remote_text_document").stdout)
    assert info["documents"] == 400


def test_missing_object_and_unreachable_endpoint_are_storage_errors(tmp_path, s3_env):
    (tmp_path / "out").mkdir()
    missing = run_cli(
        "preprocess",
        "--tokenizer-type",
        "ByteTokenizer",
        "--input",
        f"s3://{BUCKET}/nope/*.jsonl",
        "--output-prefix",
        tmp_path / "out" / "x",
        "--no-progress",
        env=s3_env,
    )
    assert missing.returncode == 2 and "no file matches" in missing.stderr
    dead = dict(s3_env, AWS_ENDPOINT_URL="http://127.0.0.1:9")  # discard port: nothing listens
    down = run_cli(
        "preprocess",
        "--tokenizer-type",
        "ByteTokenizer",
        "--input",
        f"s3://{BUCKET}/corpus/a.jsonl",
        "--output-prefix",
        tmp_path / "out" / "y",
        "--no-progress",
        env=dead,
        timeout=240,
    )
    assert down.returncode == 2, down.stderr
    last = down.stderr.strip().splitlines()[-1]
    assert last.startswith("tokenload preprocess: error: s3://") and "HINT" in last
    assert not list((tmp_path / "out").glob("y_*"))


def test_a_server_that_dies_while_an_object_streams_is_a_storage_error(tmp_path, private_s3):
    import os
    import signal
    import subprocess
    import sys

    import s3fs

    proc, endpoint = private_s3
    fs = s3fs.S3FileSystem(key="test", secret="test", client_kwargs={"endpoint_url": endpoint})
    data = "".join(json.dumps(d) + "\n" for d in _docs(120000, 4)).encode()  # ~9 MB
    fs.pipe(f"{BUCKET}/big.jsonl", data)
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
               AWS_DEFAULT_REGION="us-east-1", FSSPEC_S3='{"default_block_size": 262144}')
    (tmp_path / "out").mkdir()
    run = subprocess.Popen(
        [sys.executable, "-m", "tokenload.cli.main", "preprocess", "--tokenizer-type", "ByteTokenizer",
         "--input", f"s3://{BUCKET}/big.jsonl", "--output-prefix", str(tmp_path / "out" / "x"), "--no-progress",
         "--workers", "1", "--chunk-mb", "0.05"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    work = tmp_path / "out" / "x.tokenload-work"
    deadline = time.monotonic() + 60
    def streaming() -> bool:  # tokens of the object reach the output being written (once)
        written = [*work.glob(".*tmp-*"), *work.glob("output_*.bin.partial")]
        return any(p.stat().st_size > 0 for p in written if p.exists())

    while time.monotonic() < deadline and run.poll() is None and not streaming():
        time.sleep(0.02)
    assert run.poll() is None, run.communicate()
    os.killpg(proc.pid, signal.SIGKILL)
    _stdout, stderr = run.communicate(timeout=240)
    assert run.returncode == 2, stderr
    last = stderr.strip().splitlines()[-1]  # after the client library's INFO lines
    # mid-stream, or at the client's reopen after the server went: one line naming the object
    assert last.startswith((f"tokenload preprocess: error: s3://{BUCKET}/big.jsonl: reading the object failed",
                            f"tokenload preprocess: error: s3://{BUCKET}/big.jsonl: cannot open it")), stderr
    assert "HINT" in last and "rerun" in last and "Traceback" not in stderr
    assert not list((tmp_path / "out").glob("x_*"))
