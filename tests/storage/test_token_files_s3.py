"""Token files in a bucket (SeaweedFS) read as prefixes ``s3://bucket/path``: the same tokens,
samples and batches as the same files read locally, through TokenFile, the CLI, both orders and
the loader with 0 and 2 workers under fork and spawn; the ``.idx`` downloaded once per node."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from support import run_cli, write_documents
from tokenload import storage
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.format import TokenFile
from tokenload.loader import build_dataloader

from .conftest import BUCKET

CHUNK = 1 << 16  # 64 KiB: a ~0.5 MB .bin spans several chunks


def upload(fs, prefix: str, key: str) -> str:
    """Copy a local token file pair into the bucket; returns its ``s3://`` prefix."""
    for ext in (".bin", ".idx"):
        fs.put(prefix + ext, f"{BUCKET}/{key}{ext}")
    return f"s3://{BUCKET}/{key}"


def corpus(folder, seed: int = 5, count: int = 2500) -> str:
    rng = np.random.default_rng(seed)
    docs = [np.append(rng.integers(0, 50_000, size=int(n)), 50_000) for n in rng.integers(1, 200, size=count)]
    return write_documents(folder / f"corpus{seed}", docs)


@pytest.fixture(scope="module")
def env(s3_endpoint, tmp_path_factory):
    """The environment a user sets (AWS_*) plus a private index cache and small chunks."""
    values = {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
              "AWS_DEFAULT_REGION": "us-east-1", "TOKENLOAD_CACHE_DIR": str(tmp_path_factory.mktemp("idxcache")),
              "TOKENLOAD_CHUNK_BYTES": str(CHUNK)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in values.items():
            mp.setenv(k, v)
        yield values


@pytest.fixture(scope="module")
def files(env, s3_endpoint, tmp_path_factory):
    """(local prefix, s3 prefix) of one corpus."""
    import s3fs

    fs = s3fs.S3FileSystem(key="test", secret="test", client_kwargs={"endpoint_url": s3_endpoint})
    local = corpus(tmp_path_factory.mktemp("local"))
    return local, upload(fs, local, "files/corpus")


def _same_tokens(remote: TokenFile, local: TokenFile) -> None:
    assert len(remote) == len(local) and remote.num_tokens == local.num_tokens
    for i in range(len(local)):
        np.testing.assert_array_equal(remote[i], local[i])
    for a, b in zip(remote[100:400], local[100:400]):
        np.testing.assert_array_equal(a, b)
    starts = np.array([0, 5, 40_000, CHUNK // 2 - 3, 3 * CHUNK // 2 - 10], np.int64)  # within and across chunks
    lengths = np.array([3, 700, 90, 10, 50_000], np.int64)
    np.testing.assert_array_equal(remote.read_spans(starts, lengths), local.read_spans(starts, lengths))
    np.testing.assert_array_equal(remote.document(17), local.document(17))


def test_token_file_reads_the_local_tokens(files):
    local, remote = files
    before = storage.stats()
    tf = TokenFile(remote)
    _same_tokens(tf, TokenFile(local))
    after = storage.stats()
    assert after["gets"] > before["gets"] and after["chunk_hits"] > after["chunk_misses"] - before["chunk_misses"]
    assert after["bytes"] - before["bytes"] >= tf.num_tokens * tf.dtype.itemsize  # every chunk read once at least


def test_default_chunks_read_the_local_tokens(files, monkeypatch):
    """With the defaults a user takes (256 MiB chunks) the first read fetches only its bytes (a
    random reader pays no chunk per read), the second the whole file as one chunk."""
    monkeypatch.delenv("TOKENLOAD_CHUNK_BYTES")
    local, remote = files
    before = storage.stats()["gets"]
    _same_tokens(TokenFile(remote), TokenFile(local))
    assert storage.stats()["gets"] - before == 2


def _two_passes(remote: str) -> tuple[int, int]:
    """GETs of a first and of a second sequential pass over one opened file."""
    tf = TokenFile(remote)
    counts = []
    for _ in range(2):
        before = storage.stats()["gets"]
        for i in range(len(tf)):
            tf[i]
        counts.append(storage.stats()["gets"] - before)
    return counts[0], counts[1]


def test_chunk_cache_is_bounded_and_reads_ahead(files, monkeypatch):
    _, remote = files
    chunks = -(-TokenFile(remote).num_tokens * 2 // CHUNK)
    monkeypatch.setenv("TOKENLOAD_CHUNK_CACHE_BYTES", str(3 * CHUNK))
    ahead = storage.stats()["prefetched"]
    # each pass: its first read alone, then every chunk; 3 chunks held: the second pass reads again
    assert _two_passes(remote) == (chunks + 1, chunks + 1)
    assert storage.stats()["prefetched"] - ahead >= 2 * (chunks - 1)  # all but the first, read ahead
    monkeypatch.setenv("TOKENLOAD_CHUNK_CACHE_BYTES", str(chunks * CHUNK))
    assert _two_passes(remote) == (chunks + 1, 0)
    monkeypatch.setenv("TOKENLOAD_DIRECT_READS", "0")  # Megatron's way: every miss fetches its chunk
    assert _two_passes(remote) == (chunks, 0)


def test_a_chunk_is_read_as_several_gets_of_the_configured_size(files, monkeypatch):
    """TOKENLOAD_GET_BYTES splits each chunk into GETs of that size (several in flight): the
    tokens are the local ones, each part is one GET, and every byte is fetched exactly once."""
    local, remote = files
    part = CHUNK // 4 - 8  # parts that do not divide the chunk: the last part of each is shorter
    monkeypatch.setenv("TOKENLOAD_GET_BYTES", str(part))
    monkeypatch.setenv("TOKENLOAD_GET_THREADS", "3")
    monkeypatch.setenv("TOKENLOAD_DIRECT_READS", "0")
    size = TokenFile(remote).num_tokens * 2
    per_chunk = [-(-min(CHUNK, size - c) // part) for c in range(0, size, CHUNK)]
    before = storage.stats()
    tf = TokenFile(remote)
    for i in range(len(tf)):
        np.testing.assert_array_equal(tf[i], TokenFile(local)[i])
    after = storage.stats()
    assert after["gets"] - before["gets"] == sum(per_chunk) > 4 * len(per_chunk) - 1
    assert after["bytes"] - before["bytes"] == size
    _same_tokens(TokenFile(remote), TokenFile(local))


def test_chunk_tokens_are_read_only(files):
    """Reads hand out views of the cached chunk: writing through one would change what later
    reads of the chunk return, so the views refuse writes."""
    _, remote = files
    tf = TokenFile(remote)
    tf[0], tf[1]  # the second read, next to the first, fetches the chunk
    with pytest.raises(ValueError):
        tf[1][0] = 7


@pytest.mark.parametrize("setting", [("TOKENLOAD_GET_BYTES", "12"), ("TOKENLOAD_GET_BYTES", "0"),
                                     ("TOKENLOAD_GET_THREADS", "0"), ("TOKENLOAD_GET_THREADS", "four")])
def test_bad_get_settings_are_a_config_error(files, env, setting):
    _, remote = files
    name, value = setting
    cli = run_cli("verify", remote, env=dict(env, **{name: value}))
    assert cli.returncode == 2, cli.stdout + cli.stderr
    last = cli.stderr.strip().splitlines()[-1]
    assert "HINT" in last and name in last, cli.stderr


def test_index_copy_is_keyed_by_etag_and_rewritten_objects_get_a_new_copy(files, s3, tmp_path):
    local, _ = files
    remote = upload(s3, local, "rewritten/c")
    first, downloaded = storage.fetch_copy(remote + ".idx")
    assert downloaded and Path(first).read_bytes() == Path(local + ".idx").read_bytes()
    assert storage.fetch_copy(remote + ".idx") == (first, False)
    other = corpus(tmp_path, seed=9, count=300)
    upload(s3, other, "rewritten/c")
    second, downloaded = storage.fetch_copy(remote + ".idx")
    assert downloaded and second != first
    assert len(TokenFile(remote)) == 300
    np.testing.assert_array_equal(TokenFile(remote)[299], TokenFile(other)[299])
    assert not [n for n in os.listdir(os.path.dirname(second)) if ".tmp-" in n]


def _fetch(url):
    return storage.fetch_copy(url)[1]


def test_concurrent_processes_download_an_index_once(files, s3):
    local, _ = files
    remote = upload(s3, local, "concurrent/c")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        downloaded = pool.map(_fetch, [remote + ".idx"] * 8)
    assert sorted(downloaded) == [False] * 7 + [True]


def test_info_and_verify_on_an_s3_prefix(files, env):
    local, remote = files
    got = run_cli("info", "--json", remote, env=env)
    want = run_cli("info", "--json", local)
    assert got.returncode == 0, got.stderr
    got_info, want_info = json.loads(got.stdout), json.loads(want.stdout)
    assert got_info.pop("prefix") == remote
    want_info.pop("prefix")
    assert want_info.pop("sidecar") is not None and got_info.pop("sidecar") is None  # not uploaded
    assert got_info == want_info
    checked = run_cli("verify", "--vocab-size", "50001", remote, env=env)
    assert checked.returncode == 0 and checked.stdout.startswith("OK"), checked.stdout + checked.stderr
    bad = run_cli("verify", "--vocab-size", "50000", remote, env=env)  # EOD 50000 is out of range
    assert bad.returncode == 1 and "50000" in bad.stdout


ORDERS: dict[str, dict[str, Any]] = {
    "megatron": {}, "computed": {"order": "computed"}, "block": {"order": "computed", "block_size": 8},
    "megatron-packed": {"packing": "best-fit"}, "computed-packed": {"order": "computed", "packing": "best-fit"}}


def _train(prefix: str, cache, order: str):
    cached = ORDERS[order].get("order", "megatron") == "megatron"  # the Megatron order's caches
    config = MegatronDataConfig(sequence_length=32, blend=[prefix], split="90,10,0", eod_id=50_000,
                                path_to_cache=str(cache) if cached else None, random_seed=7, **ORDERS[order])
    return build_datasets(config, [400, 20, 0])[0]


@pytest.mark.parametrize("order", list(ORDERS))
def test_both_orders_give_the_local_samples(files, order, tmp_path):
    local, remote = files
    want = _train(local, tmp_path / "local-cache", order)
    got = _train(remote, tmp_path / "remote-cache", order)
    assert len(got) == len(want)
    picks = list(range(0, len(want), 7))
    a, b = got.__getitems__(picks), want.__getitems__(picks)
    assert set(a) == set(b)
    for key in b:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _batches(dataset, **config) -> list[dict]:
    loader = build_dataloader(dataset, micro_batch_size=4, dp_rank=0, dp_size=1, **config)
    try:
        return list(itertools.islice(loader, 12))
    finally:
        loader.close()


@pytest.mark.parametrize("order", ["megatron", "block", "computed-packed"])
@pytest.mark.parametrize("workers", [(0, None), (2, "fork"), (2, "spawn")])
def test_loader_batches_equal_the_local_ones(files, order, workers, tmp_path):
    local, remote = files
    num_workers, method = workers
    want = _batches(_train(local, tmp_path / "l", order), num_workers=0)
    got = _batches(_train(remote, tmp_path / "r", order), num_workers=num_workers, multiprocessing_context=method)
    assert len(got) == len(want) == 12
    for g, w in zip(got, want):
        assert set(g) == set(w)
        for key in w:
            assert torch.equal(g[key], w[key]), key


def _first_read_in_a_forked_worker(remote: str, local: str, out) -> None:
    """In a forked child: read the token file as a fresh worker does; report the botocore sessions
    made, whether the inherited session still held credentials, and whether the tokens match."""
    import botocore.session

    from tokenload.storage import remote as remote_module

    made = []
    real = botocore.session.get_session
    botocore.session.get_session = lambda *a, **k: made.append(1) or real(*a, **k)  # type: ignore[func-returns-value]
    held = [getattr(s, "_credentials", None) is not None for s in remote_module._SESSIONS.values()]
    tf = TokenFile(remote)
    same = all(np.array_equal(tf[i], TokenFile(local)[i]) for i in (0, 7, len(tf) - 1))
    out.send((len(made), held, same))


def test_a_forked_worker_makes_its_client_from_the_training_process_session(files):
    """A fresh worker's first read of s3:// cost 0.8-1.3 s (two client libraries' sessions); a
    forked one now makes only its client, from the parent's botocore session (no connection and
    no credentials cross the fork), and reads the same tokens. Spawn makes its own session."""
    local, remote = files
    TokenFile(remote)[0]  # the training process has opened its files
    for method, sessions in (("fork", 0), ("spawn", 1)):
        ctx = multiprocessing.get_context(method)
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_first_read_in_a_forked_worker, args=(remote, local, send))
        child.start()
        made, held, same = receive.recv()
        child.join(30)
        assert child.exitcode == 0 and same, method
        assert made == sessions, method
        if method == "fork":
            assert held and not any(held)  # inherited sessions, their credentials dropped


def test_a_missing_object_and_a_folder_are_told_apart(files):
    from tokenload.errors import StorageError

    with pytest.raises(StorageError, match=r"files: is a folder, expected an object"):
        storage.fetch_copy(f"s3://{BUCKET}/files")
    with pytest.raises(StorageError, match=r"nothing\.idx: cannot read the object's size: the object does not exist"):
        storage.fetch_copy(f"s3://{BUCKET}/files/nothing.idx")


def test_an_index_download_unlike_its_head_is_discarded(files, monkeypatch, s3):
    """The copy's ETag is checked against the HEAD that named it: another object (rewritten
    between the two) is no copy, and nothing is left in the cache folder."""
    from tokenload.errors import StorageError
    from tokenload.storage import local_copies

    local, _ = files
    remote = upload(s3, local, "headed/c")
    real = local_copies.info
    monkeypatch.setattr(local_copies, "info", lambda url, options: real(url, options).__class__(
        real(url, options).size, "0123456789abcdef"))  # as if rewritten since the HEAD
    with pytest.raises(StorageError, match=r"downloaded \d+ bytes, ETag \w+, expected the \d+ bytes,"
                       r" ETag 0123456789abcdef(.|\n)*HINT: the object changed during the download"):
        storage.fetch_copy(remote + ".idx")
    folder = os.path.dirname(local_copies.copy_path(remote + ".idx", 1, "x", storage.StorageOptions.from_env()))
    assert [n for n in os.listdir(folder) if not n.endswith(".lock")] == []


def test_a_full_index_cache_is_one_error_naming_its_variable_not_retried(files, monkeypatch, tmp_path):
    from support import mounted_tmpfs
    from tokenload.errors import StorageError

    local, remote = files
    assert os.path.getsize(local + ".idx") > 16 << 10
    with mounted_tmpfs(tmp_path / "small", "size=16k") as small:
        monkeypatch.setenv("TOKENLOAD_CACHE_DIR", str(small))
        retries = storage.stats()["retries"]
        with pytest.raises(StorageError, match=r"the filesystem is full.*TOKENLOAD_CACHE_DIR") as info:
            storage.fetch_copy(remote + ".idx")
        assert storage.stats()["retries"] == retries
        assert "\n" not in info.value.message
        left = [os.path.join(r, n) for r, _, names in os.walk(small) for n in names]
        assert all(n.endswith(".lock") for n in left), left  # no partial copy, no temporary


def test_a_killed_download_s_temporary_is_removed_by_the_next_download(files, s3):
    """A process killed mid-download leaves ``.NAME.tmp-*`` (hidden, never read as a copy, as
    large as the copy); the next download of that copy holds the lock, so every such file is a
    dead one's: removed. Others' files in the folder are kept."""
    from tokenload.storage import local_copies

    local, _ = files
    remote = upload(s3, local, "killed/c")
    head = local_copies.info(remote + ".idx", storage.StorageOptions.from_env())
    copy = local_copies.copy_path(remote + ".idx", head.size, head.tag, storage.StorageOptions.from_env())
    folder, name = os.path.split(copy)
    os.makedirs(folder, exist_ok=True)
    left = [os.path.join(folder, f".{name}.tmp-{s}") for s in ("a1b2c3d4", "e5f6g7h8")]
    for path in left:
        with open(path, "wb") as f:
            f.write(b"\0" * 1000)  # a partial download
    other = os.path.join(folder, f".other.idx.tmp-{name}")
    open(other, "wb").close()
    got, downloaded = storage.fetch_copy(remote + ".idx")
    assert downloaded and got == copy and Path(copy).read_bytes() == Path(local + ".idx").read_bytes()
    assert not any(os.path.exists(p) for p in left) and os.path.exists(other)
