"""``tokenload info`` on an index ``verify`` fails, and on a ``PREFIX.json`` that is not a
tokenload sidecar: it said nothing of either (a negative length printed as a document's
length with exit 0; a corrupt sidecar reported as absent), red-team findings."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from support import run_cli, write_documents


def _damaged(tmp_path) -> str:
    prefix = write_documents(tmp_path / "neg", [np.arange(1, 40), np.arange(1, 30)])
    with open(prefix + ".idx", "r+b") as f:
        f.seek(34)  # sequence 0's length
        f.write(struct.pack("<i", -5))
    return prefix


def test_a_damaged_index_is_described_with_its_problems_and_exit_1(tmp_path):
    prefix = _damaged(tmp_path)
    good = write_documents(tmp_path / "good", [np.arange(1, 40)])
    out = run_cli("info", good, prefix)
    assert out.returncode == 1, out.stderr
    assert "PROBLEM      sequence 0 has negative length -5" in out.stdout
    assert f"run `tokenload verify {prefix}`" in out.stdout
    assert out.stdout.count("PROBLEM") >= 1 and out.stdout.index("PROBLEM") > out.stdout.index(
        prefix
    )
    as_json = run_cli("info", "--json", prefix)
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["problems"]
    assert run_cli("info", good).returncode == 0


@pytest.mark.parametrize("text", ["{garbage", "{}", ""])
def test_a_sidecar_that_is_not_ours_is_named_not_called_absent(tmp_path, text):
    prefix = write_documents(tmp_path / "a", [np.arange(1, 40)])
    (tmp_path / "a.json").write_text(text)
    info = run_cli("info", prefix)
    assert info.returncode == 0, info.stderr
    assert "a.json is not a tokenload sidecar" in info.stdout and "none (written" not in info.stdout
    verify = run_cli("verify", "--hashes", prefix)
    assert verify.returncode == 1
    assert "is not a tokenload sidecar" in verify.stdout and "no sidecar" not in verify.stdout
