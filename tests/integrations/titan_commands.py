"""Parse torchtitan command lines with torchtitan 0.3.0's own ConfigManager, in a process of its
own (run by ``test_titan_docs.py``): ``python titan_commands.py FOLDER`` reads a JSON list of
argument lists on stdin and prints, per list, whether it parsed and the dataloader's
``data_path`` and ``num_samples`` (or the parser's error).

``FOLDER`` gets ``my_configs.py``, the config registry module the docs tell a user to write: the
function ``llama3_8b_tokenload``, torchtitan's ``llama3_8b`` with its dataloader replaced by
``TokenloadTitanDataLoader.Config`` as the docs show.

torchtitan's model registries import triton kernels at import time (no CPU build of triton
exists); parsing never runs them. So ``triton`` is a stub module in this process only: every
attribute is a class, every call or decorator returns its argument or a stub. Everything that
parses (``--module``/``--config`` selection, tyro with torchtitan's registry and its
comma-separated ``list[str]`` rule) is torchtitan's own code.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import sys
import types
from pathlib import Path

MY_CONFIGS = """
from torchtitan.models.llama3.config_registry import llama3_8b

from tokenload.integrations.torchtitan import TokenloadTitanDataLoader


def llama3_8b_tokenload():
    config = llama3_8b()
    config.dataloader = TokenloadTitanDataLoader.Config(data_path=["/data/corpus_text_document"])
    return config
"""


class _StubType(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubType(name, (_Stub,), {})


class _Stub(metaclass=_StubType):
    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Stub()

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub()

    def __getitem__(self, key):
        return _Stub()


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubType(name, (_Stub,), {})


class _TritonStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module) -> None:
        module.__path__ = []
        module.__version__ = "3.4.0"


def main() -> None:
    folder = Path(sys.argv[1])
    (folder / "my_configs.py").write_text(MY_CONFIGS)
    sys.path.insert(0, str(folder))
    sys.meta_path.insert(0, _TritonStub())
    from torchtitan.config.manager import ConfigManager

    results = []
    for args in json.loads(sys.stdin.read()):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                config = ConfigManager().parse_args(list(args))
        except SystemExit:
            results.append({"ok": False, "error": err.getvalue()[-2000:]})
            continue
        loader = config.dataloader
        results.append(
            {
                "ok": True,
                "dataloader": f"{type(loader).__module__}.{type(loader).__qualname__}",
                "data_path": getattr(loader, "data_path", None),
                "num_samples": getattr(loader, "num_samples", None),
            }
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
