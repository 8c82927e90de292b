"""Two ``tokenload prepare-cache`` runs of one job into one ``s3://`` cache folder, started
together (SeaweedFS): both succeed, the one that finds the cache published by the other says so,
and a fresh job loads the cache with ``build_policy="none"``; failed writers leave nothing a
reader takes for complete."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tokenload.datasets import build_datasets

from .test_caches_s3 import (  # noqa: F401  (env, files, reference: fixtures)
    LENGTH_FLAGS,
    SIZES,
    _blend,
    _config,
    _folder,
    _names,
    _same,
    env,
    files,
    reference,
)


def _start(args: list[str], env: dict[str, str], cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tokenload.cli.main", *args], cwd=cwd,
                            env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("staging", ["shared", "separate"])
def test_two_prepare_cache_runs_started_together_both_succeed(
        files, reference, s3, env, tmp_path, staging):
    _, remote = files
    for round_ in range(3):  # before the fix: 21 of 26 such pairs failed (shared staging)
        folder = _folder()
        args = ["prepare-cache", "--data-path", *_blend(remote), *LENGTH_FLAGS,
                "--data-cache-path", folder]
        runs = []
        for i in range(2):
            own = {"TOKENLOAD_STAGING_DIR": str(tmp_path / f"staging{i}")}
            if staging == "shared":
                own = {}
            runs.append(_start(args, {**env, **own}, tmp_path))
        results = [(*run.communicate(timeout=300), run.returncode) for run in runs]
        for _out, err, code in results:
            assert code == 0, (round_, err)
            assert "Traceback" not in err
        names = _names(s3, folder)
        assert sum(n.endswith("-description.txt") for n in names) == 9
        assert sum(n.endswith("-tokenload-build.json") for n in names) == 1
        job = _config(remote, path_to_cache=folder, build_policy="none")
        _same(build_datasets(job, SIZES), reference)
    staged = tmp_path / "staging"
    assert not staged.exists() or not list(staged.rglob("*.npy"))
