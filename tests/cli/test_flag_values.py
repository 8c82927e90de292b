"""Every numeric flag refuses non-finite numbers while parsing, and every command writes only into
an existing folder and only to a named file: one line and exit 2, nothing written."""

from __future__ import annotations

import argparse

import pytest
from test_main import subcommands

from support import run_cli, write_documents
from tokenload.cli.main import build_parser, subcommand_parser


def numeric_flags() -> list[tuple[str, str, object]]:
    found: list[tuple[str, str, object]] = []
    for command in subcommands():
        for action in subcommand_parser(build_parser(), command)._actions:
            if not action.option_strings or not callable(action.type):
                continue
            try:
                parsed = action.type("1")
            except (argparse.ArgumentTypeError, ValueError, TypeError):
                continue
            if isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
                found.append((command, action.option_strings[0], action.type))
    return found


def test_the_numeric_flags_are_found():
    flags = {(command, flag) for command, flag, _ in numeric_flags()}
    for expected in (("corpus", "--max-mb"), ("doctor", "--step-ms"), ("demo", "--step-ms"),
                     ("prepare-cache", "--mid-level-dataset-surplus"), ("preprocess", "--chunk-mb")):
        assert expected in flags


# ids from names, never a function's repr (its address differs between processes, and so would
# the test ids that pytest-xdist's workers collect)
@pytest.mark.parametrize("command,flag,kind", numeric_flags(),
                         ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", type(v).__name__))
@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e999"])
def test_every_numeric_flag_refuses_non_finite_numbers_or_checks_them_in_one_line(
    command, flag, kind, text
):
    try:
        value = kind(text)
    except (argparse.ArgumentTypeError, ValueError):
        return  # refused while parsing: argparse prints the usage and one line, exit 2
    # a flag whose type lets it through must be checked before use, as these preprocess flags
    # are (by its flag checks or PreprocessConfig); the test below runs them
    checked_later = {"--chunk-mb", "--range-mb", "--ray-cpus-per-task"}
    assert command == "preprocess" and flag in checked_later, (
        f"{command} {flag} {text} parses as {value!r}"
    )


@pytest.mark.parametrize("argv", [
    ("corpus", "--output", "{tmp}/x.jsonl", "--max-mb", "inf"),
    ("corpus", "--output", "{tmp}/x.jsonl", "--min-mb", "nan"),
    ("corpus", "--output", "{tmp}/x.jsonl", "--max-mb", "1e999"),
    ("doctor", "--data-path", "{tmp}/p", "--seq-length", "8", "--step-ms", "inf"),
    ("demo", "--output", "{tmp}/demo", "--step-ms", "nan"),
    ("preprocess", "--input", "{tmp}/x.jsonl", "--output-prefix", "{tmp}/o", "--tokenizer-type",
     "ByteTokenizer", "--chunk-mb", "inf"),
    ("preprocess", "--input", "{tmp}/x.jsonl", "--output-prefix", "{tmp}/o", "--tokenizer-type",
     "ByteTokenizer", "--ray-cpus-per-task", "inf"),
    ("prepare-cache", "--data-path", "{tmp}/p", "--data-cache-path", "{tmp}", "--seq-length", "8",
     "--train-samples", "10", "--mid-level-dataset-surplus", "inf"),
])
def test_non_finite_numbers_end_in_one_line_and_exit_2(tmp_path, argv):
    (tmp_path / "x.jsonl").write_text('{"text": "a b c"}\n')
    write_documents(tmp_path / "p", [[1, 2, 3]] * 4)
    out = run_cli(*(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert f"tokenload {argv[0]}: error:" in last
    assert any(word in last for word in ("finite", "inf", "nan", "expected")), last
    assert not (tmp_path / "demo").exists() and not list(tmp_path.glob("o*"))


@pytest.mark.parametrize("command", ["convert", "merge"])
@pytest.mark.parametrize("output", ["", "out/"])
def test_an_output_prefix_naming_no_file_is_refused_and_writes_nothing(tmp_path, monkeypatch,
                                                                        command, output):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    write_documents(tmp_path / "in" / "a", [[1, 2, 3]] * 4)
    monkeypatch.chdir(tmp_path)
    source = ["in/a"] if command == "convert" else ["--input", "in"]
    out = run_cli(command, *source, "--output-prefix", output)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "names a folder, not a file" in out.stderr and "Traceback" not in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]
    assert list((tmp_path / "out").iterdir()) == []


def test_every_command_refuses_a_missing_output_folder_and_creates_nothing(tmp_path):
    """prepare-cache aside: it creates its cache folder, as Megatron's tool does (issue 36,
    point 15; tests/cli/test_prepare_cache_folder_and_ramp.py)."""
    prefix = write_documents(tmp_path / "p", [[1, 2, 3]] * 40)
    missing = tmp_path / "missing"
    runs = [
        ("sequences", "--data-path", prefix, "--per-dataset-sequences-path", missing / "s.json"),
        ("convert", prefix, "--output-prefix", missing / "c"),
        ("corpus", "--output", missing / "c.jsonl", "--max-mb", "0.01"),
    ]
    for argv in runs:
        out = run_cli(*argv)
        assert out.returncode == 2, (argv[0], out.stdout, out.stderr)
        assert f"output folder {str(missing)!r} does not exist" in out.stderr, out.stderr
        assert not missing.exists(), argv[0]
