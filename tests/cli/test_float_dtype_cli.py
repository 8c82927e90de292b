"""`tokenload verify`, `doctor` and `info` on a token file whose dtype code says float (int32
tokens under code 7, no sidecar): verify fails it (exit 1), doctor prints one line (exit 2, no
traceback), info still describes it with a note saying it is not a token file."""

from __future__ import annotations

import os

import numpy as np

from support import run_cli, write_documents

DOCS = [list(range(1, 40)), list(range(50, 90)), list(range(7, 33))] * 10


def _float_coded(tmp_path) -> str:
    prefix = write_documents(tmp_path / "f", DOCS, dtype=np.int32)
    os.remove(prefix + ".json")
    with open(prefix + ".idx", "r+b") as f:
        f.seek(17)
        f.write(b"\x07")  # float32 in megatron-core's table
    return prefix


def test_verify_doctor_and_info_on_a_float_code(tmp_path):
    prefix = _float_coded(tmp_path)
    verify = run_cli("verify", prefix)
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert verify.stdout.startswith("FAIL") and "dtype code 7 means float32" in verify.stdout
    assert "Traceback" not in verify.stdout + verify.stderr
    for order in ("megatron", "computed"):
        doctor = run_cli(
            "doctor",
            "--data-path",
            prefix,
            "--order",
            order,
            "--split",
            "100,0,0",
            "--seq-length",
            "16",
            "--steps",
            "2",
        )
        assert doctor.returncode == 2, doctor.stdout + doctor.stderr
        lines = doctor.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in doctor.stdout + doctor.stderr, doctor.stderr
        assert f"{prefix}.idx: dtype code 7 means float32, which is not a token dtype" in lines[0]
        assert "expected an integer code" in lines[0]
    info = run_cli("info", prefix)
    assert info.returncode == 0 and "not a token file" in info.stdout, info.stdout + info.stderr
