"""`--split` as a user types it: a string that is not Megatron's form is one line naming `--split`
(exit 2, before any file is read), `90/10` reads as megatron-core reads it."""

from __future__ import annotations

from support import run_cli, write_documents


def test_split_errors_name_the_flag(tmp_path):
    prefix = write_documents(tmp_path / "corpus", [[1, 2, 3, 4, 5, 6]] * 60)
    doctor = ("doctor", "--data-path", prefix, "--seq-length", "4", "--steps", "2")
    for split in ("abc", "90;10", "90 10", "0,0,0"):
        out = run_cli(*doctor, "--split", split)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stdout + out.stderr
        assert lines[0].startswith("tokenload doctor: error: --split is "), lines[0]
        assert "Traceback" not in out.stderr
    slash = run_cli(*doctor, "--split", "90/10")
    assert slash.returncode in (0, 1) and "--split" not in slash.stderr, slash.stderr
