"""Per-folder test timeouts, so that a deadlock fails within seconds or minutes instead of after
the suite's global 600 s. Used by the conftest.py of the loader, distributed and integration
test folders (this folder is importable as ``distributed``: tests/ is on pytest's pythonpath)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def folder_timeout(conftest_file: str, limit_s: float) -> Callable[[list[pytest.Item]], None]:
    """A ``pytest_collection_modifyitems`` hook that marks every test below the folder of
    ``conftest_file`` with ``pytest.mark.timeout(limit_s)``; a test's own mark wins. Collection
    hooks see the whole session's items, hence the folder filter."""
    folder = Path(conftest_file).parent

    def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
        for item in items:
            if folder in item.path.parents and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(limit_s))

    return pytest_collection_modifyitems
