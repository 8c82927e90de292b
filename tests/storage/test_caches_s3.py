"""Index caches, sequences JSON and manifests with object storage (SeaweedFS): ``tokenload
sequences`` and ``prepare-cache`` on ``s3://`` prefixes, caches kept in the bucket
(``--data-cache-path s3://...``) and loaded by a job with ``build_policy="none"`` in a fresh
process, the same samples as the local files, damaged or half-uploaded caches never used, and the
Lightning DataModule over ``s3://`` prefixes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid

import numpy as np
import pytest

from support import run_cli
from tokenload import storage
from tokenload.caches import bucket as cache_remote
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import CacheError, ConfigError, StorageError

from .conftest import BUCKET
from .test_token_files_s3 import corpus, upload

SIZES = [400, 40, 8]
#: prepare-cache's flags for SIZES: train 400, valid (400 // 100 + 1) x 8 = 40, test 8
LENGTH_FLAGS = ["--seq-length", "16", "--split", "90,8,2", "--global-batch-size", "1", "--train-samples", "400",
                "--eval-iters", "8", "--eval-interval", "100"]


@pytest.fixture(autouse=True)
def env(s3_env, monkeypatch, tmp_path):
    """The user's AWS_* environment, and this test's own local copy cache and staging folder; run
    in ``tmp_path``, where a URL mistaken for a local path would leave a folder named ``s3:``."""
    monkeypatch.chdir(tmp_path)
    values = {**s3_env, "TOKENLOAD_CACHE_DIR": str(tmp_path / "copies"),
              "TOKENLOAD_STAGING_DIR": str(tmp_path / "staging")}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


@pytest.fixture(scope="module")
def files(s3_endpoint, tmp_path_factory):
    """Two local token files and the same files in the bucket: ([local], [s3])."""
    import s3fs

    fs = s3fs.S3FileSystem(key="test", secret="test", client_kwargs={"endpoint_url": s3_endpoint})
    folder = tmp_path_factory.mktemp("local")
    local = [corpus(folder, seed=seed, count=1500) for seed in (11, 12)]
    return local, [upload(fs, p, f"caches/data/c{i}") for i, p in enumerate(local)]


def _blend(prefixes: list[str]) -> list[str]:
    return ["30", prefixes[0], "70", prefixes[1]]


def _config(prefixes: list[str], **options) -> MegatronDataConfig:
    return MegatronDataConfig(sequence_length=16, blend=_blend(prefixes), split="90,8,2", **options)


def _tokens(dataset) -> np.ndarray:
    return dataset.__getitems__(np.arange(len(dataset)))["tokens"]


@pytest.fixture(scope="module")
def reference(files):
    """Every sample of each split, built in memory from the local files."""
    local, _ = files
    return [_tokens(d) for d in build_datasets(_config(local, build_policy="every-rank"), SIZES)]


def _same(datasets, reference) -> None:
    for got, want in zip(datasets, reference):
        np.testing.assert_array_equal(_tokens(got), want)


def _folder() -> str:
    return f"s3://{BUCKET}/caches/{uuid.uuid4().hex[:10]}"


def _names(s3, url: str) -> set[str]:
    return {p.rsplit("/", 1)[1] for p in s3.ls(url.removeprefix("s3://"), refresh=True)}


# -- sequences ---------------------------------------------------------------------------------


def test_sequences_on_s3_prefixes_match_the_local_file_and_write_to_the_bucket(files, s3, reference, tmp_path):
    local, remote = files
    for prefixes, out in ((local, tmp_path / "local.json"), (remote, tmp_path / "remote.json")):
        done = run_cli("sequences", "--data-path", *_blend(prefixes), "--per-dataset-sequences-path", out)
        assert done.returncode == 0, done.stderr
    renamed = dict(zip(remote, local))
    got = json.loads((tmp_path / "remote.json").read_text())
    got["__tokenload_dtypes__"] = {renamed[k]: v for k, v in got["__tokenload_dtypes__"].items()}
    assert {renamed.get(k, k): v for k, v in got.items()} == json.loads((tmp_path / "local.json").read_text())
    url = f"{_folder()}/sequences.json"
    done = run_cli("sequences", "--data-path", *_blend(remote), "--per-dataset-sequences-path", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(s3.cat_file(url.removeprefix("s3://"))) == json.loads((tmp_path / "remote.json").read_text())
    # a job reads it through the local copy cache, and opens no .idx header with it
    datasets = build_datasets(_config(remote, sequences_path=url, build_policy="every-rank"), SIZES)
    assert all(ds.source.sequences_path == url for ds in datasets[0].datasets)
    _same(datasets, reference)


def test_a_missing_sequences_object_is_one_config_error(files):
    _, remote = files
    url = f"{_folder()}/absent.json"
    with pytest.raises(ConfigError, match="the sequences file does not exist"):
        build_datasets(_config(remote, sequences_path=url, build_policy="every-rank"), SIZES)


# -- prepare-cache -----------------------------------------------------------------------------


def test_prepare_cache_on_s3_prefixes_into_a_local_folder(files, reference, tmp_path):
    _, remote = files
    cache = tmp_path / "cache"
    cache.mkdir()  # prepare-cache, like every command, writes into an existing folder
    done = run_cli("prepare-cache", "--data-path", *_blend(remote), *LENGTH_FLAGS, "--data-cache-path", cache)
    assert done.returncode == 0, done.stderr
    assert len(list(cache.glob("*-description.txt"))) == 3 * (2 + 1)  # per split: 2 prefixes and their blend
    _same(build_datasets(_config(remote, path_to_cache=str(cache), build_policy="none"), SIZES), reference)


_JOB = """
import hashlib, json, sys
import numpy as np
from tokenload import storage
from tokenload.datasets import MegatronDataConfig, build_datasets
config = MegatronDataConfig(sequence_length=16, blend=json.loads(sys.argv[1]), split="90,8,2",
                            path_to_cache=sys.argv[2], build_policy="none")
