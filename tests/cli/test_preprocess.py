"""`tokenload preprocess` and `tokenload corpus` as real commands, including a run killed with
SIGKILL mid-way and restarted (same bytes as an uninterrupted run) and shard-then-merge."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from support import run_cli
from tokenload.format import TokenFile, read_sidecar

BYTES = ("--tokenizer-type", "ByteTokenizer")


def write_jsonl(path: Path, texts) -> str:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return str(path)


def same(a: str, b: str, exts=(".bin", ".idx", ".json")) -> bool:
    return all(Path(a + e).read_bytes() == Path(b + e).read_bytes() for e in exts)


def sample_texts(n: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "délta", "日本", "x1", "y22", "(z)", "\n", "  "]
    return ["".join(rng.choice(words) + " " for _ in range(rng.randint(0, 40))) for _ in range(n)]


def test_preprocess_writes_megatron_names_and_prints_a_summary(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ["hello", "", "wörld"])
    out = run_cli(
        "preprocess",
        *BYTES,
        "--input",
        src,
        "--output-prefix",
        tmp_path / "corpus",
        "--append-eod",
        "--workers",
        "2",
        "--no-progress",
    )
    assert out.returncode == 0, out.stderr
    prefix = str(tmp_path / "corpus_text_document")
    assert "preprocess: 3 documents, 13 tokens from 1 input file(s)" in out.stdout
    assert "skipped  none" in out.stdout and f"output   {prefix}.bin/.idx/.json" in out.stdout
    tf = TokenFile(prefix)
    assert [tf[i].tolist() for i in range(tf.num_sequences)] == [
        [*list(b"hello"), 256],
        [*list("wörld".encode()), 256],
    ]
    assert tf.num_documents == 3
    verify = run_cli("verify", "--hashes", "--vocab-size", "257", prefix)
    assert verify.returncode == 0, verify.stdout


def test_bad_input_exits_2_with_file_line_and_reason(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "a"}\n{"text": "b"\n')
    out = run_cli("preprocess", *BYTES, "--input", src, "--output-prefix", tmp_path / "o", "--no-progress")
    assert out.returncode == 2
    assert f"error: {src}:2: malformed_json: not valid JSON" in out.stderr
    assert "--on-bad-record skip" in out.stderr
    skip = run_cli(
        "preprocess",
        *BYTES,
        "--input",
        src,
        "--output-prefix",
        tmp_path / "o",
        "--on-bad-record",
        "skip",
        "--no-progress",
    )
    assert skip.returncode == 0 and "skipped  malformed_json 1" in skip.stdout
    missing = run_cli(
        "preprocess", *BYTES, "--input", tmp_path / "nope.jsonl", "--output-prefix", tmp_path / "o"
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_megatron_and_neox_flags_run_unchanged_or_fail_with_the_reason(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", sample_texts(30))
    plain = run_cli(
        "preprocess",
        *BYTES,
        "--input",
        src,
        "--output-prefix",
        tmp_path / "plain",
        "--append-eod",
        "--no-progress",
    )
    assert plain.returncode == 0, plain.stderr
    # flags that do not change the bytes: Megatron's contiguous partitions and logging, NeoX's names
    peers = run_cli(
        "preprocess", *BYTES, "--input", src, "--output-prefix", tmp_path / "peers", "--append-eod", "--no-progress",
        "--partitions", "2", "--keep-sequential-samples", "--log-interval", "10", "--num-docs", "30",
        "--dataset-impl", "mmap", "--jsonl-keys", "text",
    )
    assert peers.returncode == 0, peers.stderr
    assert same(str(tmp_path / "plain_text_document"), str(tmp_path / "peers_text_document"), (".bin", ".idx"))
    refused = {
        ("--split-sentences",): "one sequence per sentence",
        ("--split-sentences", "--keep-newlines", "--lang", "english"): "one sequence per sentence",
        ("--partitions", "4"): "round-robin",
        ("--partitions", "0"): "expected >= 1",
        ("--dataset-impl", "cached"): "only mmap",
        ("--ftfy",): "ftfy",
    }
    for flags, reason in refused.items():
        out = run_cli(
            "preprocess",
            *BYTES,
            "--input",
            src,
            "--output-prefix",
            tmp_path / "refused",
            "--no-progress",
            *flags,
        )
        assert out.returncode == 2, (flags, out.stderr)
        assert reason in out.stderr and "HINT" in out.stderr.upper(), (flags, out.stderr)
        assert len(out.stderr.strip().splitlines()) <= 2, out.stderr  # one line (and its hint), no traceback
    assert not list(tmp_path.glob("refused*")), "a refused run wrote files"


def _slow_tokenizer(path: Path, texts) -> str:
    """A byte-level BPE tokenizer.json; encoded with --engine native it is slow enough to kill."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok.save(str(path))
    return str(path)


