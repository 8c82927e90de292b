"""s3:// inputs on a Ray cluster: the tasks read their files (and byte ranges of a large one)
from the SeaweedFS test server with the driver's AWS_* settings, which the cluster's nodes were
not started with; the output equals a one-machine run over local copies. Output to s3:// is not
supported by preprocess (outputs and the work folder are local paths)."""

from __future__ import annotations

from storage.conftest import BUCKET
from support import run_cli

from ray_corpus import docs, jsonl_bytes, same_outputs


def test_s3_inputs_on_ray_give_the_bytes_of_a_local_run(tmp_path, s3, s3_env, ray_env):
    local = tmp_path / "local"
    local.mkdir()
    files = {"a.jsonl": jsonl_bytes(docs(300, 1)), "b.jsonl": jsonl_bytes(docs(6000, 2))}  # b: ~0.5 MB
    for name, data in files.items():
        (local / name).write_bytes(data)
        s3.pipe(f"{BUCKET}/ray/{name}", data)
    common = ("--tokenizer-type", "ByteTokenizer", "--append-eod", "--no-progress", "--chunk-mb", "0.03")
    remote = run_cli("preprocess", *common, "--input", f"s3://{BUCKET}/ray/", "--output-prefix", tmp_path / "remote",
                     "--executor", "ray", "--range-mb", "0.125", "--progress", env=dict(s3_env, **ray_env),
                     timeout=240)
    assert remote.returncode == 0, remote.stderr
    assert "(1 split into" in remote.stderr
    assert "files 2/2" in remote.stderr.split("\r")[-1]  # the bar ends with every file counted
    here = run_cli("preprocess", *common, "--input", local, "--output-prefix", tmp_path / "local", "--workers", "2")
    assert here.returncode == 0, here.stderr
    same_outputs(tmp_path / "remote_text_document", tmp_path / "local_text_document")
