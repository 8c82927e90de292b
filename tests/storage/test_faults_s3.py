"""Failures of object storage during training, on real SeaweedFS servers: a server killed and
restarted mid-epoch (reads retry, no batch lost or repeated), an object deleted or truncated
mid-run (a StorageError naming the object and what changed), wrong credentials (a clear error,
the secret in no message, log or state), an unreachable server; the CLI exits 2 with a HINT."""

from __future__ import annotations

import itertools
import logging
import pickle
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import s3fs
import torch

from support import run_cli
from tokenload import storage
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import StorageError
from tokenload.format import TokenFile
from tokenload.loader import build_dataloader

from .conftest import AUTH_KEY, AUTH_SECRET, BUCKET
from .test_token_files_s3 import corpus, upload

SMALL = {"TOKENLOAD_CHUNK_BYTES": "4096", "TOKENLOAD_CHUNK_CACHE_BYTES": "8192"}  # every few samples a GET


def _env(monkeypatch, endpoint, tmp_path, **extra) -> dict:
    values = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
              "AWS_DEFAULT_REGION": "us-east-1", "TOKENLOAD_CACHE_DIR": str(tmp_path / "idxcache"), **SMALL, **extra}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


def _fs(endpoint, key="test", secret="test"):
    return s3fs.S3FileSystem(key=key, secret=secret, client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)


def _dataset(prefix: str, cache):
    config = MegatronDataConfig(sequence_length=32, blend=[prefix], split="100,0,0", eod_id=50_000,
                                path_to_cache=str(cache), random_seed=3)
    return build_datasets(config, [None, 0, 0])[0]


@pytest.mark.parametrize("workers,get_bytes", [(0, None), (2, None), (0, "1024")])
def test_server_restarted_mid_epoch_loses_and_repeats_nothing(restartable_s3, tmp_path, monkeypatch, workers,
                                                              get_bytes):
    """Also with each chunk read as 4 GETs in flight (get_bytes): each part is retried alone."""
    server = restartable_s3
    _env(monkeypatch, server.endpoint, tmp_path, TOKENLOAD_RETRY_BACKOFF="0.25", TOKENLOAD_RETRY_MAX_BACKOFF="2",
         TOKENLOAD_RETRIES="60", **({"TOKENLOAD_GET_BYTES": get_bytes} if get_bytes else {}))
    local = corpus(tmp_path, seed=21, count=400)
    remote = upload(_fs(server.endpoint), local, "restart/c")
    expected = _dataset(local, tmp_path / "lc")
    want = list(build_dataloader(expected, micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=0))
    loader = build_dataloader(_dataset(remote, tmp_path / "rc"), micro_batch_size=4, dp_rank=0, dp_size=1,
                              num_workers=workers, multiprocessing_context="fork" if workers else None,
                              prefetch_factor=1 if workers else None)
    batches = iter(loader)
    got = list(itertools.islice(batches, 5))
    retries = storage.stats()["retries"]
    server.kill()
    restarter = threading.Timer(3.0, server.start)
    restarter.start()
    try:
        got += list(batches)
    finally:
        restarter.join()
        loader.close()
    assert len(got) == len(want) > 20
    for step, (g, w) in enumerate(zip(got, want)):
        for key in w:
            assert torch.equal(g[key], w[key]), (step, key)
    if workers == 0:  # the workers' counters stay in the workers
        assert storage.stats()["retries"] > retries


def _opened(tmp_path, monkeypatch, endpoint, key):
    _env(monkeypatch, endpoint, tmp_path, TOKENLOAD_PREFETCH="0")
    local = corpus(tmp_path, seed=31, count=1500)
    fs = _fs(endpoint)
    remote = upload(fs, local, key)
    tf = TokenFile(remote)
    np.testing.assert_array_equal(tf[0], TokenFile(local)[0])
    return tf, fs, local


