"""Shared fixtures: tiny token files written with tokenload's own writer."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings
from support import write_documents

from tokenload.format import TokenFileWriter

# CI (CI=true) replays a fixed set of hypothesis examples so that a landing never depends on the
# draw; every local run draws new ones (that is how the U+0085 gigatoken divergence was found).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def small_file(tmp_path):
    """The spec's 122-byte worked example (§1.1)."""
    prefix = tmp_path / "example"
    with TokenFileWriter(prefix, np.uint16) as w:
        w.add_document([1, 2, 3, 4, 5], [5])
        w.add_document([6, 7, 8], [2, 1])
        w.add_document([], [])
        w.add_document([9], [1])
    return str(prefix)


@pytest.fixture
def random_file(tmp_path):
    """400 random documents of one sequence each (uint16), and the documents."""
    rng = np.random.default_rng(7)
    docs = [rng.integers(0, 50000, size=int(n)) for n in rng.integers(0, 300, size=400)]
    return write_documents(tmp_path / "random", docs), docs
