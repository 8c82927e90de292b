"""`tokenload preprocess` reads s3:// inputs from a real S3-compatible server (SeaweedFS), with
the same bytes as a local run, and an unreachable endpoint is a one-line StorageError."""

from __future__ import annotations

import gzip
import json

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
    remote = run_cli("preprocess", "--tokenizer-type", "ByteTokenizer", "--input", f"s3://{BUCKET}/corpus/", "--output-prefix", tmp_path / "out" / "remote",
                     "--append-eod", "--no-progress", env=s3_env)
    assert remote.returncode == 0, remote.stderr
    here = run_cli("preprocess", "--tokenizer-type", "ByteTokenizer", "--input", local, "--output-prefix", tmp_path / "out" / "local", "--append-eod",
                   "--no-progress")
    assert here.returncode == 0, here.stderr
    for ext in (".bin", ".idx"):
        a = (tmp_path / "out" / f"remote_text_document{ext}").read_bytes()
        b = (tmp_path / "out" / f"local_text_document{ext}").read_bytes()
        assert a == b and len(a) > 0
    info = json.loads(run_cli("info", "--json", tmp_path / "out" / "remote_text_document").stdout)
    assert info["documents"] == 400


def test_missing_object_and_unreachable_endpoint_are_storage_errors(tmp_path, s3_env):
    (tmp_path / "out").mkdir()
    missing = run_cli("preprocess", "--tokenizer-type", "ByteTokenizer", "--input", f"s3://{BUCKET}/nope/*.jsonl", "--output-prefix", tmp_path / "out" / "x",
                      "--no-progress", env=s3_env)
    assert missing.returncode == 2 and "no file matches" in missing.stderr
    dead = dict(s3_env, AWS_ENDPOINT_URL="http://127.0.0.1:9")  # discard port: nothing listens
    down = run_cli("preprocess", "--tokenizer-type", "ByteTokenizer", "--input", f"s3://{BUCKET}/corpus/a.jsonl", "--output-prefix", tmp_path / "out" / "y",
                   "--no-progress", env=dead, timeout=240)
    assert down.returncode == 2, down.stderr
    last = down.stderr.strip().splitlines()[-1]
    assert last.startswith("tokenload preprocess: error: s3://") and "HINT" in last
    assert not list((tmp_path / "out").glob("y_*"))
