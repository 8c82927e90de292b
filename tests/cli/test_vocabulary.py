"""One vocabulary per layer: library messages name configuration fields (`` `name=` ``), and the
command line prints each as its flag, from the one table in ``tokenload.cli.vocabulary``."""

from __future__ import annotations

import ast
import pickle
import re
from pathlib import Path

import pytest
from test_main import subcommands

import tokenload
from tokenload.cli.main import build_parser, one_line, subcommand_parser
from tokenload.cli.vocabulary import FLAGS, to_flags
from tokenload.errors import ConfigError, fields_named

SRC = Path(tokenload.__file__).parent


def _all_flags() -> set[str]:
    parser = build_parser()
    return {
        flag
        for command in subcommands()
        for action in subcommand_parser(parser, command)._actions
        for flag in action.option_strings
    }


def test_every_flag_of_the_table_is_a_flag_of_a_command():
    known = _all_flags()
    for field, entry in FLAGS.items():
        flag = entry if isinstance(entry, str) else entry[0]
        assert flag in known, (field, flag)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("pass `on_bad_record='skip'` to skip it", "pass --on-bad-record skip to skip it"),
        ("pass `resume=False` to start over", "pass --restart to start over"),
        ("`append_eod=True` needs an EOD token", "--append-eod needs an EOD token"),
        ("raise `range_bytes=` or lower `chunk_bytes=`", "raise --range-mb or lower --chunk-mb"),
        ("`chunk_bytes=1048576` is small", "--chunk-mb 1 is small"),
        ("e.g. `inputs='/data/train-*'`", "e.g. --input '/data/train-*'"),
        (
            "name one with `eod_token=TEXT` or `eod_id=N`",
            "name one with --eod-token TEXT or --eod-id N",
        ),
        ("add `executor='ray'`", "add --executor ray"),
        ("set `no_such_field=3`", "set `no_such_field=3`"),  # no entry: as the library wrote it
        (
            "run `tokenload verify --hashes`",
            "run `tokenload verify --hashes`",
        ),  # a command, no field
        ("``build_policy='none'``", "``build_policy='none'``"),  # a reST literal, no field
        # a message for both kinds of caller names the field and its flag: the flag once
        ("a folder (`path_to_cache=`, `--data-cache-path`), or", "a folder (--data-cache-path), or"),
        ("(`on_bad_record='skip'`, `--on-bad-record skip`)", "(--on-bad-record skip)"),
    ],
)
def test_fields_become_flags(text, expected):
    assert to_flags(text) == expected


def test_an_error_carries_the_fields_it_names_and_the_cli_prints_their_flags():
    exc = ConfigError(
        "`workers=0`: expected at least 1", hint="leave out `workers=`, or lower `chunk_bytes=`"
    )
    assert exc.fields == ["workers", "workers", "chunk_bytes"]
    assert "`workers=`" in str(exc)  # a Python caller reads the keyword it passes
    assert (
        one_line(exc)
        == "--workers 0: expected at least 1 [HINT: leave out --workers, or lower --chunk-mb]"
    )


def test_a_message_stating_a_fields_value_begins_with_its_flag_on_the_command_line():
    exc = ConfigError(
        "chunk_bytes is -1048576, expected at least 1 KiB",
        field="chunk_bytes",
        hint="leave out `chunk_bytes=`",
    )
    assert exc.fields == ["chunk_bytes", "chunk_bytes"]
    assert one_line(exc) == "--chunk-mb is -1, expected at least 1 KiB [HINT: leave out --chunk-mb]"
    again = pickle.loads(pickle.dumps(exc))
    assert (again.field, str(again)) == ("chunk_bytes", str(exc))
    unlisted = ConfigError("this is not a field, expected one", field="this")
    assert one_line(unlisted) == "this is not a field, expected one"


def _library_modules() -> list[Path]:
    return [p for p in SRC.rglob("*.py") if "cli" not in p.relative_to(SRC).parts]


def _messages(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings (of a module, class, function or
    attribute: a string standing as a statement), f-strings' literal parts included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_every_field_a_library_message_names_has_a_flag():
    named = {
        (path.relative_to(SRC), field)
        for path in _library_modules()
        for _, text in _messages(path)
        for field in fields_named(text)
    }
    assert named, "the scan found no field: FIELD or the scan is wrong"
    flagged = {key.split("=", 1)[0] for key in FLAGS}
    assert [(str(p), f) for p, f in sorted(named) if f not in flagged] == []


@pytest.mark.quick  # a static scan (milliseconds): in the tier run before every commit
@pytest.mark.parametrize(
    "package", ["preprocess", "doctor", "caches", "index", "format", "loader", "storage"]
)
def test_library_messages_name_fields_not_flags(package):
    """Outside ``cli/`` a message names no tokenload flag, except inside a command it quotes
    (`` `tokenload merge --input DIR` ``) or a Megatron flag (the training job's vocabulary).
    Not scanned: ``datasets`` (its Megatron-flag importer and the prepare-cache commands it
    prints), ``megatron_args`` and ``integrations``, whose input is a Megatron or torchtitan
    command line: their flags are the caller's own vocabulary there."""
    megatron = {
        "--data-cache-path",
        "--no-mmap-bin-files",
        "--per-dataset-sequences-path",
        "--data-path",
        "--split",
    }
    found = []
    for path in (SRC / package).rglob("*.py"):
        for line, text in _messages(path):
            outside_commands = re.sub(r"`[^`]*`", "", text)
            flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", outside_commands)) - megatron
            if flags:
                found.append((f"{path.relative_to(SRC)}:{line}", sorted(flags)))
    assert found == []