splits = build_datasets(config, [400, 40, 8])
digests = [hashlib.sha256(d.__getitems__(np.arange(len(d)))["tokens"].tobytes()).hexdigest() for d in splits]
print(json.dumps({"digests": digests, "stats": storage.stats()}))
"""


def _digests(reference) -> list[str]:
    return [hashlib.sha256(np.ascontiguousarray(t).tobytes()).hexdigest() for t in reference]


def test_prepare_cache_into_the_bucket_then_a_fresh_job_loads_it(files, reference, s3, tmp_path):
    _, remote = files
    folder = _folder()
    done = run_cli("prepare-cache", "--data-path", *_blend(remote), *LENGTH_FLAGS, "--data-cache-path", folder,
                   "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout.splitlines()[-1])["files_written"]
    names = _names(s3, folder)
    assert sorted(written) == sorted(names)
    assert sum(n.endswith("-tokenload-build.json") for n in names) == 1
    assert sum(n.endswith("-description.txt") for n in names) == 9
    assert not list((tmp_path / "staging").rglob("*.npy"))  # staged copies removed after the upload
    # a training job in a fresh process, with an empty local copy cache, loads what is in the bucket
    job = subprocess.run([sys.executable, "-c", _JOB, json.dumps(_blend(remote)), folder], capture_output=True,
                         text=True, timeout=300, env={**_environ(), "TOKENLOAD_CACHE_DIR": str(tmp_path / "fresh")})
    assert job.returncode == 0, job.stderr
    result = json.loads(job.stdout.splitlines()[-1])
    assert result["digests"] == _digests(reference)
    # the manifest, 24 cached arrays (6 GPT caches of 3, 3 blends of 2) and 2 .idx files, each
    # once; no sidecar: map_array verifies each array against the manifest's digests
    assert result["stats"]["index_downloads"] == 1 + 24 + 2
    assert _names(s3, folder) == names  # the job wrote nothing


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_auto_uploads_once_and_later_runs_load_from_the_bucket(files, reference, s3, monkeypatch, tmp_path):
    _, remote = files
    folder = _folder()
    puts = []
    real = cache_remote.upload_file
    monkeypatch.setattr(cache_remote, "upload_file", lambda local, url, *a: (puts.append(url), real(local, url, *a)))
    _same(build_datasets(_config(remote, path_to_cache=folder), SIZES), reference)
    # 6 GPT caches of 3 arrays and 3 blends of 2, each with a sidecar and a description, once
    assert len(puts) == 6 * 5 + 3 * 4 and len(set(puts)) == len(puts)
    by_cache: dict[str, list[str]] = {}
    for url in puts:  # caches build in threads: their uploads interleave, each in its own order
        by_cache.setdefault(url.rsplit("/", 1)[1].split("-")[0], []).append(url.rsplit("-", 1)[1])
    assert len(by_cache) == 9
    for order in by_cache.values():  # the file that makes a cache whole goes last
        assert order[-2:] == ["tokenload.json", "description.txt"] and all(o.endswith(".npy") for o in order[:-2])
    names = _names(s3, folder)
    monkeypatch.setenv("TOKENLOAD_CACHE_DIR", str(tmp_path / "second"))
    _same(build_datasets(_config(remote, path_to_cache=folder), SIZES), reference)
    assert len(puts) == 42 and _names(s3, folder) == names  # a hit: nothing uploaded again
    # without the manifest every cache is checked one by one on its local copies
    manifest = next(n for n in names if n.endswith("-tokenload-build.json"))
    s3.rm_file(f"{folder.removeprefix('s3://')}/{manifest}")
    monkeypatch.setenv("TOKENLOAD_CACHE_DIR", str(tmp_path / "third"))
    _same(build_datasets(_config(remote, path_to_cache=folder, build_policy="none"), SIZES), reference)


def _prepared(remote: list[str], cwd) -> str:
    folder = _folder()
    done = run_cli("prepare-cache", "--data-path", *_blend(remote), *LENGTH_FLAGS, "--data-cache-path", folder, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return folder


@pytest.mark.parametrize("damage", ["garbage", "other_shape"])
def test_a_replaced_array_in_the_bucket_is_a_cache_error(files, s3, damage, monkeypatch, tmp_path):
    _, remote = files
    folder = _prepared(remote, tmp_path)
    build_datasets(_config(remote, path_to_cache=folder, build_policy="none"), SIZES)  # the node has its copies
    name = next(n for n in _names(s3, folder) if n.endswith("GPTDataset-train-shuffle_index.npy"))
    key = f"{folder.removeprefix('s3://')}/{name}"
    if damage == "garbage":
        s3.pipe_file(key, b"\x93NUMPY not an array at all")
    else:
        s3.pipe_file(key, _npy(np.arange(7, dtype=np.uint32)))
    with pytest.raises(CacheError) as info:  # through the manifest: the array maps on first use
        train = build_datasets(_config(remote, path_to_cache=folder, build_policy="none"), SIZES)[0]
        _tokens(train)
    assert info.value.path == f"{folder}/{name}"
    # checked file by file (no manifest), the damaged cache is stale: refused, never built or used
    manifest = next(n for n in _names(s3, folder) if n.endswith("-tokenload-build.json"))
    s3.rm_file(f"{folder.removeprefix('s3://')}/{manifest}")
    with pytest.raises(CacheError, match="1 are missing or stale") as info:
        build_datasets(_config(remote, path_to_cache=folder, build_policy="none"), SIZES)
    assert "shuffle_index" in str(info.value) and f"--data-cache-path {folder}" in str(info.value)


def _npy(array: np.ndarray) -> bytes:
    import io

    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def test_an_interrupted_upload_never_loads(files, reference, s3, monkeypatch):
    _, remote = files
    folder = _folder()
    real = cache_remote.upload_file

    def fail_on_a_description(local, url, *args):
        if url.endswith("GPTDataset-valid-description.txt"):
            raise StorageError("cannot upload it: connection dropped", path=url, hint="retry")
        real(local, url, *args)

    monkeypatch.setattr(cache_remote, "upload_file", fail_on_a_description)
    with pytest.raises(StorageError, match="connection dropped"):
        build_datasets(_config(remote, path_to_cache=folder), SIZES)
    names = _names(s3, folder)
    assert any(n.endswith("GPTDataset-valid-shuffle_index.npy") for n in names)  # its data went up
    assert not any(n.endswith("-tokenload-build.json") for n in names)
    with pytest.raises(CacheError, match="are missing or stale") as info:
        build_datasets(_config(remote, path_to_cache=folder, build_policy="none"), SIZES)
    assert "GPTDataset-valid: missing" in str(info.value) and "-description.txt" in str(info.value)
    monkeypatch.setattr(cache_remote, "upload_file", real)
    _same(build_datasets(_config(remote, path_to_cache=folder), SIZES), reference)  # the next run completes it
    _same(build_datasets(_config(remote, path_to_cache=folder, build_policy="none"), SIZES), reference)


def test_local_rank0_with_a_bucket_cache_is_a_config_error(files):
    with pytest.raises(ConfigError, match="node-local") as info:
        _config(files[1], path_to_cache=_folder(), build_policy="local-rank0")
    assert "build_policy='rank0' or 'auto'" in info.value.hint


def test_none_on_an_empty_bucket_folder_prints_the_command_that_fills_it(files, reference, s3, tmp_path):
    _, remote = files
    folder = _folder()
    config = _config(remote, path_to_cache=folder, build_policy="none")
    with pytest.raises(CacheError) as info:
        build_datasets(config, SIZES)
    command = str(info.value).split("with: ", 1)[1].split("  (or use", 1)[0].split()
    done = run_cli(*command[1:], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(_names(s3, folder)) == 6 * 5 + 3 * 4 + 1 and not (tmp_path / "s3:").exists()
    _same(build_datasets(config, SIZES), reference)


# -- Lightning -----------------------------------------------------------------------------------


def test_lightning_trains_on_s3_prefixes_with_the_local_batches(files, monkeypatch):
    from integrations.lightning_app import Recorder, trainer
    from tokenload.integrations.lightning import TokenloadDataModule

    class Rows(Recorder):
        def _ids(self, batch) -> list:
            return batch["tokens"].tolist()

    def fit(prefixes: list[str]) -> list:
        config = _config(prefixes, build_policy="every-rank")
        module = TokenloadDataModule(train=lambda: build_datasets(config, SIZES)[0], micro_batch_size=4,
                                     num_workers=2, multiprocessing_context="fork")
        model = Rows()
        trainer(max_steps=6).fit(model, module)
        return model.train_seen

    local, remote = files
    before = storage.stats()["gets"]
    seen = fit(remote)
    assert len(seen) == 6 and seen == fit(local)
    assert storage.stats()["gets"] == before  # the workers read the bucket, not this process


def test_an_unwritable_staging_folder_for_a_bucket_cache_names_its_variable(files, tmp_path):
    _, remote = files
    (tmp_path / "a-file").write_text("not a folder")
    env = {**_environ(), "TOKENLOAD_STAGING_DIR": str(tmp_path / "a-file" / "staging")}
    folder = _folder()
    done = run_cli("prepare-cache", "--data-path", *_blend(remote), *LENGTH_FLAGS, "--data-cache-path", folder,
                   cwd=tmp_path, env=env)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "TOKENLOAD_STAGING_DIR" in last and folder in last, last