def test_killed_run_resumes_to_the_same_bytes(tmp_path):
    tokenizer = _slow_tokenizer(tmp_path / "tok.json", sample_texts(300, seed=99))
    inputs = [
        write_jsonl(tmp_path / f"part{i:02d}.jsonl", sample_texts(250, seed=i)) for i in range(40)
    ]
    args = [
        "preprocess",
        "--input",
        str(tmp_path / "part*.jsonl"),
        "--tokenizer-type",
        "HuggingFaceTokenizer",
        "--tokenizer-model",
        tokenizer,
        "--engine",
        "native",
        "--append-eod",
        "--workers",
        "1",
        "--no-progress",
    ]
    clean = run_cli(*args, "--output-prefix", tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr

    prefix = tmp_path / "killed"
    work = Path(str(prefix) + ".tokenload-work")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenload.cli.main", *args, "--output-prefix", str(prefix)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while (
        time.monotonic() < deadline and proc.poll() is None and len(list(work.glob("*.done"))) < 3
    ):
        time.sleep(0.005)
    still_running = proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = len(list(work.glob("*.done")))
    assert still_running and 3 <= finished < len(inputs), (
        f"not killed mid-run ({finished} files done)"
    )
    print(f"killed after {finished} of {len(inputs)} files")
    assert not Path(str(prefix) + "_text_document.idx").exists()  # nothing valid-looking yet

    resumed = run_cli(*args, "--output-prefix", prefix)
    assert resumed.returncode == 0, resumed.stderr
    assert f"from 40 input file(s) ({finished} resumed)" in resumed.stdout
    assert f"(the {40 - finished} file(s) encoded now)" in resumed.stdout
    assert same(str(prefix) + "_text_document", str(tmp_path / "clean") + "_text_document")
    assert not work.exists()
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_shards_from_torchrun_environment_merge_to_a_single_run(tmp_path):
    inputs = [write_jsonl(tmp_path / f"in{i}.jsonl", sample_texts(30, seed=i)) for i in range(5)]
    common = ["preprocess", *BYTES, "--input", *inputs, "--append-eod", "--no-progress"]
    single = run_cli(*common, "--output-prefix", tmp_path / "single")
    assert single.returncode == 0, single.stderr
    shards = []
    for rank in range(2):
        out = run_cli(
            *common, "--output-prefix", tmp_path / "sh", env={"RANK": str(rank), "WORLD_SIZE": "2"}
        )
        assert out.returncode == 0, out.stderr
        assert "tokenload merge" in out.stdout
        shards.append(str(tmp_path / f"sh-{rank:05d}-of-00002_text_document"))
    assert read_sidecar(shards[1]).metadata["shard"] == {"index": 1, "count": 2}
    merged = run_cli("merge", *shards, "--output-prefix", tmp_path / "merged")
    assert merged.returncode == 0, merged.stderr
    assert same(str(tmp_path / "merged"), str(tmp_path / "single_text_document"), (".bin", ".idx"))


def test_corpus_command_writes_stdlib_jsonl_that_preprocesses(tmp_path):
    out = run_cli("corpus", "--output", tmp_path / "stdlib.jsonl", "--max-mb", "0.3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("wrote "), out.stdout
    lines = (tmp_path / "stdlib.jsonl").read_text(encoding="utf-8").splitlines()
    assert lines and all("text" in json.loads(line) for line in lines)
    pre = run_cli(
        "preprocess",
        *BYTES,
        "--input",
        tmp_path / "stdlib.jsonl",
        "--output-prefix",
        tmp_path / "std",
        "--append-eod",
        "--no-progress",
    )
    assert pre.returncode == 0, pre.stderr
    assert TokenFile(str(tmp_path / "std_text_document")).num_documents == len(lines)


def test_a_rerun_with_every_file_done_says_so_instead_of_a_zero_rate(tmp_path, monkeypatch):
    """Outputs that failed to write (a full disk) after every input file was encoded: the rerun
    only writes them, and its summary says there was nothing left to encode."""
    import errno
    from dataclasses import replace

    import pytest

    from tokenload.cli.preprocess import summary_text
    from tokenload.errors import StorageError
    from tokenload.preprocess import PreprocessConfig, TokenizerSpec, pipeline, preprocess

    inputs = tuple(write_jsonl(tmp_path / f"in{i}.jsonl", sample_texts(20, seed=i)) for i in range(2))
    config = PreprocessConfig(
        inputs=inputs, output_prefix=str(tmp_path / "out"), tokenizer=TokenizerSpec(kind="byte")
    )
    real = pipeline._write_outputs

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pipeline, "_write_outputs", disk_full)
    with pytest.raises(StorageError, match="rerun"):
        preprocess(config, progress=False)
    monkeypatch.setattr(pipeline, "_write_outputs", real)
    result = preprocess(config, progress=False)
    assert (result.files, result.files_resumed, result.encoded_tokens) == (2, 2, 0)
    text = summary_text(config, result)
    assert "nothing left to encode (every input file was finished by an earlier run)" in text
    assert "tokens/s" not in text
    clean = replace(config, output_prefix=str(tmp_path / "clean"))
    preprocess(clean, progress=False)
    assert same(str(tmp_path / "out_text_document"), str(tmp_path / "clean_text_document"))
