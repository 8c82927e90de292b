"""The local executor writes each token once, straight into the outputs (issue 27 goal 3): the
same bytes as the parts path (Ray's: one part per file, concatenated) for every kind of job, no
second copy, only indexes and markers per file in the work folder, and a resume after a kill at
any step, after a changed input, from a Ray work folder or after a full disk gives the bytes of
an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from preprocess_texts import make_texts
from tokenload.errors import RecordError, StorageError
from tokenload.format import TokenFile, TokenFileWriter
from tokenload.preprocess import (
    PreprocessConfig,
    TokenizerSpec,
    load_tokenizer,
    outputs,
    pipeline,
    preprocess,
)
from tokenload.preprocess.inputs import expand_inputs, shard_files
from tokenload.preprocess.parts import PartTask, encode_part
from tokenload.preprocess.pool import encode_task
from tokenload.preprocess.summaries import FileSummary, Totals
from tokenload.preprocess.workdir import open_workdir

BYTES = TokenizerSpec(kind="byte")
EXTS = (".bin", ".idx", ".json")


def write_jsonl(path: Path, records) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
    return str(path)


def config(inputs, out, **kw) -> PreprocessConfig:
    kw.setdefault("workers", 2)
    kw.setdefault("tokenizer", BYTES)
    kw.setdefault("chunk_bytes", 1500)
    return PreprocessConfig(inputs=tuple(map(str, inputs)), output_prefix=str(out), **kw)


def run(inputs, out, **kw):
    return preprocess(config(inputs, out, **kw), progress=False)


def same(a: str, b: str, exts=EXTS) -> bool:
    return all(Path(a + e).read_bytes() == Path(b + e).read_bytes() for e in exts)


def via_parts(cfg: PreprocessConfig) -> dict[str, str]:
    """The outputs as the parts path makes them: each file a part of its own (Ray's task body,
    ``encode_part``), then the parts concatenated by ``outputs._write_outputs``."""
    assert cfg.tokenizer is not None
    tok = load_tokenizer(cfg.tokenizer)
    files = shard_files(
        expand_inputs(cfg.inputs, cfg.input_format, cfg.range_bytes),
        cfg.num_shards,
        cfg.shard_index,
    )
    work = open_workdir(cfg.shard_prefix, pipeline._job_description(cfg, tok, files), remote=False)
    work.open(resume=False)
    summaries = []
    for i, file in enumerate(files):
        task = PartTask(
            i, 0, file, (0, -1), work.location, f"{i:06d}", encode_task(cfg, tok), cfg.chunk_bytes
        )
        result = encode_part(task)
        assert isinstance(result.summary, FileSummary), result  # a whole file is one part
        summaries.append(result.summary)
    outputs._write_outputs(cfg, tok, work, summaries, Totals.of(summaries, cfg.json_keys))
    work.remove()
    return cfg.outputs


@pytest.fixture
def corpus(tmp_path):
    """Five files: plain documents with a title, sentences (lists of strings), an empty file,
    one with records to skip, and one more plain."""
    texts = make_texts(200, seed=11)
    return [
        write_jsonl(tmp_path / "a.jsonl", [{"text": t, "title": t[:7]} for t in texts[:60]]),
        write_jsonl(
            tmp_path / "b.jsonl",
            [{"text": [t, "", t[:5]], "title": ["x", t[:3]]} for t in texts[60:100]]
            + [{"text": [], "title": []}],
        ),
        write_jsonl(tmp_path / "c.jsonl", []),
        write_jsonl(
            tmp_path / "d.jsonl",
            [{"text": "kept", "title": "k"}, "{broken", "", {"text": 3, "title": "n"}]
            + [{"text": t, "title": ""} for t in texts[100:140]],
        ),
        write_jsonl(tmp_path / "e.jsonl", [{"text": t, "title": t[-4:]} for t in texts[140:]]),
    ]


def int32_tokenizer(tmp_path: Path) -> TokenizerSpec:
    """A word-level tokenizer of 65,500 ids: its outputs are int32 (Megatron's rule)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(65498)} | {"[UNK]": 65498, "[EOD]": 65499}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "wl.json"))
    return TokenizerSpec(kind="hf", model=str(tmp_path / "wl.json"), eod_token="[EOD]")


@pytest.mark.parametrize("dtype", ["uint16", "int32"])
def test_outputs_equal_the_parts_path_byte_for_byte(tmp_path, corpus, dtype, monkeypatch):
    spec = BYTES if dtype == "uint16" else int32_tokenizer(tmp_path)
    kw = dict(tokenizer=spec, json_keys=("text", "title"), append_eod=True, on_bad_record="skip")
    parts = via_parts(config(corpus, tmp_path / "parts", **kw))
    assert TokenFile(parts["text"]).dtype == np.dtype(dtype)

    def no_second_copy(*args, **kwargs):
        raise AssertionError("a token file was copied: tokens written twice")

    monkeypatch.setattr(TokenFileWriter, "_copy_bin", no_second_copy)
    once = run(corpus, tmp_path / "once", **kw)
    for key in ("text", "title"):
        assert same(once.outputs[key], parts[key]), key
    assert once.skipped == {"blank_line": 1, "malformed_json": 1, "not_text": 1}
    assert TokenFile(once.outputs["text"]).num_documents == once.documents == 60 + 41 + 0 + 41 + 60
    assert not (tmp_path / "once.tokenload-work").exists()


def test_shards_and_any_worker_count_give_the_parts_paths_bytes(tmp_path, corpus):
    for shard in range(2):
        kw = dict(
            json_keys=("text", "title"), on_bad_record="skip", num_shards=2, shard_index=shard
        )
        parts = via_parts(config(corpus, tmp_path / "parts", **kw))
        for workers in (1, 3):
            once = run(corpus, tmp_path / f"once{workers}", workers=workers, **kw)
            assert same(once.outputs["title"], parts["title"]) and same(
                once.outputs["text"], parts["text"]
            )


def test_the_work_folder_holds_indexes_and_markers_never_a_second_copy(
    tmp_path, corpus, monkeypatch
):
    """After each file's commit: the outputs being written (in input order, exactly the files
    committed so far), one .idx per file and key, a marker; no part .bin, no output name."""
    seen = []
    real = outputs.OutputStreams.commit

    def commit(self, index, summary, marks):
        done = real(self, index, summary, marks)
        work = Path(self.work.location)
        names = sorted(p.name for p in work.iterdir())
        sizes = {key: self.work.output(key).stat().st_size for key in self.keys}
        seen.append((index, names, sizes, done))
        assert not list(tmp_path.glob("out_*")), "an output appeared before the end"
        return done

    monkeypatch.setattr(outputs.OutputStreams, "commit", commit)
    result = run(corpus, tmp_path / "out", json_keys=("text", "title"), on_bad_record="skip")
    assert [s[0] for s in seen] == [0, 1, 2, 3, 4]
    total = dict.fromkeys(("text", "title"), 0)
    for index, names, sizes, done in seen:
        expected = {"job.json", "output_text.bin.partial", "output_title.bin.partial"}
        for i in range(index + 1):
            expected |= {f"{i:06d}.done", f"{i:06d}_text.idx", f"{i:06d}_title.idx"}
        assert set(names) == expected
        assert done.offsets == total
        for key in total:
            total[key] += done.tokens[key]
            assert sizes[key] == total[key] * 2  # uint16: exactly the committed files' tokens
    assert result.tokens == total


def test_a_damaged_file_in_skip_mode_is_cut_back_out_of_the_outputs(tmp_path):
    import gzip

    good = write_jsonl(tmp_path / "a.jsonl", [{"text": "one"}, {"text": "two"}])
    payload = gzip.compress(b'{"text": "lost"}\n' * 20000)
    damaged = tmp_path / "b.jsonl.gz"
    damaged.write_bytes(payload[: len(payload) // 2])  # several chunks written, then unreadable
    last = write_jsonl(tmp_path / "c.jsonl", [{"text": "three"}])
    cfg = config([good, damaged, last], tmp_path / "out", on_bad_record="skip", chunk_bytes=4096)
    result = preprocess(cfg, progress=False)
    tf = TokenFile(result.outputs["text"])
    assert [bytes(tf[i].tolist()).decode() for i in range(tf.num_sequences)] == [
        "one",
        "two",
        "three",
    ]
    assert result.skipped == {"unreadable_file": 1}
    assert same(result.outputs["text"], via_parts(cfg)["text"])


def test_a_changed_input_keeps_the_later_files_by_copying_them_out(tmp_path):
    texts = make_texts(200, seed=3)
    files = [
        write_jsonl(tmp_path / f"in{i}.jsonl", [{"text": t} for t in texts[i * 50 : (i + 1) * 50]])
        for i in range(4)
    ]
    Path(files[3]).write_text("{broken\n")
    with pytest.raises(RecordError):
        run(files, tmp_path / "out")
    work = tmp_path / "out.tokenload-work"
    assert sorted(p.name for p in work.glob("*.done")) == [
        "000000.done",
        "000001.done",
        "000002.done",
    ]
    write_jsonl(Path(files[1]), [{"text": "changed"}])  # a finished file in the middle changes
    write_jsonl(Path(files[3]), [{"text": t} for t in texts[150:]])
    result = run(files, tmp_path / "out")
    assert (result.files, result.files_resumed) == (4, 2)  # file 0 in place, file 2 copied out
    clean = run(files, tmp_path / "clean")
    assert same(result.outputs["text"], clean.outputs["text"])
    assert not work.exists()


def test_a_strict_rerun_redoes_a_file_encoded_with_skips_and_keeps_the_rest(tmp_path, monkeypatch):
    texts = make_texts(120, seed=4)
    files = [
        write_jsonl(tmp_path / f"in{i}.jsonl", [{"text": t} for t in texts[i * 40 : (i + 1) * 40]])
        for i in range(3)
    ]
    with open(files[1], "a") as f:
        f.write("{broken\n")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pipeline, "_write_outputs", disk_full)
    with pytest.raises(StorageError):
        run(files, tmp_path / "out", on_bad_record="skip")
    monkeypatch.undo()
    with pytest.raises(RecordError, match=r"in1\.jsonl:41: malformed_json"):
        run(files, tmp_path / "out")  # strict: the file with a skipped record is redone
    Path(files[1]).write_text(Path(files[1]).read_text().replace("{broken\n", ""))
    result = run(files, tmp_path / "out")
    assert result.files_resumed == 2
    assert same(result.outputs["text"], run(files, tmp_path / "clean").outputs["text"])


def test_a_ray_work_folder_is_resumed_by_copying_its_parts_in(tmp_path, corpus):
    kw = dict(json_keys=("text", "title"), on_bad_record="skip", append_eod=True)
    clean = run(corpus, tmp_path / "clean", **kw)
    cfg = config(corpus, tmp_path / "out", **kw)
    tok = load_tokenizer(cfg.tokenizer)
    files = expand_inputs(cfg.inputs, cfg.input_format, cfg.range_bytes)
    work = open_workdir(cfg.shard_prefix, pipeline._job_description(cfg, tok, files), remote=False)
    work.open(resume=False)
    for i in (1, 3, 4):  # as Ray's tasks would have left them
        task = PartTask(
            i, 0, files[i], (0, -1), work.location, f"{i:06d}", encode_task(cfg, tok), 1500
        )
        assert encode_part(task).summary is not None
    work.release()  # the earlier run is gone (killed): its lock with it
    result = preprocess(cfg, progress=False)
    assert result.files_resumed == 3
    for key in ("text", "title"):
        assert same(result.outputs[key], clean.outputs[key])
    assert not Path(work.location).exists()


def test_a_staged_writer_rolls_back_and_reopens_to_the_same_bytes_as_a_plain_one(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 60000, size=n) for n in (5, 0, 17, 3, 40)]
    with TokenFileWriter(tmp_path / "plain", np.uint16, metadata={"m": 1}) as w:
        for d in docs:
            w.add_document(d)
    staged = tmp_path / "work.partial"
    w = TokenFileWriter(tmp_path / "staged", np.uint16, staged=staged, metadata={"m": 1})
    for d in docs[:2]:
        w.add_document(d)
    mark = w.mark()
    w.add_document(docs[2])
    index = w.index_since(mark)
    w.add_document(rng.integers(0, 60000, size=99))  # then forgotten
    w.rollback(mark)
    assert staged.stat().st_size == 5 * 2 and w.num_tokens == 5
    w.add_document(docs[2])
    assert w.index_since(mark) == index
    w.sync()
    w.abort()  # a staged .bin is kept: its caller knows what of it is finished
    assert staged.stat().st_size == 22 * 2 and not list(tmp_path.glob(".staged*"))
    lengths = np.array([5, 0, 17], np.int32)
    w = TokenFileWriter(
        tmp_path / "staged",
        np.uint16,
        staged=staged,
        kept=(lengths, np.arange(4)),
        metadata={"m": 1},
    )
    assert w.num_tokens == 22
    for d in docs[3:]:
        w.add_document(d)
    w.finalize()
    assert same(str(tmp_path / "staged"), str(tmp_path / "plain"))
    assert not staged.exists()
    with pytest.raises(Exception, match="expected at least"):
        TokenFileWriter(tmp_path / "x", np.uint16, staged=staged, kept=(lengths, np.arange(4)))


# -- kills -----------------------------------------------------------------------------------------
#: Runs preprocess with one step hooked to exit the process (os._exit: no cleanup, as SIGKILL)
#: on its N-th call. argv: point, N, config as JSON.
KILL = r"""
import json, os, sys
from tokenload.preprocess import PreprocessConfig, TokenizerSpec, preprocess
from tokenload.preprocess import outputs, pool, workdir
from tokenload.format import writer

point, n, cfg = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
calls = [0]

def after(owner, name):
    real = getattr(owner, name)
    def hooked(*args, **kwargs):
        out = real(*args, **kwargs)
        calls[0] += 1
        if calls[0] == n:
            os._exit(137)
        return out
    setattr(owner, name, hooked)

if point == "tokens":
    after(pool, "write_documents")
elif point == "fsync":
    after(writer.TokenFileWriter, "sync")
elif point == "index":
    after(workdir.WorkDir, "write")
elif point == "marker":
    after(workdir.WorkFolder, "commit")
elif point == "moved":  # the output moved beside its final name, before its publish
    real = writer.TokenFileWriter._publish
    def publish(self, temps):
        os._exit(137)
    writer.TokenFileWriter._publish = publish
elif point == "published":
    after(writer.TokenFileWriter, "finalize")
cfg["tokenizer"] = TokenizerSpec(**cfg["tokenizer"])
cfg["inputs"] = tuple(cfg["inputs"])
cfg["json_keys"] = tuple(cfg["json_keys"])
preprocess(PreprocessConfig(**cfg), progress=False)
sys.exit(0)
"""


@pytest.fixture(scope="module")
def kill_corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kill")
    texts = make_texts(300, seed=21)
    files = [
        write_jsonl(
            folder / f"in{i}.jsonl",
            [{"text": t, "title": [t[:4], t[4:9]]} for t in texts[i * 50 : (i + 1) * 50]],
        )
        for i in range(6)
    ]
    common = dict(json_keys=("text", "title"), append_eod=True, workers=1)
    clean = run(files, folder / "clean", **common)
    return files, common, clean


@pytest.mark.parametrize(
    "point, n, resumed",
    [
        ("tokens", 1, 0),
        ("tokens", 25, None),  # some files committed, the next one half written
        ("fsync", 2, 0),  # file 0's outputs durable, its indexes not yet written
        ("index", 5, 2),  # file 2's first index written, not the second
        ("index", 6, 2),  # both indexes of file 2, not its marker
        ("marker", 3, 3),
        ("marker", 6, 6),  # every file committed, nothing published
        ("moved", 1, 0),  # an output moved beside its name: the work folder lost it
        ("published", 1, 0),  # one key's output published, not the other's
    ],
)
def test_a_kill_at_any_step_resumes_to_the_bytes_of_an_uninterrupted_run(
    tmp_path, kill_corpus, point, n, resumed
):
    files, common, clean = kill_corpus
    cfg = dict(
        inputs=files,
        output_prefix=str(tmp_path / "out"),
        tokenizer={"kind": "byte"},
        chunk_bytes=1500,
        **common,
    )
    killed = subprocess.run(
        [sys.executable, "-c", KILL, point, str(n), json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == 137, killed.stderr
    work = tmp_path / "out.tokenload-work"
    assert work.exists()
    if point != "published":
        assert not list(tmp_path.glob("out_*.idx")), "an output looks valid before the end"
    result = run(files, tmp_path / "out", **common)
    for key in ("text", "title"):
        assert same(result.outputs[key], clean.outputs[key]), key
    assert not work.exists()
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]
    if resumed is None:
        assert 1 <= result.files_resumed < len(files)
    else:
        assert result.files_resumed == resumed


# -- a full disk -------------------------------------------------------------------------------
@pytest.fixture
def small_tmpfs():
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")  # the tests' own setup
    point = tempfile.mkdtemp(prefix="write-once-", dir="/tmp")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", point], check=True)
    try:
        yield Path(point)
    finally:
        subprocess.run(["umount", point], check=True)
        os.rmdir(point)


def test_a_full_disk_keeps_the_committed_files_and_a_rerun_with_room_resumes(tmp_path, small_tmpfs):
    texts = [f"document {i} " * 40 for i in range(400)]
    files = [
        write_jsonl(
            tmp_path / f"in{i}.jsonl", [{"text": t} for t in texts[i * 100 : (i + 1) * 100]]
        )
        for i in range(4)
    ]
    assert (
        sum(os.path.getsize(f) for f in files) * 2 > 256 << 10 > os.path.getsize(files[0]) * 2 * 1.2
    )
    with pytest.raises(StorageError, match="No space left on device") as info:
        run(files, small_tmpfs / "out", workers=1)
    assert "free space" in info.value.hint
    work = small_tmpfs / "out.tokenload-work"
    done = len(list(work.glob("*.done")))
    assert 1 <= done < 4 and not list(small_tmpfs.glob("out_*"))
    assert not [p.name for p in small_tmpfs.rglob("*") if ".tmp-" in p.name]
    subprocess.run(["mount", "-o", "remount,size=16m", "tmpfs", str(small_tmpfs)], check=True)
    result = run(files, small_tmpfs / "out", workers=1)
    assert result.files_resumed == done
    assert same(result.outputs["text"], run(files, tmp_path / "clean").outputs["text"])
    assert not work.exists()
