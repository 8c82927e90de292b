"""Where the flat ``MegatronDataConfig`` goes (issue 37): read from the source with ``ast``,
nothing imported.

* at most 3 functions outside ``datasets/config.py`` (the façade) and ``datasets/build.py`` (the
  dispatcher) take the whole ``MegatronDataConfig`` (a parameter annotated with it): the orders'
  packages read the typed records (``DataConfig`` and their order's record);
* following ``build_datasets``' ``config`` through the calls (by name, alias, ``self.attr``
  holding it, or an object holding it passed on) stays in those two files; following it with
  the records it converts into visits fewer files than the 16 of the flat design.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "tokenload"
FACADE = {"datasets/config.py", "datasets/build.py"}


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = (path, ast.parse(path.read_text()))
    return out


MODULES = _modules()


def test_at_most_three_functions_outside_the_facade_take_the_whole_flat_config():
    takers = []
    for path, tree in MODULES.values():
        rel = path.relative_to(SRC).as_posix()
        if rel in FACADE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                annotations = [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs]
                if any(
                    t is not None and "MegatronDataConfig" in ast.unparse(t) for t in annotations
                ):
                    takers.append(f"{rel}:{node.lineno} {node.name}")
    assert len(takers) <= 3, takers


# -- the walk ------------------------------------------------------------------------------------
def _imports(module: str) -> dict[str, tuple[str, str]]:
    path, tree = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = {}
    for node in ast.walk(tree):  # function-level (lazy) imports too
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                out[alias.asname or alias.name] = (source, alias.name)
    return out


def _definition(module: str, name: str, seen: frozenset = frozenset()):
    """The module and node of the top-level function or class ``name`` seen from ``module``."""
    if (module, name) in seen or module not in MODULES:
        return None
    for node in MODULES[module][1].body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return module, node
    source = _imports(module).get(name)
    if source is None or f"{source[0]}.{source[1]}" in MODULES:
        return None
    return _definition(source[0], source[1], seen | {(module, name)})


def _parameters(fn: ast.FunctionDef, method: bool) -> list[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return names[1:] if method else names


def _receiving(fn: ast.FunctionDef, call: ast.Call, carries, method: bool) -> set[str]:
    names = _parameters(fn, method)
    got = {names[i] for i, arg in enumerate(call.args) if i < len(names) and carries(arg)}
    return got | {k.arg for k in call.keywords if k.arg and carries(k.value)}


class Walk:
    """The files a value passes through, from ``build_datasets(config)``. ``derived``: also
    follow what a method of the value returns (``config.typed()``: the typed records)."""

    def __init__(self, derived: bool) -> None:
        self.derived = derived
        self.visits: list[str] = []
        self.done: set = set()
        self.attributes: dict[tuple[str, str], set[str]] = {}

    def function(self, module, fn, names, cls=None, holders=frozenset()) -> None:
        key = (module, fn.name, cls and cls.name, frozenset(names), holders)
        if key in self.done:
            return
        self.done.add(key)
        self.visits.append(MODULES[module][0].relative_to(SRC).as_posix())
        names = set(names)
        attrs = self.attributes.setdefault((module, cls.name), set()) if cls else set()

        def carries(e: ast.expr) -> bool:
            if isinstance(e, ast.Name):
                return e.id in names
            if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name):
                return (e.value.id == "self" and e.attr in attrs) or e.value.id in holders
            return False

        def holder(e: ast.expr) -> bool:  # ``self`` of a class that keeps the value, passed on
            return isinstance(e, ast.Name) and e.id == "self" and bool(attrs)

        self._aliases(fn, names, attrs, carries, cls)
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            if isinstance(call.func, ast.Attribute) and carries(call.func.value):
                self.visits.append("datasets/config.py")  # a method of the config itself
            arguments = list(call.args) + [k.value for k in call.keywords]
            if any(carries(a) or holder(a) for a in arguments):
                self._call(module, call, carries, holder, cls, holders)

    def _aliases(self, fn, names, attrs, carries, cls) -> None:
        changed = True
        while changed:  # ``c = config``, ``self.config = config``, ``data, o = config.typed()``
            changed = False
            for node in (n for n in ast.walk(fn) if isinstance(n, ast.Assign)):
                value = node.value
                made = (
                    self.derived
                    and isinstance(value, ast.Call)
                    and isinstance(value.func, ast.Attribute)
                    and carries(value.func.value)
                )
                if not (carries(value) or made):
                    continue
                for target in node.targets:
                    for el in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if isinstance(el, ast.Name) and el.id not in names:
                            names.add(el.id)
                            changed = True
                        elif (
                            cls
                            and isinstance(el, ast.Attribute)
                            and isinstance(el.value, ast.Name)
                            and el.value.id == "self"
                            and el.attr not in attrs
                        ):
                            attrs.add(el.attr)
                            changed = True

    def _call(self, module, call, carries, holder, cls, holders) -> None:
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id == "self" and cls is not None:
                method = next(
                    (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == func.attr),
                    None,
                )
                if method is not None:
                    self.function(
                        module, method, _receiving(method, call, carries, True), cls, holders
                    )
            return
        if not isinstance(func, ast.Name):
            return
        found = _definition(module, func.id)
        if found is None:
            return
        target_module, node = found
        if isinstance(node, ast.ClassDef):
            methods = [n for n in node.body if isinstance(n, ast.FunctionDef)]
            init = next((m for m in methods if m.name == "__init__"), None)
            if init is None:
                return
            self.function(target_module, init, _receiving(init, call, carries, True), node)
            if self.attributes.get((target_module, node.name)):
                for m in methods:
                    if m.name != "__init__":
                        self.function(target_module, m, set(), node)
            return
        self.function(
            target_module,
            node,
            _receiving(node, call, carries, False),
            None,
            frozenset(_receiving(node, call, holder, False)),
        )

    def files(self) -> list[str]:
        return list(dict.fromkeys(self.visits))


def _walk(derived: bool) -> Walk:
    walk = Walk(derived)
    module, node = _definition("tokenload.datasets.build", "build_datasets")
    walk.function(module, node, {"config"})
    return walk


def test_build_datasets_config_stays_in_the_facade():
    files = _walk(derived=False).files()
    assert set(files) <= FACADE, files


def test_the_config_and_its_records_visit_fewer_files_than_the_flat_design():
    walk = _walk(derived=True)
    files = walk.files()
    assert 2 <= len(files) < 16, files
    assert {"datasets/megatron/builder.py", "datasets/computed/computed_dataset.py"} <= set(files)
