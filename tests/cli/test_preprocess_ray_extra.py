"""Without Ray installed, ``--executor ray`` is a one-line MissingExtraError naming
tokenload[ray], before any file is written; --ray-address without the Ray executor is refused."""

from __future__ import annotations

import json

from support import run_cli


def test_executor_ray_without_ray_names_the_extra(tmp_path):
    hidden = tmp_path / "site"
    (hidden / "ray").mkdir(parents=True)
    (hidden / "ray" / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    out = run_cli(
        "preprocess",
        "--executor",
        "ray",
        "--input",
        tmp_path / "in.jsonl",
        "--tokenizer-type",
        "ByteTokenizer",
        "--output-prefix",
        tmp_path / "out",
        "--no-progress",
        env={"PYTHONPATH": str(hidden)},
    )
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert "ray" in last and "pip install '.[ray]' in its clone" in last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "site"]


def test_ray_address_needs_the_ray_executor(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    out = run_cli("preprocess", "--ray-address", "10.0.0.1:6379", "--input", tmp_path / "in.jsonl",
                  "--tokenizer-type", "ByteTokenizer", "--output-prefix", tmp_path / "out", "--no-progress")
    assert out.returncode == 2 and "add --executor ray" in out.stderr
