"""The preprocess pipeline end to end (in-process): Megatron's output for the same ids, identical
bytes for any worker count, chunking and executor, every input kind, bad inputs, resume after a
failure, and shard-then-merge."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from preprocess_texts import make_texts
from tokenload.errors import ConfigError, RecordError
from tokenload.format import TokenFile, TokenFileWriter, merge_token_files, read_sidecar
from tokenload.preprocess import PreprocessConfig, TokenizerSpec, load_tokenizer, preprocess


def reference(prefix, docs, ids_of, eod, dtype=np.uint16) -> str:
    """Megatron preprocess_data.py's rule, one document at a time, with the plain writer."""
    with TokenFileWriter(prefix, dtype) as w:
        for text in docs:
            ids = list(ids_of(text))
            if ids and eod is not None:
                ids.append(eod)
            w.add_document(np.array(ids, dtype=np.int64), [len(ids)] if ids else [])
    return str(prefix)


def byte_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def same_files(a: str, b: str, exts=(".bin", ".idx")) -> bool:
    return all(Path(a + e).read_bytes() == Path(b + e).read_bytes() for e in exts)


def write_jsonl(path: Path, docs, key="text", extra=None) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            record = {key: d, "id": i, **(extra(i) if extra else {})}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return str(path)


BYTES = TokenizerSpec(kind="byte")


def run(inputs, out, **kw):
    kw.setdefault("workers", 2)
    kw.setdefault("tokenizer", BYTES)
    return preprocess(
        PreprocessConfig(inputs=tuple(map(str, inputs)), output_prefix=str(out), **kw),
        progress=False,
    )


@pytest.fixture
def docs():
    return make_texts(400, seed=5)


def test_jsonl_equals_megatron_rule_with_hf_tokenizer_and_two_keys(tmp_path, tokenizer_files, docs):
    from tokenizers import Tokenizer

    files = [
        write_jsonl(
            tmp_path / f"in{i}.jsonl",
            docs[i * 100 : (i + 1) * 100],
            extra=lambda j: {"title": f"t{j}"},
        )
        for i in range(4)
    ]
    spec = TokenizerSpec(kind="HuggingFaceTokenizer", model=tokenizer_files["bytelevel"])
    result = run(
        files, tmp_path / "out", tokenizer=spec, json_keys=("text", "title"), append_eod=True
    )
    hf = Tokenizer.from_file(tokenizer_files["bytelevel"])
    eod = hf.token_to_id("<|endoftext|>")
    ref = reference(tmp_path / "ref", docs, lambda t: hf.encode(t).ids, eod)
    assert same_files(result.outputs["text"], ref)
    titles = [f"t{j}" for _ in range(4) for j in range(100)]
    assert same_files(
        result.outputs["title"],
        reference(tmp_path / "ref_t", titles, lambda t: hf.encode(t).ids, eod),
    )
    assert result.outputs["text"] == str(tmp_path / "out_text_document")
    assert result.documents == 400 and result.engine == "gigatoken"
    side = read_sidecar(result.outputs["text"])
    assert side.tokenizer == load_tokenizer(spec).identity()
    assert side.metadata["inputs"] == files and side.metadata["skipped"] == {}
    assert not (tmp_path / "out.tokenload-work").exists()


def test_empty_texts_are_documents_without_sequences_or_eod(tmp_path):
    path = write_jsonl(tmp_path / "e.jsonl", ["ab", "", "c", ["", "de", "", "f"], []])
    result = run([path], tmp_path / "out", append_eod=True)
    tf = TokenFile(result.outputs["text"])
    assert tf.num_documents == 5
    assert np.diff(tf.document_indices).tolist() == [1, 0, 1, 2, 0]
    assert tf.sequence_lengths.tolist() == [3, 2, 2, 2]
    assert [tf[i].tolist() for i in range(4)] == [[97, 98, 256], [99, 256], [100, 101], [102, 256]]


def test_bytes_identical_for_any_workers_chunking_and_executor(tmp_path, tokenizer_files, docs):
    files = [write_jsonl(tmp_path / f"in{i}.jsonl", docs[i::3]) for i in range(3)]
    spec = TokenizerSpec(kind="hf", model=tokenizer_files["sp_bpe_json"])
    runs = [
        dict(workers=1, chunk_bytes=1 << 22),
        dict(workers=2, chunk_bytes=1024),
        dict(workers=4, chunk_bytes=2048),
        dict(workers=2, chunk_bytes=1500, executor="processes"),
    ]
    outs = [
        run(files, tmp_path / f"o{i}", tokenizer=spec, append_eod=True, **kw).outputs["text"]
        for i, kw in enumerate(runs)
    ]
    for other in outs[1:]:
        assert same_files(outs[0], other, (".bin", ".idx", ".json"))


