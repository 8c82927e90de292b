"""The docs' Python samples import the modules they use: a sample copied into a file runs
without a NameError for ``sys``, ``os``, ``np``, ``torch``... (docs/MIGRATING.md's first sample
used ``sys.argv`` without importing sys: a new user's finding). A module imported in an earlier
sample of the same page counts (pages build their samples up)."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "CONTRIBUTING.md"])
MODULES = {"sys", "os", "np", "torch", "json", "time", "shutil", "subprocess", "math", "pickle"}


def _missing(text: str) -> list[tuple[int, list[str]]]:
    seen: set[str] = set()
    found = []
    for block in re.finditer(r"```python\n(.*?)```", text, re.S):
        try:
            tree = ast.parse(textwrap.dedent(block.group(1)))
        except SyntaxError:  # a fragment (a method's body, an elided argument list)
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                seen |= {a.asname or a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                seen |= {a.asname or a.name for a in node.names}
        used = {
            n.value.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id in MODULES
        }
        if used - seen:
            found.append((text[: block.start()].count("\n") + 1, sorted(used - seen)))
    return found


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_samples_import_the_modules_they_use(page):
    assert _missing(page.read_text(encoding="utf-8")) == []


def test_the_check_finds_a_module_used_without_its_import():
    assert _missing("```python\nimport os\nprint(sys.argv, os.sep)\n```\n") == [(1, ["sys"])]
    assert _missing("```python\nimport sys\n```\ntext\n```python\nsys.exit()\n```\n") == []
