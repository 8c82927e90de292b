"""The sample corpus: this Python's standard library sources as JSONL, deterministic, bounded."""

from __future__ import annotations

import json
import os
import sysconfig

import pytest

from tokenload.errors import ConfigError
from tokenload.preprocess import write_stdlib_corpus


def test_corpus_is_the_stdlib_sources_in_sorted_order(tmp_path):
    out = tmp_path / "c.jsonl"
    summary = write_stdlib_corpus(out, max_bytes=300_000)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert summary.documents == len(records) > 3 and summary.bytes == out.stat().st_size <= 300_000
    stdlib = sysconfig.get_paths()["stdlib"]
    for r in records:
        with open(os.path.join(stdlib, r["path"]), encoding="utf-8") as f:
            assert f.read() == r["text"]
    assert all("site-packages" not in r["path"] for r in records)
    write_stdlib_corpus(tmp_path / "again.jsonl", max_bytes=300_000)
    assert (tmp_path / "again.jsonl").read_bytes() == out.read_bytes()


def test_min_bytes_repeats_passes(tmp_path):
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "a.py").write_text("x = 1\n")
    (root / "pkg" / "b.py").write_text("y = 2\n")
    (root / "site-packages").mkdir()
    (root / "site-packages" / "c.py").write_text("no\n")
    summary = write_stdlib_corpus(tmp_path / "c.jsonl", min_bytes=150, root=str(root))
    records = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert [r["path"] for r in records[:2]] == ["a.py", os.path.join("pkg", "b.py")]
    assert summary.source_files == 2 and summary.bytes >= 150
    assert [r.get("pass", 0) for r in records] == [k // 2 for k in range(len(records))]


def test_corpus_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        write_stdlib_corpus(tmp_path / "missing" / "c.jsonl", max_bytes=10)
    with pytest.raises(ConfigError, match="exceeds"):
        write_stdlib_corpus(tmp_path / "c.jsonl", max_bytes=10, min_bytes=20)
