"""`--split` as a user types it: a string megatron-core 0.19.2 raises on is one line naming
`--split` (exit 2, before any file is read); `90/10` and `90 10` read as megatron-core reads
them."""

from __future__ import annotations

from support import run_cli, write_documents


def test_split_errors_name_the_flag(tmp_path):
    prefix = write_documents(tmp_path / "corpus", [[1, 2, 3, 4, 5, 6]] * 60)
    doctor = ("doctor", "--data-path", prefix, "--seq-length", "4", "--steps", "2")
    for split in ("abc", "1.2.3", "1,2,3,4", "0,0,0"):
        out = run_cli(*doctor, "--split", split)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stdout + out.stderr
        assert lines[0].startswith("tokenload doctor: error: --split is "), lines[0]
        assert "Traceback" not in out.stderr
    for split in ("90/10", "90 10"):
        read = run_cli(*doctor, "--split", split)
        assert read.returncode in (0, 1) and "--split" not in read.stderr, read.stderr
