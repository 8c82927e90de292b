"""Helpers shared by the tests (importable as ``support``; tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tokenload.format import TokenFileWriter

FIXTURES = Path(__file__).parent / "fixtures"


def write_documents(prefix, documents, dtype=np.uint16, lengths=None):
    """Write ``documents`` (lists of tokens) as a token file; returns the prefix."""
    with TokenFileWriter(prefix, dtype) as w:
        for i, doc in enumerate(documents):
            w.add_document(np.asarray(doc, dtype=np.int64), None if lengths is None else lengths[i])
    return str(prefix)


def write_small_blend(folder, seed=5):
    """Token files ``a``, ``b``, ``c`` in ``folder``: 120 documents each of 3-40 tokens (ids
    below 999, each ending with 999), the same bytes for the same seed."""
    rng = np.random.default_rng(seed)
    for name in ("a", "b", "c"):
        docs = [np.append(rng.integers(0, 999, size=int(k)), 999) for k in rng.integers(3, 40, size=120)]
        write_documents(Path(folder) / name, docs)
    return folder


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


def run_shell(command: str, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    """Run a command line that tokenload printed for a user (``mkdir -p X && tokenload ...``) as
    their shell would, with this interpreter's ``tokenload`` first on the PATH."""
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def megatron_config(cfg: dict, tokenizer: dict, cache_dir=None, **overrides):
    """A ``MegatronDataConfig`` for a megatron-core fixture case's ``config`` and ``tokenizer``
    (tests/fixtures/megatron/order/cases.json)."""
    from tokenload.datasets import MegatronDataConfig

    def as_list(blend):
        if blend is None:
            return None
        prefixes, weights = blend
        return prefixes if weights is None else [x for w, p in zip(weights, prefixes) for x in (str(w), p)]

    per_split = cfg["blend_per_split"]
    return MegatronDataConfig(
        sequence_length=cfg["sequence_length"],
        random_seed=cfg["random_seed"],
        blend=as_list(cfg["blend"]),
        blend_per_split=None if per_split is None else [as_list(b) for b in per_split],
        split=cfg["split"],
        tokenizer=tokenizer["unique_identifiers"],
        eod_id=tokenizer["eod"],
        pad_id=tokenizer["pad"],
        add_extra_token=cfg["add_extra_token_to_sequence"],
        drop_last_partial_validation_sequence=cfg["drop_last_partial_validation_sequence"],
        mid_level_dataset_surplus=cfg["mid_level_dataset_surplus"],
        eod_mask_loss=cfg["eod_mask_loss"],
        reset_position_ids=cfg["reset_position_ids"],
        reset_attention_mask=cfg["reset_attention_mask"],
        path_to_cache=None if cache_dir is None else str(cache_dir),
        **overrides,
    )


@contextlib.contextmanager
def mounted_tmpfs(path: Path, options: str):
    """A tmpfs mounted at ``path`` (created) with ``options`` (``size=1m``, ``ro,size=1m``) for the
    duration of the block: a real full or read-only filesystem."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs the tests as root)")
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, f"root cannot mount a tmpfs here: {done.stderr}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def mypy_snippet(folder, source: str) -> tuple[str, int]:
    """mypy's report and exit status on ``source`` (dedented) written to ``folder``/snippet.py:
    only the snippet's own errors count (the library's are the static checks' business); the
    cache outside the repository: about 40 s without it, a few with it. The snippet is a user's
    code: checked with mypy's defaults, not with pyproject.toml's strict settings for tokenload."""
    import tempfile
    import textwrap

    from mypy import api

    snippet = Path(folder) / "snippet.py"
    snippet.write_text(textwrap.dedent(source))
    cache = Path(tempfile.gettempdir()) / "tokenload-test-mypy-cache"
    out, err, status = api.run(
        [
            "--config-file=",  # none: pyproject.toml's [tool.mypy] is for tokenload's sources
            "--follow-imports=silent",
            "--ignore-missing-imports",
            "--python-version=3.10",
            f"--cache-dir={cache}",
            str(snippet),
        ]
    )
    return out + err, status
