"""`tokenload sequences`, run as a real command: Megatron's per-dataset sequences JSON, with
dtypes, in a form megatron-core reads (fixtures/megatron/prepare_cache)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios

from test_prepare_cache import order_data  # noqa: F401 (a fixture: megatron's order/ token files)

from support import FIXTURES, run_cli
from tokenload.format import read_sequences

ORDER = json.loads((FIXTURES / "megatron" / "order" / "cases.json").read_text())["data_files"]
PREPARED = {
    c["id"]: c
    for c in json.loads((FIXTURES / "megatron" / "prepare_cache" / "expected.json").read_text())[
        "cases"
    ]
}


def _header_counts(prefix: str) -> list[int]:
    """[sequence_count, document_count] as megatron's reader saw them (fixture facts)."""
    facts = ORDER[prefix]
    return [len(facts["sequence_lengths"]), len(facts["document_indices"])]


def _sequences(cwd, *args) -> dict:
    out = run_cli("sequences", *args, "--per-dataset-sequences-path", "out.json", cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads((cwd / "out.json").read_text())


def test_megatron_reads_what_tokenload_writes(order_data):
    """The fixture case built its caches in megatron-core from the JSON `tokenload sequences`
    wrote then; today's command writes that same text."""
    case = PREPARED["per_split_micro_world_sequences"]
    argv = case["argv"]
    data = argv[: argv.index("--seq-length")]
    run_cli("sequences", *data, "--per-dataset-sequences-path", "out.json", cwd=order_data)
    assert (order_data / "out.json").read_text() == case["sequences_json"]


def test_weighted_blend_unique_prefixes_in_order_with_header_counts(order_data):
    got = _sequences(order_data, "--data-path", "30", "rand/b", "20", "gold/x", "50", "rand/b")
    assert list(got) == ["rand/b", "gold/x", "__tokenload_dtypes__"]
    assert got["rand/b"] == _header_counts("rand/b")  # 50 sequences in 25 documents: D + 1 = 26
    assert got["gold/x"] == _header_counts("gold/x")
    assert got["__tokenload_dtypes__"] == {"rand/b": "uint16", "gold/x": "uint16"}


def test_per_split_paths_and_files(order_data):
    per_split = _sequences(order_data, "--train-data-path", "gold/x", "rand/a", "--valid-data-path", "rand/a",
                           "--test-data-path", "1", "gold/y")
    assert list(per_split)[:3] == ["gold/x", "rand/a", "gold/y"]
    assert {p: per_split[p] for p in ("gold/x", "rand/a", "gold/y")} == {
        p: _header_counts(p) for p in ("gold/x", "rand/a", "gold/y")
    }
    (order_data / "split.json").write_text(
        json.dumps({"train": "gold/x rand/a", "valid": ["rand/a"], "test": ["1", "gold/y"]})
    )
    assert _sequences(order_data, "--per-split-data-args-path", "split.json") == per_split
    (order_data / "args.txt").write_text("1 rand/c\n2 gold/y\n")
    from_file = _sequences(order_data, "--data-args-path", "args.txt")
    assert list(from_file)[:2] == ["rand/c", "gold/y"]
    assert read_sequences(order_data / "out.json").entry("rand/c").sequence_count == _header_counts("rand/c")[0]


def test_errors_are_one_line_and_write_nothing(order_data):
    cases = [
        (["--data-path", "gold/x", "rand/missing"], "cannot read the index"),
        ([], "no data"),
        (["--data-path"], "--data-path is given without prefixes"),
        (["--data-path", "gold/x", "--train-data-path", "gold/y"], "are given together"),
    ]
    for args, message in cases:
        out = run_cli("sequences", *args, "--per-dataset-sequences-path", "out.json", cwd=order_data)
        assert out.returncode == 2, (args, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, out.stderr)
        assert not (order_data / "out.json").exists()
    out = run_cli("sequences", "--data-path", "gold/x", "--per-dataset-sequences-path", "no/such/dir/out.json",
                  cwd=order_data)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert sorted(os.listdir(order_data)) == ["gold", "rand"]  # no temporary left behind


def test_progress_bar_on_a_terminal_only(order_data):
    quiet = run_cli("sequences", "--data-path", "gold/x", "--per-dataset-sequences-path", "a.json", cwd=order_data)
    assert quiet.stderr == ""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 columns wide
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenload.cli.main", "sequences", "--data-path", "gold/x", "gold/y",
         "--per-dataset-sequences-path", "b.json"],
        cwd=order_data, stdout=subprocess.PIPE, stderr=child,
    )
    os.close(child)
    chunks = []
    while True:  # read while it runs: Linux drops a pty's unread output when its last writer closes
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    proc.communicate(timeout=120)
    shown = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0
    assert "reading headers" in shown and "2/2" in shown
