"""Helpers shared by the tests (importable as ``support``; tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tokenload.format import TokenFileWriter

FIXTURES = Path(__file__).parent / "fixtures"


def write_documents(prefix, documents, dtype=np.uint16, lengths=None):
    """Write ``documents`` (lists of tokens) as a token file; returns the prefix."""
    with TokenFileWriter(prefix, dtype) as w:
        for i, doc in enumerate(documents):
            w.add_document(np.asarray(doc, dtype=np.int64), None if lengths is None else lengths[i])
    return str(prefix)


def run_cli(*args, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    """Run ``tokenload ARGS`` as a real subprocess of this interpreter."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "tokenload.cli.main", *map(str, args)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
