"""`tokenload info`, `verify` and `merge`, run as real commands."""

from __future__ import annotations

import json

import numpy as np
from support import run_cli, write_documents


def test_info_reports_counts(small_file):
    out = run_cli("info", small_file)
    assert out.returncode == 0, out.stderr
    assert "documents    4 (1 empty)" in out.stdout
    assert "tokens       9" in out.stdout
    js = json.loads(run_cli("info", "--json", small_file).stdout)
    assert (js["documents"], js["sequences"], js["tokens"], js["dtype"]) == (4, 4, 9, "uint16")
    assert js["document_tokens"]["p100"] == 5


def test_verify_ok_then_detects_vocab_and_hash_problems(small_file):
    ok = run_cli("verify", "--hashes", "--vocab-size", "10", small_file)
    assert ok.returncode == 0 and ok.stdout.startswith("OK"), ok.stdout + ok.stderr
    bad_vocab = run_cli("verify", "--vocab-size", "9", small_file)
    assert bad_vocab.returncode == 1
    assert "token 9 at position 8 is outside the vocabulary [0, 9)" in bad_vocab.stdout
    data = bytearray(open(small_file + ".bin", "rb").read())
    data[0] ^= 1
    open(small_file + ".bin", "wb").write(bytes(data))
    bad_hash = run_cli("verify", "--hashes", small_file)
    assert bad_hash.returncode == 1 and "xxh3_64 is" in bad_hash.stdout


def test_verify_reports_broken_pointers(tmp_path):
    prefix = write_documents(tmp_path / "p", [[1, 2], [3, 4, 5], [6]])
    idx = bytearray(open(prefix + ".idx", "rb").read())
    idx[34 + 12 + 8] = 3  # pointer of sequence 1: 4 -> 3 (bytes)
    open(prefix + ".idx", "wb").write(bytes(idx))
    out = run_cli("verify", prefix)
    assert out.returncode == 1
    assert "sequence pointers disagree with the lengths; first at sequence 1: 3, expected 4" in out.stdout


def test_merge_folder_and_user_error_is_one_line(tmp_path):
    (tmp_path / "in").mkdir()
    write_documents(tmp_path / "in" / "x1", [[1, 2, 3]])
    write_documents(tmp_path / "in" / "x2", [[4]])
    out = run_cli("merge", "--input", tmp_path / "in", "--output-prefix", tmp_path / "all")
    assert out.returncode == 0, out.stderr
    info = json.loads(run_cli("info", "--json", tmp_path / "all").stdout)
    assert (info["documents"], info["tokens"]) == (2, 4)
    write_documents(tmp_path / "in" / "x3", [[70000]], dtype=np.int32)
    bad = run_cli("merge", "--input", tmp_path / "in", "--output-prefix", tmp_path / "all2")
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "different token dtypes" in bad.stderr and "HINT" in bad.stderr
    missing = run_cli("info", tmp_path / "nope")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
