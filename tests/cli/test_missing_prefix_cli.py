"""`tokenload info`, `verify` and `doctor` given the output prefix of preprocess (out/corpus, whose
files are out/corpus_text_document.*) or the folder: one line, exit 2, naming the prefix that
exists."""

from __future__ import annotations

import pytest

from support import run_cli, write_documents


@pytest.mark.parametrize("given", ["out/corpus", "out"])
def test_the_commands_name_the_existing_prefix(tmp_path, given):
    (tmp_path / "out").mkdir()
    write_documents(tmp_path / "out" / "corpus_text_document", [[1, 2, 3, 4, 5]] * 40)
    doctor = ("doctor", "--split", "100,0,0", "--seq-length", "4", "--steps", "2", "--data-path")
    commands = [("info",), ("verify",)]
    commands += [("doctor", "--order", order, *doctor[1:]) for order in ("megatron", "computed")]
    for command in commands:
        out = run_cli(*command, given, cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, (command, out.stdout, out.stderr)
        assert "did you mean out/corpus_text_document?" in lines[0], (command, lines)
        assert "Traceback" not in out.stdout + out.stderr
