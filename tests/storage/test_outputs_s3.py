"""Outputs written to object storage (``s3://`` on the SeaweedFS test server): ``preprocess`` and
``merge``/``convert`` give the bytes of the same commands run locally; a failed run leaves no
``.idx`` in the bucket, a rewrite never pairs a new ``.bin`` with the old ``.idx``, and a rerun
resumes from the local staging folder; an unreachable endpoint, denied credentials and a staging
folder that cannot be written are one-line StorageErrors with exit status 2."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from support import run_cli
from tokenload.errors import StorageError
from tokenload.format import TokenFile
from tokenload.preprocess import PreprocessConfig, TokenizerSpec, preprocess
from tokenload.storage import upload

from .conftest import AUTH_KEY, AUTH_SECRET, BUCKET, auth_s3  # noqa: F401  (fixture)

SUFFIXES = (".bin", ".idx", ".json")


def _corpus(folder: Path, files: int = 3, docs: int = 300) -> Path:
    folder.mkdir(parents=True)
    for f in range(files):
        lines = [json.dumps({"text": f"doc {f}-{i} " + "wörd " * (i % 23), "title": f"t{i % 7}"}) for i in range(docs)]
        (folder / f"{f:02d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def _key() -> str:
    """A fresh folder in the shared bucket for one test."""
    return f"out-{uuid.uuid4().hex[:8]}"


def _env(s3_env, tmp_path: Path, **extra) -> dict:
    env = dict(s3_env, TOKENLOAD_STAGING_DIR=str(tmp_path / "staging"), TOKENLOAD_CACHE_DIR=str(tmp_path / "cache"))
    env.update(extra)
    return env


def _preprocess(inputs, output, *extra, env=None):
    return run_cli("preprocess", "--tokenizer-type", "ByteTokenizer", "--append-eod", "--no-progress",
                   "--input", inputs, "--output-prefix", output, *extra, env=env)


def _same_objects(s3, url_prefix: str, local_prefix: Path) -> None:
    for ext in SUFFIXES:
        remote = s3.cat(url_prefix.removeprefix("s3://") + ext)
        assert remote == Path(str(local_prefix) + ext).read_bytes(), ext
        assert len(remote) > 0


def test_preprocess_to_s3_writes_the_bytes_of_a_local_run(tmp_path, s3, s3_env, monkeypatch):
    corpus = _corpus(tmp_path / "corpus")
    env = _env(s3_env, tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    url = f"s3://{BUCKET}/{_key()}/corpus"
    remote = _preprocess(corpus, url, "--json-keys", "text", "title", "--workers", "2", env=env)
    assert remote.returncode == 0, remote.stderr
    assert f"{url}_text_document.bin/.idx/.json" in remote.stdout
    here = _preprocess(corpus, tmp_path / "local", "--json-keys", "text", "title")
    assert here.returncode == 0, here.stderr
    for key in ("text", "title"):
        _same_objects(s3, f"{url}_{key}_document", tmp_path / f"local_{key}_document")
    # read back as a dataset prefix, through the API and the CLI
    read = TokenFile(f"{url}_text_document")
    local = TokenFile(str(tmp_path / "local_text_document"))
    assert read.num_documents == local.num_documents == 900
    assert (read[899] == local[899]).all()
    info = json.loads(run_cli("info", "--json", f"{url}_text_document", env=env).stdout)
    assert info["documents"] == 900
    verify = run_cli("verify", f"{url}_text_document", "--vocab-size", "257", env=env)
    assert verify.returncode == 0 and verify.stdout.startswith("OK"), verify.stdout + verify.stderr
    # the sidecar in the bucket is read: the tokenizer's vocabulary and the hashes are checked
    assert info["sidecar"]["tokenizer"]["vocab_size"] == 257, info["sidecar"]
    hashes = run_cli("verify", "--hashes", f"{url}_text_document", env=env)
    assert hashes.returncode == 0 and "xxh3-64 hashes against the sidecar" in hashes.stdout, (
        hashes.stdout + hashes.stderr
    )
    assert "the sidecar's vocab_size" in hashes.stdout, hashes.stdout
    # nothing left behind: no work prefix or probe in the bucket, no staging folder
    left = sorted(p.rsplit("/", 1)[1] for p in s3.ls(url.removeprefix("s3://").rsplit("/", 1)[0], refresh=True))
    assert left == sorted(f"corpus_{k}_document{e}" for k in ("text", "title") for e in SUFFIXES)
    assert not list((tmp_path / "staging").iterdir())


def test_a_failed_run_publishes_nothing_and_the_rerun_resumes_from_staging(tmp_path, s3, s3_env):
    corpus = _corpus(tmp_path / "corpus")
    good = (corpus / "01.jsonl").read_bytes()
    (corpus / "01.jsonl").write_bytes(good + b'{"text": "cut\n')
    env = _env(s3_env, tmp_path)
    url = f"s3://{BUCKET}/{_key()}/corpus"
    failed = _preprocess(corpus, url, "--workers", "1", env=env)
    assert failed.returncode == 2 and "01.jsonl:301" in failed.stderr.strip().splitlines()[-1], failed.stderr
    assert not s3.exists(url.removeprefix("s3://") + "_text_document.idx")
    assert not s3.exists(url.removeprefix("s3://") + "_text_document.bin")
    assert list((tmp_path / "staging").iterdir()), "the finished input file's part is kept for a resume"
    (corpus / "01.jsonl").write_bytes(good)
    again = _preprocess(corpus, url, "--workers", "1", env=env)
    assert again.returncode == 0, again.stderr
    assert "(1 resumed)" in again.stdout
    here = _preprocess(corpus, tmp_path / "local")
    assert here.returncode == 0, here.stderr
    _same_objects(s3, f"{url}_text_document", tmp_path / "local_text_document")


def test_a_rewrite_that_fails_to_upload_the_index_leaves_no_old_index(tmp_path, s3, s3_env, monkeypatch):
    """The old .idx is deleted before the new .bin goes up, so a reader meets either the old
    pair, no index, or the new pair: here the new .idx upload fails, and the rerun finishes."""
    for name, value in _env(s3_env, tmp_path, TOKENLOAD_RETRIES="0").items():
        monkeypatch.setenv(name, value)
    url = f"s3://{BUCKET}/{_key()}/corpus"
    old_corpus = _corpus(tmp_path / "old", files=1, docs=50)
    config = lambda inputs: PreprocessConfig(inputs=(str(inputs),), output_prefix=url,  # noqa: E731
                                             tokenizer=TokenizerSpec(kind="byte"), workers=1)
    preprocess(config(old_corpus), progress=False)
    old_bin = s3.cat(url.removeprefix("s3://") + "_text_document.bin")
    real_upload = upload.upload_file

    def failing(local, target, options=None):
        if target.endswith(".idx"):
            raise StorageError("cannot upload it: access denied", path=target, hint="test")
        real_upload(local, target, options)

    monkeypatch.setattr(upload, "upload_file", failing)
    new_corpus = _corpus(tmp_path / "new", files=2, docs=80)
    with pytest.raises(StorageError, match="access denied"):
        preprocess(config(new_corpus), progress=False)
    base = url.removeprefix("s3://") + "_text_document"
    assert not s3.exists(base + ".idx")
    assert s3.cat(base + ".bin") != old_bin  # the new .bin is there, without an index to misread it
    monkeypatch.setattr(upload, "upload_file", real_upload)
    preprocess(config(new_corpus), progress=False)
    local = PreprocessConfig(inputs=(str(new_corpus),), output_prefix=str(tmp_path / "local"),
                             tokenizer=TokenizerSpec(kind="byte"), workers=1)
    preprocess(local, progress=False)
    _same_objects(s3, url + "_text_document", tmp_path / "local_text_document")


def test_merge_and_convert_s3_to_s3_equal_local_runs(tmp_path, s3, s3_env):
    corpus = _corpus(tmp_path / "corpus", files=4, docs=100)
    env = _env(s3_env, tmp_path)
    key = _key()
    (tmp_path / "shards").mkdir()
    for shard in range(2):
        made = _preprocess(corpus, tmp_path / "shards" / "c", "--num-shards", "2", "--shard-index", shard)
        assert made.returncode == 0, made.stderr
        name = f"c-{shard:05d}-of-00002_text_document"
        for ext in SUFFIXES:
            s3.put(str(tmp_path / "shards" / (name + ext)), f"{BUCKET}/{key}/{name}{ext}")
    inputs = [f"{{}}/c-{i:05d}-of-00002_text_document" for i in range(2)]
    merged = run_cli("merge", *[p.format(f"s3://{BUCKET}/{key}") for p in inputs], "--output-prefix",
                     f"s3://{BUCKET}/{key}/merged", env=env)
    assert merged.returncode == 0, merged.stderr
    here = run_cli("merge", *[p.format(tmp_path / "shards") for p in inputs], "--output-prefix", tmp_path / "merged")
    assert here.returncode == 0, here.stderr
    _same_objects(s3, f"s3://{BUCKET}/{key}/merged", tmp_path / "merged")
    assert json.loads((tmp_path / "merged.json").read_text())["tokenizer"] is not None
    converted = run_cli("convert", f"s3://{BUCKET}/{key}/merged", "--output-prefix", f"s3://{BUCKET}/{key}/conv",
                        env=env)
    assert converted.returncode == 0, converted.stderr
    here = run_cli("convert", tmp_path / "merged", "--output-prefix", tmp_path / "conv")
    assert here.returncode == 0, here.stderr
    for ext in (".bin", ".idx"):
        assert s3.cat(f"{BUCKET}/{key}/conv{ext}") == (tmp_path / f"conv{ext}").read_bytes()
    assert not list((tmp_path / "staging").iterdir())
    # --input takes a folder of objects too (it garbled 's3://' into a local path before)
    folder = run_cli("merge", "--input", f"s3://{BUCKET}/{key}/", "--output-prefix", tmp_path / "from-folder", env=env)
    assert folder.returncode == 0, folder.stderr
    here = run_cli("merge", "--input", tmp_path / "shards", "--output-prefix", tmp_path / "from-local")
    assert here.returncode == 0, here.stderr
    # the bucket's folder holds the two shards, then conv and merged (each the shards' documents): sorted by name
    whole, shards = TokenFile(str(tmp_path / "from-folder")), TokenFile(str(tmp_path / "from-local"))
    assert whole.num_documents == 3 * shards.num_documents
    for i in (0, shards.num_documents - 1):
        for k in range(3):
            assert (whole[i + k * shards.num_documents] == shards[i]).all()


def _one_line_storage_error(result, command: str) -> str:
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"tokenload {command}: error: ") and "HINT" in last, result.stderr
    assert "Traceback" not in result.stderr
    return last


def test_unreachable_output_endpoint_is_a_storage_error_before_any_work(tmp_path, s3_env):
    corpus = _corpus(tmp_path / "corpus", files=1, docs=10)
    dead = _env(s3_env, tmp_path, AWS_ENDPOINT_URL="http://127.0.0.1:9", TOKENLOAD_RETRIES="1",
                TOKENLOAD_RETRY_BACKOFF="0.05")
    url = f"s3://{BUCKET}/{_key()}/corpus"
    last = _one_line_storage_error(_preprocess(corpus, url, env=dead), "preprocess")
    assert url in last and "AWS_ENDPOINT_URL" in last
    here = _preprocess(corpus, tmp_path / "local")
    assert here.returncode == 0
    last = _one_line_storage_error(run_cli("merge", tmp_path / "local_text_document", "--output-prefix", url,
                                           env=dead), "merge")
    assert url in last and "test object" in last  # checked before the merge, not when publishing
    assert not (tmp_path / "staging").exists() or not list((tmp_path / "staging").iterdir())


def test_a_wrong_output_bucket_fails_before_the_merge_and_leaves_no_staging(tmp_path, s3_env):
    corpus = _corpus(tmp_path / "corpus", files=1, docs=10)
    env = _env(s3_env, tmp_path)
    assert _preprocess(corpus, tmp_path / "local").returncode == 0
    url = f"s3://{BUCKET}-typo/{_key()}/merged"
    for command in (("merge", tmp_path / "local_text_document"), ("convert", tmp_path / "local_text_document")):
        last = _one_line_storage_error(run_cli(*command, "--output-prefix", url, env=env), command[0])
        assert url in last and "test object" in last and "bucket" in last
    assert not (tmp_path / "staging").exists() or not list((tmp_path / "staging").iterdir())


def test_denied_credentials_on_output_are_a_storage_error(tmp_path, auth_s3):
    corpus = _corpus(tmp_path / "corpus", files=1, docs=10)
    wrong = {"AWS_ENDPOINT_URL": auth_s3, "AWS_ACCESS_KEY_ID": AUTH_KEY, "AWS_SECRET_ACCESS_KEY": "wrong-secret",
             "AWS_DEFAULT_REGION": "us-east-1", "TOKENLOAD_STAGING_DIR": str(tmp_path / "staging")}
    result = _preprocess(corpus, f"s3://{BUCKET}/{_key()}/corpus", env=wrong)
    last = _one_line_storage_error(result, "preprocess")
    assert "denied" in last and "AWS_ACCESS_KEY_ID" in last
    assert AUTH_SECRET not in result.stderr and "wrong-secret" not in result.stderr


def test_a_staging_folder_that_cannot_be_written_names_its_variable(tmp_path, s3_env):
    corpus = _corpus(tmp_path / "corpus", files=1, docs=10)
    (tmp_path / "a-file").write_text("not a folder")
    env = _env(s3_env, tmp_path, TOKENLOAD_STAGING_DIR=str(tmp_path / "a-file" / "staging"))
    last = _one_line_storage_error(_preprocess(corpus, f"s3://{BUCKET}/{_key()}/corpus", env=env), "preprocess")
    assert "TOKENLOAD_STAGING_DIR" in last
    here = _preprocess(corpus, tmp_path / "local")
    assert here.returncode == 0
    last = _one_line_storage_error(run_cli("merge", tmp_path / "local_text_document", "--output-prefix",
                                           f"s3://{BUCKET}/{_key()}/merged", env=env), "merge")
    assert "TOKENLOAD_STAGING_DIR" in last
