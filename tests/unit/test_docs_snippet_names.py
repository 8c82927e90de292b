"""docs/MIGRATING.md's Python samples bind every name they use, section by section: a reader
migrating from GPT-NeoX reads "From GPT-NeoX" alone.

A new user's finding: the NeoX sample called ``build_datasets`` without importing it.
tests/unit/test_docs_snippets.py did not catch it, for two reasons: it checks only attribute uses
of a fixed list of modules (``sys.argv``, ``np.zeros``, ...), never a bare name such as
``build_datasets(...)``; and it counts an import from any earlier sample of the same page, and the
Megatron-LM section's sample, above, imports ``build_datasets``. This check takes every name a
sample loads (a call, an argument, an attribute's base) and looks for its binding (an import, an
assignment, a ``def``, a parameter...) in the samples of the same ``## `` section, or among
Python's builtins. Fragments that do not parse (elided argument lists) are skipped, as there."""

from __future__ import annotations

import ast
import builtins
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "docs" / "MIGRATING.md"]


def _bound(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def unbound_names(text: str) -> list[tuple[str, list[str]]]:
    """(section heading, names used but bound nowhere in that section's samples) per sample."""
    found = []
    for section in re.split(r"(?m)^(?=## )", text):
        bound = set(dir(builtins))
        for block in re.finditer(r"```python\n(.*?)```", section, re.S):
            try:
                tree = ast.parse(textwrap.dedent(block.group(1)))
            except SyntaxError:
                continue
            bound |= _bound(tree)
            used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            if used - bound:
                found.append((section.splitlines()[0], sorted(used - bound)))
    return found


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_each_sections_samples_bind_the_names_they_use(page):
    assert unbound_names(page.read_text(encoding="utf-8")) == []


def test_the_check_finds_a_name_imported_in_another_section_only():
    text = ("## A\n```python\nfrom m import f\nf()\n```\n"
            "## B\n```python\nx = f(1)\nprint(x, len([x]))\n```\n")  # fmt: skip
    assert unbound_names(text) == [("## B", ["f"])]
    assert unbound_names("## A\n```python\nfrom m import f\n```\n```python\nf()\n```\n") == []
