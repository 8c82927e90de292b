"""The package layers of docs/DESIGN.md hold.

* import-linter's contracts (``[tool.importlinter]`` in pyproject.toml) are kept: each package
  imports only the layers below it, the loader does not import the datasets, ``index`` imports
  nothing of tokenload but its errors and NumPy helpers; and every top-level package is in a layer;
* no module of tokenload imports itself back through others (an import circle), and the
  top-level packages and modules of tokenload form no circle either;
* ``tokenload.index``, the orders' maths, imports only NumPy, the standard library,
  ``tokenload.errors`` and ``tokenload.arrays``.

The graph is read from the source (grimp), nothing is imported; imports under ``TYPE_CHECKING``
and inside functions count as any other.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]

LINT = (
    "import sys\n"
    "from importlinter.cli import lint_imports\n"
    "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))\n"
)

#: what tokenload.index may import besides itself and the standard library
INDEX_MAY_IMPORT = {"numpy", "tokenload.errors", "tokenload.arrays"}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("tokenload", cache_dir=None)  # writes no cache folder


def test_the_import_linter_contracts_are_kept():
    run = subprocess.run(
        [sys.executable, "-c", LINT], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"lint-imports found broken contracts:\n{run.stdout}{run.stderr}"
    assert "0 broken" in run.stdout


def test_every_top_level_package_has_a_layer(graph):
    """A new package or top-level module is placed in the layers, or the contract ignores it."""
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    top_level = {module.split(".")[1] for module in graph.find_children("tokenload")}
    assert top_level - placed == set(), "add these to [tool.importlinter]'s layers"
    assert placed - top_level == set(), "these layers name no module of tokenload"


def test_no_module_imports_itself_back(graph):
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    circles = _circles(edges)
    assert not circles, "import circles between modules:\n" + _describe(graph, circles)


def test_the_top_level_packages_form_no_circle(graph):
    def top(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if top(module) != top(imported):
                edges.setdefault(top(module), set()).add(top(imported))
    circles = _circles(edges)
    assert not circles, f"import circles between tokenload's packages: {circles}"


def test_index_imports_only_numpy_the_standard_library_and_the_errors():
    graph = grimp.build_graph("tokenload", include_external_packages=True, cache_dir=None)
    found = set()
    for module in {"tokenload.index", *graph.find_descendants("tokenload.index")}:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith("tokenload.index") or imported in INDEX_MAY_IMPORT:
                continue
            if imported.split(".")[0] in sys.stdlib_module_names:
                continue
            found.add(f"{module} -> {imported}")
    assert not found, "tokenload.index imports more than NumPy and tokenload.errors:\n" + "\n".join(
        sorted(found)
    )


def test_a_circle_is_found_and_named():
    """The circle search itself: a three-module circle and a self-contained pair are found, a
    chain is not."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(_circles(edges)) == [["a", "b", "c"], ["d", "e"]]
    assert _circles({"a": {"b"}, "b": {"c"}}) == []


def _circles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(graph: grimp.ImportGraph, circles: list[list[str]]) -> str:
    """Each circle as one chain from its first module back to it."""
    lines = []
    for circle in circles:
        first = circle[0]
        back = min(
            (
                graph.find_shortest_chain(importer=m, imported=first) or (m, first)
                for m in circle[1:]
            ),
            key=len,
        )
        ahead = graph.find_shortest_chain(importer=first, imported=back[0]) or (first, back[0])
        lines.append(" -> ".join([*ahead, *back[1:]]) + f"  (circle of {len(circle)} modules)")
    return "\n".join(lines)
