"""The CLI's shared behaviour, run as real commands: usage errors name the subcommand and the
flag meant, every --help has a description and its defaults, a closed pipe and operating-system
errors end in one line, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from support import run_cli, write_documents
from tokenload.cli.main import build_parser, subcommand_parser


def subcommands() -> list[str]:
    parser = build_parser()
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            return sorted(action.choices)
    raise AssertionError("no subcommands")


def test_misspelled_flag_shows_the_subcommands_usage_and_the_flag_meant(tmp_path):
    out = run_cli("preprocess", "--input", tmp_path / "x.jsonl", "--output-prefix", tmp_path / "o", "--append_eod")
    assert out.returncode == 2
    assert out.stderr.startswith("usage: tokenload preprocess"), out.stderr
    assert "unrecognized arguments: --append_eod" in out.stderr
    assert "did you mean --append-eod?" in out.stderr
    # the same hint when argparse stops earlier, at a missing required flag
    out = run_cli("info", "--jsn")
    assert out.returncode == 2 and out.stderr.startswith("usage: tokenload info")
    assert "did you mean --json?" in out.stderr


def test_a_bad_value_is_not_lost_above_a_screen_of_usage():
    """prepare-cache's usage is about 60 lines: an error shows a one-line usage pointing at
    --help, then the error (a new user's finding); a short usage is shown whole."""
    out = run_cli("prepare-cache", "--seq-length", "x")
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert lines == [
        "usage: tokenload prepare-cache [flags]  (`tokenload prepare-cache --help` lists them)",
        "tokenload prepare-cache: error: argument --seq-length: 'x' is not an integer",
    ], out.stderr
    out = run_cli("info", "--jsn")
    assert out.stderr.splitlines()[0] == "usage: tokenload info [-h] [--json] PREFIX [PREFIX ...]"


@pytest.mark.parametrize("command", subcommands())
def test_every_subcommand_help_has_a_description_and_its_defaults(command):
    parser = subcommand_parser(build_parser(), command)
    assert parser.description, f"{command} has no description"
    text = parser.format_help()
    for action in parser._actions:
        shown = action.option_strings and action.help and action.nargs != 0  # flags without a value need none
        if shown and action.default not in (None, argparse.SUPPRESS):
            assert f"(default: {action.default})" in text or "default" in action.help, (command, action.dest)


def test_demo_refuses_a_size_of_zero_before_doing_any_work(tmp_path):
    out = run_cli("demo", "--output", tmp_path / "demo", "--max-mb", "0")
    assert out.returncode == 2 and "--max-mb: 0 must be greater than 0" in out.stderr
    assert not (tmp_path / "demo").exists()


def test_info_into_a_closed_pipe_ends_quietly(tmp_path):
    prefix = write_documents(tmp_path / "p", [[1, 2, 3]] * 5)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenload.cli.main", "info", "--json", *[prefix] * 3000],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline().startswith(b"{")
    proc.stdout.close()  # what `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_an_os_error_no_layer_typed_is_one_line_with_exit_2(tmp_path, monkeypatch, capsys):
    from tokenload.cli import main as cli

    def fail(args):
        raise OSError(28, "No space left on device", str(tmp_path / "out.bin"))

    parser = cli.build_parser()
    subcommand_parser(parser, "info").set_defaults(func=fail)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main(["info", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tokenload info: error: ")
    assert "out.bin: No space left on device" in err and "HINT:" in err


def test_other_libraries_info_logs_stay_quiet_unless_verbose(monkeypatch, capsys):
    import logging

    from tokenload.cli import main as cli

    def speak(args):
        logging.getLogger("botocore.credentials").info("Found credentials in environment variables.")
        logging.getLogger("tokenload.preprocess").info("tokenload speaks")
        return 0

    parser = cli.build_parser()
    subcommand_parser(parser, "info").set_defaults(func=speak)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        root.handlers[:] = []
        assert cli.main(["info", "x"]) == 0
        err = capsys.readouterr().err
        assert "tokenload speaks" in err and "Found credentials" not in err
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        logging.getLogger("tokenload").setLevel(logging.NOTSET)
