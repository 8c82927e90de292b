"""The Ray executor writes the same bytes as one machine's process executor: many small files of
every input format (JSONL, zstd JSONL, parquet), and one large file split into byte ranges, with
bad records reported at the same file:line; from the CLI on a two-node cluster, and from the
Python API on a local cluster it starts itself."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from ray_corpus import docs, jsonl_bytes, same_outputs, train_tokenizer

from support import run_cli
from tokenload.preprocess import PreprocessConfig, TokenizerSpec, preprocess


def _cli(*args, env=None):
    return run_cli("preprocess", "--no-progress", *args, env=env, timeout=240)


def test_many_small_files_of_every_format_give_the_same_bytes(tmp_path, ray_env):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(6):
        (corpus / f"a{i}.jsonl").write_bytes(jsonl_bytes(docs(60, i)))
    for i in range(3):
        (corpus / f"b{i}.jsonl.zst").write_bytes(zstandard.compress(jsonl_bytes(docs(80, 10 + i))))
    for i in range(3):
        table = pa.Table.from_pylist(docs(70, 20 + i))
        pq.write_table(table, corpus / f"c{i}.parquet", row_group_size=25)
    tok = train_tokenizer(tmp_path / "tokenizer.json")
    common = ("--input", corpus, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tok,
              "--append-eod", "--eod-token", "<|endoftext|>")
    ray = _cli(*common, "--executor", "ray", "--output-prefix", tmp_path / "ray", env=ray_env)
    assert ray.returncode == 0, ray.stderr
    assert "ray: 12 task(s) for 12 input file(s)" in ray.stderr
    one = _cli(*common, "--executor", "processes", "--workers", "2", "--output-prefix", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    same_outputs(tmp_path / "ray_text_document", tmp_path / "one_text_document")
    assert "12 input file(s)" in ray.stdout and ", ray]" in ray.stdout
    assert not (tmp_path / "ray.tokenload-work").exists()


def _big_file(path, bad_lines: dict[int, bytes]) -> None:
    lines = jsonl_bytes(docs(12000, 5)).splitlines(keepends=True)
    for number, text in bad_lines.items():
        lines[number - 1] = text
    path.write_bytes(b"".join(lines))


def test_one_large_file_in_byte_ranges_gives_the_same_bytes_and_bad_record_lines(tmp_path, ray_env):
    big = tmp_path / "big.jsonl"
    _big_file(big, {7777: b'{"text": broken\n', 11000: b'[1, 2]\n'})
    assert big.stat().st_size > 1 << 20
    common = ("--input", big, "--tokenizer-type", "ByteTokenizer", "--append-eod", "--chunk-mb", "0.03",
              "--range-mb", "0.125", "--on-bad-record", "skip")
    ray = _cli(*common, "--executor", "ray", "--output-prefix", tmp_path / "ray", env=ray_env)
    assert ray.returncode == 0, ray.stderr
    assert "(1 split into" in ray.stderr
    one = _cli(*common, "--executor", "processes", "--workers", "2", "--output-prefix", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    same_outputs(tmp_path / "ray_text_document", tmp_path / "one_text_document")
    skipped = lambda out: [line for line in out.stderr.splitlines() if "skipped" in line]  # noqa: E731
    assert skipped(ray) == skipped(one) and len(skipped(ray)) == 2
    assert f"{big}:7777: malformed_json" in skipped(ray)[0] and f"{big}:11000: not_object" in skipped(ray)[1]
    assert "malformed_json 1, not_object 1" in ray.stdout

    strict = _cli(*common[:-2], "--executor", "ray", "--output-prefix", tmp_path / "strict", env=ray_env)
    assert strict.returncode == 2
    assert strict.stderr.strip().splitlines()[-1].startswith(f"tokenload preprocess: error: {big}:7777: malformed_json")


def test_the_api_starts_a_local_cluster_when_given_no_address(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for i in range(3):
        (tmp_path / f"{i}.jsonl").write_bytes(jsonl_bytes(docs(50, i)))
    base = dict(inputs=(str(tmp_path / "*.jsonl"),), tokenizer=TokenizerSpec(kind="byte"), append_eod=True, workers=1)
    result = preprocess(PreprocessConfig(output_prefix=str(tmp_path / "ray"), executor="ray", **base), progress=False)
    one = preprocess(
        PreprocessConfig(output_prefix=str(tmp_path / "one"), executor="processes", **base),
        progress=False,
    )
    assert (result.documents, result.tokens, result.files) == (one.documents, one.tokens, 3)
    same_outputs(tmp_path / "ray_text_document", tmp_path / "one_text_document")
    import ray

    assert not ray.is_initialized()  # the cluster it started is gone again
