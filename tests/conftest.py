"""Shared fixtures: tiny token files written with tokenload's own writer."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import settings

from support import write_documents
from tokenload.format import TokenFileWriter


def pytest_configure(config):
    """Everything the tests and the processes they start write to the temporary folder (Ray's
    session folders, torchrun's torchelastic_* folders, staging folders, servers' sockets and logs)
    goes under one folder of this run, removed when the run ends, so a run leaves nothing behind
    in the machine's temporary folder. pytest's own tmp_path folders stay where they were (kept
    only for failed tests: tmp_path_retention_policy)."""
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    # pytest-xdist's workers start with the controller's TMPDIR (its run folder): each worker's
    # folder goes beside the controller's, not inside it (Ray's socket paths, under its session
    # folder, must stay within 107 bytes)
    os.environ.setdefault("TOKENLOAD_TESTS_TMP_PARENT", tempfile.gettempdir())
    run_tmp = tempfile.mkdtemp(prefix="tokenload-tests-", dir=os.environ["TOKENLOAD_TESTS_TMP_PARENT"])
    config._tokenload_tmp = (run_tmp, os.environ.get("TMPDIR"))
    os.environ["TMPDIR"] = run_tmp
    tempfile.tempdir = None  # the next gettempdir() reads TMPDIR again


def pytest_unconfigure(config):
    run_tmp, before = getattr(config, "_tokenload_tmp", (None, None))
    if run_tmp is None:
        return
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None
    # multiprocessing removes its pymp-* folder (inside run_tmp) at exit: run its exit step now
    # (it runs once; the atexit call is then a no-op), so that folder is gone before run_tmp is
    import multiprocessing.util

    multiprocessing.util._exit_function()
    shutil.rmtree(run_tmp, ignore_errors=True)


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
