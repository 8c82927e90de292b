"""Every torchtitan command line the docs show (docs/*.md, README.md) parses with torchtitan
0.3.0's own ConfigManager, and the dataloader fields it sets come out as the docs say.

A command line is a code span or a fenced line that runs ``torchtitan.train`` or passes
``--module``/``--config`` or ``--dataloader.*`` flags. A fragment of overrides alone is parsed
on top of the config registry function the docs tell a user to write (``--module my_configs
--config llama3_8b_tokenload``: torchtitan's ``llama3_8b`` with tokenload's dataloader). The
parse runs in a process of its own (``titan_commands.py``, which explains its triton stub).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
SELECT = ["--module", "my_configs", "--config", "llama3_8b_tokenload"]
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_SPAN = re.compile(r"`([^`]+)`")

pytestmark = pytest.mark.timeout(600)


def code_texts(markdown: str) -> list[str]:
    """The lines of fenced blocks (``\\`` continuations joined) and the inline code spans (one
    may wrap across lines) of a markdown page."""
    texts = []
    for block in _FENCE.findall(markdown):
        texts += block.replace("\\\n", " ").splitlines()
    prose = _FENCE.sub("", markdown)
    texts += [" ".join(span.split()) for span in _SPAN.findall(prose)]
    return texts


def is_titan_command(text: str) -> bool:
    """A line that passes torchtitan flags (a module name alone is no command)."""
    if " --" not in f" {text}":
        return False
    return (
        "torchtitan.train" in text
        or "--dataloader." in text
        or ("--module" in text and "--config" in text)
    )


def titan_args(text: str) -> list[str]:
    """torchtitan's arguments in a command line: what follows ``torchtitan.train``, or the
    flags themselves; the docs' own registry function when the line selects none."""
    words = shlex.split(text)
    if "torchtitan.train" in words:
        words = words[words.index("torchtitan.train") + 1 :]
    words = words[next(i for i, w in enumerate(words) if w.startswith("--")) :]
    return words if "--module" in words else SELECT + words


def documented_commands() -> list[tuple[str, str]]:
    return [
        (page.name, text)
        for page in DOCS
        if page.exists()
        for text in code_texts(page.read_text(encoding="utf-8"))
        if is_titan_command(text)
    ]


def parse(tmp_path: Path, arg_lists: list[list[str]]) -> list[dict]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("titan_commands.py")), str(tmp_path)],
        input=json.dumps(arg_lists),
        capture_output=True,
        text=True,
        timeout=540,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_extraction_finds_code_spans_and_fenced_lines():
    page = (
        "run `torchrun -m\ntorchtitan.train --module a --config b`.\n"
        "```bash\nx \\\n  --dataloader.seed 1\n```\n"
    )
    assert [t for t in code_texts(page) if is_titan_command(t)] == [
        "x    --dataloader.seed 1",
        "torchrun -m torchtitan.train --module a --config b",
    ]
    assert titan_args("x --dataloader.seed 1") == [*SELECT, "--dataloader.seed", "1"]


def test_every_documented_torchtitan_command_line_parses(tmp_path):
    commands = documented_commands()
    # the MIGRATING page shows at least: torchtitan's own run, the registry selection of the
    # user's module, and the dataloader overrides
    assert len(commands) >= 3, commands
    arg_lists = [titan_args(text) for _, text in commands]
    # the wrong form the issue found, as a control: torchtitan refuses space-separated paths
    control = [*SELECT, "--dataloader.data_path", "/data/a", "/data/b"]
    results = parse(tmp_path, [*arg_lists, control])
    assert not results[-1]["ok"], "torchtitan accepted space-separated data paths"
    for (page, text), args, result in zip(commands, arg_lists, results):
        assert result["ok"], f"{page}: `{text}` does not parse: {result.get('error')}"
        if "my_configs" in args:
            loader = "tokenload.integrations.torchtitan.TokenloadTitanDataLoader.Config"
            assert result["dataloader"] == loader, result
        for flag, key in (
            ("--dataloader.data_path", "data_path"),
            ("--dataloader.num_samples", "num_samples"),
        ):
            if flag in args:
                value = args[args.index(flag) + 1]
                expected = value.split(",") if key == "data_path" else int(value)
                assert result[key] == expected, (page, text, result)
