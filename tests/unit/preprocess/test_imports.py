"""The preprocess modules import each other one way: no cycle, even through imports made inside
functions, and each module imports on its own in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tokenload.preprocess

PACKAGE = Path(tokenload.preprocess.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def _local_imports(module: str) -> set[str]:
    """Sibling modules ``module`` imports anywhere in its body (top level or inside functions)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:  # from . import a, b
                found.update(alias.name for alias in node.names)
    return found & set(MODULES)


def test_the_import_graph_has_no_cycle():
    graph = {m: _local_imports(m) for m in MODULES}
    assert graph["fast"] >= {"backends", "tokenizer"}  # the graph is really read
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycle = [*path[path.index(node):], node]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, [*path, node])
        done.add(node)

    for module in MODULES:
        visit(module, [])


@pytest.mark.parametrize("module", ["tokenizer", "backends", "fast", "load"])
def test_each_tokenizer_module_imports_first_in_a_fresh_interpreter(module):
    code = f"import tokenload.preprocess.{module} as m; print(m.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"tokenload.preprocess.{module}", out.stderr
