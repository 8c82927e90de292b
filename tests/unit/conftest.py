"""The quick tier (`pytest -m quick`, CONTRIBUTING.md): every test under tests/unit is marked
``quick`` except the slow ones that ``slow_tests.txt`` beside this file names (a test function, or
a whole file, per line), which stay in the full suite.

``slow_tests.txt`` names each test that took 1 s or more in a timed run of tests/unit (a test id
with its parameters; a function or a file where all of its tests did); `python .ci/tier_times.py
build/test-results.xml --slow 1` prints such a list from the JUnit XML that .ci/run writes. A new
test is quick until it is listed."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
SLOW = frozenset(
    line.split("#")[0].strip()
    for line in (HERE / "slow_tests.txt").read_text().splitlines()
    if line.split("#")[0].strip()
)


def _function_id(nodeid: str) -> str:
    """``file::function`` (or ``file::Class::method``) without the parameters."""
    return nodeid.split("[", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        nodeid = item.nodeid
        if not nodeid.startswith("tests/unit/"):
            continue
        if nodeid in SLOW or _function_id(nodeid) in SLOW or nodeid.split("::", 1)[0] in SLOW:
            continue
        item.add_marker(pytest.mark.quick)