def test_object_deleted_mid_run_is_a_storage_error_naming_it(s3_endpoint, tmp_path, monkeypatch):
    tf, fs, _ = _opened(tmp_path, monkeypatch, s3_endpoint, "deleted/c")
    fs.rm(f"{BUCKET}/deleted/c.bin")
    with pytest.raises(StorageError) as caught:
        tf[len(tf) - 1]
    error = caught.value
    assert error.path == "s3://tokenload-test/deleted/c.bin"
    assert "changed while in use" in error.message and "now gone" in error.message
    assert "deleted, truncated or rewritten" in error.hint


def test_object_truncated_mid_run_is_a_storage_error_naming_it(s3_endpoint, tmp_path, monkeypatch):
    tf, fs, local = _opened(tmp_path, monkeypatch, s3_endpoint, "truncated/c")
    data = Path(local + ".bin").read_bytes()
    fs.pipe(f"{BUCKET}/truncated/c.bin", data[: len(data) // 2])
    with pytest.raises(StorageError) as caught:
        tf[len(tf) - 1]
    error = caught.value
    assert error.path == "s3://tokenload-test/truncated/c.bin"
    assert f"it was {len(data)} bytes" in error.message and f"now {len(data) // 2} bytes" in error.message
    assert error.hint


def test_object_rewritten_with_the_same_size_is_a_storage_error(s3_endpoint, tmp_path, monkeypatch):
    """Same size, other bytes: only the ETag tells, and each GET's answer is checked against it."""
    tf, fs, local = _opened(tmp_path, monkeypatch, s3_endpoint, "rewritten-same-size/c")
    data = bytearray(Path(local + ".bin").read_bytes())
    data[-2:] = b"\x00\x01"
    fs.pipe(f"{BUCKET}/rewritten-same-size/c.bin", bytes(data))
    with pytest.raises(StorageError) as caught:
        tf[len(tf) - 1]
    assert "came with ETag" in caught.value.message and f"now {len(data)} bytes" in caught.value.message


def test_an_object_rewritten_before_a_process_opens_it_is_refused_there(s3_endpoint, tmp_path, monkeypatch):
    """A worker (or a replacement worker) opening the token file after its .bin was rewritten
    recorded the new object as the one opened, and served it beside the training process's old
    one, no error (red-team finding). The file carries the object it was first opened as: any
    later opening, in any process, must find it."""
    import pickle

    tf, fs, local = _opened(tmp_path, monkeypatch, s3_endpoint, "rewritten-before-open/c")
    data = bytearray(Path(local + ".bin").read_bytes())
    data[-2:] = b"\x00\x01"  # same size, other bytes
    fs.pipe(f"{BUCKET}/rewritten-before-open/c.bin", bytes(data))
    worker_copy = pickle.loads(pickle.dumps(tf))  # what a worker process starts from
    with pytest.raises(StorageError, match="the token file changed since it was first opened"):
        worker_copy[0]


PARTS = {"TOKENLOAD_DIRECT_READS": "0", "TOKENLOAD_GET_BYTES": "1024"}  # every read through a chunk of 4 GETs


@pytest.mark.parametrize("change", ["deleted", "truncated", "rewritten"])
def test_object_changed_under_a_chunk_read_in_parts_is_a_storage_error_every_time(s3_endpoint, tmp_path,
                                                                                  monkeypatch, change):
    """A chunk whose part GETs find the object changed is an error naming the object, and it is
    not kept: the next read of it fails again rather than serve a partly filled buffer."""
    for name, value in PARTS.items():
        monkeypatch.setenv(name, value)
    tf, fs, local = _opened(tmp_path, monkeypatch, s3_endpoint, f"parts-{change}/c")
    data = bytearray(Path(local + ".bin").read_bytes())
    key = f"{BUCKET}/parts-{change}/c.bin"
    if change == "deleted":
        fs.rm(key)
    elif change == "truncated":
        fs.pipe(key, bytes(data[: len(data) - 3000]))
    else:
        data[-2:] = b"\x00\x01"
        fs.pipe(key, bytes(data))
    misses = storage.stats()["chunk_misses"]
    for _ in range(2):
        with pytest.raises(StorageError) as caught:
            tf[len(tf) - 1]
        assert caught.value.path == f"s3://{key}" and "changed while in use" in caught.value.message
        assert caught.value.hint
    assert storage.stats()["chunk_misses"] - misses == 2  # the failed chunk was not kept


def test_wrong_credentials_are_a_clear_error_without_the_secret(auth_s3, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="tokenload")
    fs = _fs(auth_s3, AUTH_KEY, AUTH_SECRET)
    local = corpus(tmp_path, seed=41, count=300)
    remote = upload(fs, local, "auth/c")
    env = _env(monkeypatch, auth_s3, tmp_path, AWS_ACCESS_KEY_ID=AUTH_KEY, AWS_SECRET_ACCESS_KEY=AUTH_SECRET)
    dataset = _dataset(remote, tmp_path / "cache")  # the right credentials read
    loader = build_dataloader(dataset, micro_batch_size=2, dp_rank=0, dp_size=1, num_workers=0)
    next(iter(loader))
    state = loader.state_dict()
    loader.close()
    for blob in (pickle.dumps(state), pickle.dumps(dataset), repr(state).encode()):
        assert AUTH_SECRET.encode() not in blob

    wrong = AUTH_SECRET[::-1]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    monkeypatch.setenv("TOKENLOAD_CACHE_DIR", str(tmp_path / "cold"))
    with pytest.raises(StorageError) as caught:
        TokenFile(remote).num_tokens
    text = str(caught.value)
    assert "access denied" in caught.value.message and "credentials" in caught.value.hint
    cli = run_cli("info", remote, env=dict(env, AWS_SECRET_ACCESS_KEY=wrong, TOKENLOAD_CACHE_DIR=str(tmp_path / "c2")))
    assert cli.returncode == 2
    last = cli.stderr.strip().splitlines()[-1]
    assert last.startswith(f"tokenload info: error: {remote}.idx: cannot read") and "HINT" in last
    for secret in (AUTH_SECRET, wrong):
        assert secret not in text and secret not in caplog.text and secret not in cli.stderr + cli.stdout


def test_unreachable_server_is_a_storage_error_after_the_retries(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="tokenload")
    env = _env(monkeypatch, "http://127.0.0.1:9", tmp_path, TOKENLOAD_RETRIES="2", TOKENLOAD_RETRY_BACKOFF="0.1")
    before = storage.stats()["retries"]
    start = time.monotonic()
    with pytest.raises(StorageError) as caught:
        TokenFile(f"s3://{BUCKET}/nothing/here").num_tokens
    assert time.monotonic() - start < 60
    assert "still after 2 retries" in caught.value.message and "AWS_ENDPOINT_URL" in caught.value.hint
    # retried twice, warned once (the other retry at DEBUG)
    assert storage.stats()["retries"] - before == 2 and caplog.text.count("retry ") == 1
    cli = run_cli("verify", f"s3://{BUCKET}/nothing/here", env=env)
    assert cli.returncode == 2 and "HINT" in cli.stderr.strip().splitlines()[-1]


def test_a_command_gives_up_on_an_endpoint_it_never_reached_after_3_retries(tmp_path, monkeypatch):
    """A mistyped endpoint costs a command seconds (3 retries), not TOKENLOAD_RETRIES' minute of
    backoff; the library, which a training job uses, keeps every retry (the test above)."""
    for endpoint in ("http://127.0.0.1:9", "http://nonexistent.invalid:9000"):
        env = _env(monkeypatch, endpoint, tmp_path, TOKENLOAD_RETRY_BACKOFF="0.05")
        cli = run_cli("info", f"s3://{BUCKET}/nothing/here", env=env)
        last = cli.stderr.strip().splitlines()[-1]
        assert cli.returncode == 2 and "still after 3 retries" in last and "AWS_ENDPOINT_URL" in last, cli.stderr
        # 3 retries made (the error says so), one warning line (the others at DEBUG)
        assert cli.stderr.count("retry ") == 1 and "retry 1 of 3 in" in cli.stderr
