"""Every `pip install` that the docs and the error hints show installs tokenload from a clone or a
path (tokenload is not on a package index), names extras that pyproject.toml defines, and each
extra carries what the feature that asks for it imports.

The lines are read from README.md, CONTRIBUTING.md, docs/*.md and .ci/run (inline code, code
blocks) and from the string literals of src/ (hints); the extras that src/ names in `require()`
calls are read from its syntax tree; the dependencies of an extra are followed through the
installed distributions' metadata (the test venv has every extra)."""

from __future__ import annotations

import ast
import functools
import re
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path
from typing import cast

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / ".ci" / "run"]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
#: placeholders that stand for "any extra" in a generic line
PLACEHOLDERS = {"EXTRA", "{extra}"}
#: pip options that take a value
VALUED = {"-c", "--constraint", "-r", "--requirement", "-f", "--find-links", "-i", "--index-url",
          "--extra-index-url"}


def doc_snippets(path: Path) -> list[str]:
    """The text of a doc's code: fenced blocks line by line (continuations joined), inline code
    spans (which may wrap over a line), and, for a script, its lines."""
    text = path.read_text()
    if path.suffix != ".md":
        return text.replace("\\\n", " ").splitlines()
    out = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        out += block.replace("\\\n", " ").splitlines()
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    out += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]
    return out


def src_snippets() -> list[tuple[str, str]]:
    """(file:line, text) of every string literal of src/ that holds a pip install (an f-string's
    fields written as {name})."""
    out = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        tree = ast.parse(path.read_text())
        parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if id(node) in parts:  # a piece of an f-string, read whole below
                continue
            if isinstance(node, ast.JoinedStr):
                text = "".join(
                    # an f-string's pieces: str constants and formatted values
                    cast(str, v.value) if isinstance(v, ast.Constant)
                    else "{" + ast.unparse(cast(ast.FormattedValue, v).value) + "}"
                    for v in node.values
                )
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            if "pip install" in text:
                out.append((f"{path.relative_to(ROOT)}:{node.lineno}", text))
    return out


def install_lines() -> list[tuple[str, str]]:
    lines = [(str(p.relative_to(ROOT)), s) for p in DOCS if p.exists() for s in doc_snippets(p)]
    lines += src_snippets()
    return [(where, m) for where, text in lines
            for m in re.findall(r"pip install [^;&|#`\n]*", text)]


def requirements(command: str) -> list[str]:
    """The requirement arguments of one `pip install ...` (options and their values dropped)."""
    rest = command.split("pip install", 1)[1]
    words = [w.strip("'\"") for w in re.findall(r"'[^']*'|\"[^\"]*\"|\S+", rest)]
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in VALUED:
            skip = True
        elif not word.startswith("-"):
            out.append(word)
    return out


LINES = install_lines()


def test_the_docs_and_hints_have_install_lines():
    where = {w.split(":")[0] for w, _ in LINES}
    assert {"README.md", "docs/LIGHTNING.md", "docs/MIGRATING.md",
            "src/tokenload/errors.py"} <= where, sorted(where)


@pytest.mark.parametrize(("where", "command"), LINES, ids=[f"{w} {c}" for w, c in LINES])
def test_tokenload_comes_from_a_clone_with_existing_extras(where, command):
    for req in requirements(command):
        base, _, extras = req.partition("[")
        if base in ("tokenload", "tokenload.") or canonicalize_name(base) == "tokenload":
            pytest.fail(f"{where}: {command!r} asks a package index for tokenload")
        if not extras:
            continue
        assert base == "." or "/" in base, f"{where}: {req!r} is not a path"
        for extra in extras.rstrip("]").split(","):
            assert extra in EXTRAS or extra in PLACEHOLDERS, (
                f"{where}: {req!r} names the extra {extra!r}, not in pyproject.toml")


@functools.cache
def providers_of(module: str) -> set[str]:
    """The installed distributions that provide a top-level module."""
    return {canonicalize_name(d) for d in packages_distributions().get(module, [])}


def closure(names: list[str]) -> set[str]:
    """The installed distributions that requirement strings pull in, transitively."""
    seen: set[str] = set()
    todo = [Requirement(n) for n in names]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in requires(req.name) or []
                     if "extra ==" not in r]
        except PackageNotFoundError:
            pass
    return seen


def require_calls() -> list[tuple[str, str, str]]:
    """(file:line, module, extra) of every `require(module, extra, ...)` in src/."""
    out = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require"
                    and len(node.args) >= 2
                    and all(isinstance(a, ast.Constant) for a in node.args[:2])):
                module, extra = (cast(str, cast(ast.Constant, a).value) for a in node.args[:2])
                out.append((f"{path.relative_to(ROOT)}:{node.lineno}", module, extra))
    return out


CALLS = require_calls()


def test_src_asks_for_extras_through_require():
    assert len(CALLS) >= 10 and {extra for *_, extra in CALLS} >= {"torch", "s3", "hf", "plot"}


@pytest.mark.parametrize(("where", "module", "extra"), CALLS, ids=[w for w, *_ in CALLS])
def test_each_extra_carries_what_its_feature_imports(where, module, extra):
    assert extra in EXTRAS, f"{where}: require() names the extra {extra!r}, not in pyproject.toml"
    top = module.split(".")[0]
    providers = providers_of(top)
    assert providers, f"{where}: no installed distribution provides {top!r}"
    assert providers & closure(EXTRAS[extra]), (
        f"{where}: tokenload[{extra}] does not install {top!r} ({sorted(providers)})")


#: what each documented command imports, by the extra its install line names
DOCUMENTED = {
    # docs/MIGRATING.md, Hugging Face: a dataset folder read with pyarrow, tokenized with a
    # tokenizer.json; datasets for its Python example
    "hf": ["pyarrow", "tokenizers", "datasets"],
    "lightning": ["lightning", "torch"],  # docs/LIGHTNING.md
    "torch": ["torch"],  # README's demo, docs/MIGRATING.md's Megatron-LM section
    "plot": ["matplotlib"],  # the demo's and the doctor's picture
    "torchtitan": ["torchtitan"],
}


@pytest.mark.parametrize("extra", sorted(DOCUMENTED))
def test_documented_extras_carry_their_commands_needs(extra):
    installed = closure(EXTRAS[extra])
    for module in DOCUMENTED[extra]:
        assert providers_of(module) & installed, f"tokenload[{extra}] lacks {module}"
