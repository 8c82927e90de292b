"""`tokenload demo`, the README's main job, runs end to end as a real command."""

from __future__ import annotations

import json

from support import run_cli


def test_demo_runs_the_whole_pipeline(tmp_path):
    out = run_cli("demo", "--output", tmp_path, "--max-mb", "2", "--seq-length", "256")
    assert out.returncode == 0, out.stderr
    assert "[4/4]" in out.stdout and "rank 1: samples [4, 5, 6, 7]" in out.stdout
    info = json.loads(run_cli("info", "--json", tmp_path / "stdlib_text_document").stdout)
    assert info["tokens"] > 1_000_000 and info["sidecar"]["tokenizer"]["vocab_size"] == 257
    assert run_cli("verify", "--vocab-size", "257", "--hashes", tmp_path / "stdlib_text_document").returncode == 0
    cached = list((tmp_path / "index-cache").iterdir())
    assert any(p.name.endswith("-GPTDataset-train-shuffle_index.npy") for p in cached)