def test_every_input_kind_gives_the_same_documents(tmp_path, docs):
    texts = [d.replace("\n", " ").replace("\r", " ") for d in docs if d.strip()][:150]
    ref = reference(tmp_path / "ref", texts, byte_ids, 256)
    data = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    (tmp_path / "j").mkdir()
    inputs = {
        "jsonl": [write_jsonl(tmp_path / "j" / "a.jsonl", texts)],
        "gz": [str(tmp_path / "a.jsonl.gz")],
        "zst": [str(tmp_path / "a.jsonl.zst")],
        "parquet": [str(tmp_path / "a.parquet")],
        "lines": [str(tmp_path / "a.txt")],
        "folder": [str(tmp_path / "docs")],
        "glob": [str(tmp_path / "docs" / "*.txt")],
        "url": ["file://" + str(tmp_path / "j" / "a.jsonl")],
    }
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet", row_group_size=40)
    (tmp_path / "a.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    (tmp_path / "docs").mkdir()
    for i, t in enumerate(texts):
        (tmp_path / "docs" / f"{i:04d}.txt").write_text(t, encoding="utf-8")
    for kind, paths in inputs.items():
        fmt = "lines" if kind == "lines" else "auto"
        result = run(paths, tmp_path / kind, append_eod=True, input_format=fmt, chunk_bytes=2048)
        assert same_files(result.outputs["text"], ref), kind


def test_skip_mode_counts_reasons_and_skips_damaged_files(tmp_path):
    good = write_jsonl(tmp_path / "a.jsonl", ["one", "two"])
    bad = tmp_path / "b.jsonl"
    bad.write_bytes(
        b'{"text": "three"}\n{"text": 3}\n\n{broken\n{"body": "x"}\n'
        b'{"text": "\xff"}\n{"text": "four"}\n'
    )
    payload = gzip.compress(b'{"text": "lost"}\n' * 2000)
    damaged = tmp_path / "c.jsonl.gz"
    damaged.write_bytes(payload[: len(payload) // 2])
    with pytest.raises(RecordError, match=r"b.jsonl:2: not_text"):
        run([good, bad, damaged], tmp_path / "strict")
    assert not Path(str(tmp_path / "strict") + "_text_document.bin").exists()
    result = run([good, bad, damaged], tmp_path / "out", on_bad_record="skip", resume=False)
    ref = reference(tmp_path / "ref", ["one", "two", "three", "four"], byte_ids, None)
    assert same_files(result.outputs["text"], ref)
    expected = {
        "blank_line": 1,
        "malformed_json": 1,
        "missing_key": 1,
        "not_text": 1,
        "not_utf8": 1,
        "unreadable_file": 1,
    }
    assert result.skipped == expected
    assert read_sidecar(result.outputs["text"]).metadata["skipped"] == expected


def test_damaged_file_stops_error_mode(tmp_path):
    payload = zstandard.ZstdCompressor().compress(b'{"text": "x"}\n' * 5000)
    path = tmp_path / "d.jsonl.zst"
    path.write_bytes(payload[:-20])
    with pytest.raises(
        RecordError, match="cannot read the file to its end: the zstd stream is truncated"
    ):
        run([path], tmp_path / "out")


def test_resume_reuses_finished_files_and_gives_identical_bytes(tmp_path, docs):
    files = [write_jsonl(tmp_path / f"in{i}.jsonl", docs[i * 80 : (i + 1) * 80]) for i in range(4)]
    clean = run(files, tmp_path / "clean", append_eod=True).outputs["text"]
    broken = Path(files[2]).read_text(encoding="utf-8") + "{not json}\n"
    Path(files[2]).write_text(broken, encoding="utf-8")
    with pytest.raises(RecordError, match=r"in2.jsonl:81: malformed_json"):
        run(files, tmp_path / "out", append_eod=True)
    work = tmp_path / "out.tokenload-work"
    assert sorted(p.name for p in work.glob("*.done")) == ["000000.done", "000001.done"]
    Path(files[2]).write_text(broken.replace("{not json}\n", ""), encoding="utf-8")
    result = run(files, tmp_path / "out", append_eod=True, workers=1)
    assert result.files_resumed == 2 and result.files == 4
    assert same_files(result.outputs["text"], clean, (".bin", ".idx", ".json"))
    assert not work.exists()


def test_a_changed_input_is_redone_and_a_different_job_is_refused(tmp_path, docs):
    files = [write_jsonl(tmp_path / f"in{i}.jsonl", docs[i * 50 : (i + 1) * 50]) for i in range(3)]
    Path(files[2]).write_text("oops\n")
    with pytest.raises(RecordError):
        run(files, tmp_path / "out")
    write_jsonl(Path(files[0]), ["changed", *docs[1:50]])  # changes a finished file
    write_jsonl(Path(files[2]), docs[100:150])
    with pytest.raises(ConfigError, match=r"settings differ from this run.s \(differs in: append_eod\)"):
        run(files, tmp_path / "out", append_eod=True)
    result = run(files, tmp_path / "out")
    assert result.files_resumed == 1
    ref = reference(tmp_path / "ref", ["changed", *docs[1:150]], byte_ids, None)
    assert same_files(result.outputs["text"], ref)


def test_an_input_edited_in_place_with_its_time_set_back_is_redone(tmp_path, docs):
    """A finished input edited in place to the same size, its modification time set back
    (`touch -r`, `cp -p`, `rsync -a`), kept its old tokens on a resume (a red-team finding: the
    output passed `verify --hashes`); its change time differs, so it is encoded again."""
    files = [write_jsonl(tmp_path / f"in{i}.jsonl", docs[i * 50 : (i + 1) * 50]) for i in range(3)]
    Path(files[2]).write_text("oops\n")
    with pytest.raises(RecordError):
        run(files, tmp_path / "out")
    first = Path(files[0])
    before = first.stat()
    text = first.read_text(encoding="utf-8")
    at = text.index(docs[0][:4])
    edited = text[:at] + "Z" * 4 + text[at + 4 :]
    assert len(edited.encode()) == len(text.encode()) and edited != text
    time.sleep(0.01)  # a change time of its own, even on a coarse clock
    first.write_text(edited, encoding="utf-8")
    os.utime(first, ns=(before.st_atime_ns, before.st_mtime_ns))  # as `touch -r` does
    assert (first.stat().st_size, first.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    write_jsonl(Path(files[2]), docs[100:150])
    result = run(files, tmp_path / "out")
    assert result.files_resumed == 1  # in1 only: in0 is encoded again
    fresh = run(files, tmp_path / "fresh")
    assert same_files(result.outputs["text"], fresh.outputs["text"])


def test_shards_merged_in_order_equal_a_single_run(tmp_path, tokenizer_files, docs):
    files = [write_jsonl(tmp_path / f"in{i}.jsonl", docs[i * 57 : (i + 1) * 57]) for i in range(7)]
    spec = TokenizerSpec(
        kind="gpt2",
        vocab_file=tokenizer_files["gpt2_vocab"],
        merge_file=tokenizer_files["gpt2_merges"],
    )
    single = run(files, tmp_path / "single", tokenizer=spec, append_eod=True).outputs["text"]
    shards = [
        run(
            files, tmp_path / "sh", tokenizer=spec, append_eod=True, num_shards=3, shard_index=i
        ).outputs["text"]
        for i in range(3)
    ]
    assert shards[1] == str(tmp_path / "sh-00001-of-00003_text_document")
    assert [len(read_sidecar(s).metadata["inputs"]) for s in shards] == [2, 2, 3]
    merge_token_files(shards, tmp_path / "merged")
    assert same_files(str(tmp_path / "merged"), single)


def test_more_shards_than_files_gives_empty_valid_outputs(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", ["x"])
    result = run([path], tmp_path / "sh", num_shards=2, shard_index=0)
    tf = TokenFile(result.outputs["text"])
    assert (tf.num_documents, tf.num_tokens, result.files) == (0, 0, 0)


def test_append_eod_needs_an_eod_token(tmp_path, tokenizer_files):
    path = write_jsonl(tmp_path / "a.jsonl", ["x"])
    spec = TokenizerSpec(kind="hf", model=tokenizer_files["wordpiece"])
    with pytest.raises(ConfigError, match="`append_eod=True` needs an EOD token"):
        run([path], tmp_path / "out", tokenizer=spec, append_eod=True)
    ok = run(
        [path],
        tmp_path / "out",
        tokenizer=TokenizerSpec(kind="hf", model=tokenizer_files["wordpiece"], eod_token="[SEP]"),
        append_eod=True,
    )
    assert TokenFile(ok.outputs["text"])[0].tolist()[-1] == 1


def test_config_validation():
    with pytest.raises(ConfigError, match="no input"):
        PreprocessConfig(inputs=(), output_prefix="x", tokenizer=BYTES)
    with pytest.raises(ConfigError, match="names a folder"):
        PreprocessConfig(inputs=("a",), output_prefix="out/", tokenizer=BYTES)
    with pytest.raises(ConfigError, match="cannot name an output file"):
        PreprocessConfig(inputs=("a",), output_prefix="x", json_keys=("a/b",), tokenizer=BYTES)
    with pytest.raises(ConfigError, match="out of range"):
        PreprocessConfig(inputs=("a",), output_prefix="x", num_shards=2, shard_index=2, tokenizer=BYTES)
    with pytest.raises(ConfigError, match="workers is 0, expected at least 1") as info:
        PreprocessConfig(inputs=("a",), output_prefix="x", workers=0, tokenizer=BYTES)
    assert "usable CPU" in info.value.hint
    with pytest.raises(ConfigError, match="chunk_bytes is 0") as info:
        PreprocessConfig(inputs=("a",), output_prefix="x", chunk_bytes=0, tokenizer=BYTES)
    assert info.value.hint


def test_the_tokenizer_is_required():
    with pytest.raises(ConfigError, match="expected a TokenizerSpec") as info:
        PreprocessConfig(inputs=("a",), output_prefix="x")
    assert "kind='byte'" in info.value.hint
    with pytest.raises(TypeError, match="kind"):
        TokenizerSpec()  # the kind is a required argument, as Megatron's --tokenizer-type


def test_output_folder_must_exist_and_stale_temporaries_are_removed(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", ["x"])
    with pytest.raises(ConfigError, match=r"output folder .* does not exist"):
        run([path], tmp_path / "missing" / "out")
    stale = tmp_path / ".out_text_document.bin.tmp-999999-abcd"
    stale.write_bytes(b"left by a killed run")
    unrelated = tmp_path / ".other_text_document.bin.tmp-999999-abcd"
    unrelated.write_bytes(b"not ours")
    run([path], tmp_path / "out")
    assert not stale.exists() and unrelated.exists()


def test_progress_bar_reports_rates(tmp_path, capsys):
    path = write_jsonl(tmp_path / "a.jsonl", ["some text"] * 50)
    preprocess(
        PreprocessConfig(inputs=(path,), output_prefix=str(tmp_path / "o"), tokenizer=BYTES),
        progress=True,
    )
    err = capsys.readouterr().err
    assert "preprocess" in err and "docs/s" in err and "M tok/s" in err


def test_a_second_run_writing_the_same_output_is_refused_while_the_first_runs(tmp_path, docs):
    """Two preprocess runs on one output prefix: the second adopted the first's live work folder
    as a resume, and one failed with a misleading write error (a red-team finding). The work
    folder is locked by the run using it: the second is a ConfigError before it touches
    anything, and once the first has ended (or failed) the prefix is free again, no lock file
    left beside the output."""
    from tokenload.preprocess.workdir import WorkDir

    files = [write_jsonl(tmp_path / f"in{i}.jsonl", docs[i * 50 : (i + 1) * 50]) for i in range(2)]
    held = WorkDir(str(tmp_path / "out"), {"a": "job"})  # a first run, in the middle of its work
    held.open(resume=True)
    with pytest.raises(ConfigError, match="another tokenload preprocess is writing this output"):
        run(files, tmp_path / "out")
    assert (tmp_path / "out.tokenload-work" / "job.json").exists()  # the first run's, untouched
    held.remove()  # the first run ends
    result = run(files, tmp_path / "out")
    assert result.files == 2 and not list(tmp_path.glob(".*lock"))
    Path(files[1]).write_text("oops\n")
    with pytest.raises(RecordError):
        run(files, tmp_path / "again")
    Path(files[1]).write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[50:100]))
    assert run(files, tmp_path / "again").files == 2  # the failed run held nothing


@pytest.mark.parametrize("code", ["ENOSYS", "ENOLCK"])
def test_a_filesystem_without_locks_runs_without_the_lock(tmp_path, docs, monkeypatch, code):
    """Where flock fails for want of locks (Lustre without -o flock, NFSv3 without lockd), only
    "already locked" means another run: the run goes on unlocked and leaves no lock file (it was
    refused as "in use": a regression red-team finding)."""
    import errno
    import fcntl

    import tokenload.preprocess.workdir as workdir

    real = fcntl.flock

    def no_locks(fd, operation):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(workdir.fcntl, "flock", no_locks)
    files = [write_jsonl(tmp_path / "in0.jsonl", docs[:50])]
    result = run(files, tmp_path / "out")
    assert result.files == 1 and not list(tmp_path.glob(".*lock"))
    monkeypatch.setattr(workdir.fcntl, "flock", real)
