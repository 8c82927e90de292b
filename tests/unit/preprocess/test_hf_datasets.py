"""Hugging Face datasets as preprocess input: save_to_disk folders, Hub snapshots on disk, and
``datasets.Dataset``/``IterableDataset`` objects, each compared byte for byte with the same texts
written as JSONL. Every dataset is built here with the ``datasets`` package (no download)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from preprocess_texts import make_texts
from tokenload.errors import ConfigError, RecordError
from tokenload.preprocess import PreprocessConfig, TokenizerSpec, hf, preprocess
from tokenload.preprocess.hf import split_of
from tokenload.preprocess.inputs import expand_inputs

datasets.disable_progress_bars()
BYTE = TokenizerSpec(kind="byte")


def run(inputs, out, **kw):
    kw.setdefault("tokenizer", BYTE)
    kw.setdefault("append_eod", True)
    kw.setdefault("workers", 2)
    return preprocess(PreprocessConfig(inputs=inputs, output_prefix=str(out), **kw), progress=False)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return str(path)


def same(a: str, b: str, keys=("text",)) -> bool:
    """Token files byte-identical, sidecars equal but for the input names they record."""
    return all(
        Path(f"{a}_{k}_document{e}").read_bytes() == Path(f"{b}_{k}_document{e}").read_bytes()
        and sidecar(f"{a}_{k}_document") == sidecar(f"{b}_{k}_document")
        for k in keys
        for e in (".bin", ".idx")
    )


def sidecar(prefix: str) -> dict:
    data = json.loads(Path(prefix + ".json").read_text())
    data["metadata"].pop("inputs")
    return data


@pytest.fixture(scope="module")
def rows():
    texts = make_texts(300, seed=5)
    texts[3], texts[10] = "", "x" * 20000  # an empty document and one longer than a chunk
    return [{"text": t, "title": f"t{i} é", "n": i} for i, t in enumerate(texts)]


@pytest.fixture
def reference(tmp_path, rows):
    """The same rows as JSONL, preprocessed: what every HF input must equal."""
    src = write_jsonl(tmp_path / "rows.jsonl", rows)
    run(src, tmp_path / "ref", json_keys=("text", "title"))
    return str(tmp_path / "ref")


def test_save_to_disk_folder_equals_jsonl(tmp_path, rows, reference):
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"), num_shards=3)
    files = expand_inputs([str(tmp_path / "saved")])
    assert [Path(f.path).name for f in files] == [f"data-0000{i}-of-00003.arrow" for i in range(3)]
    assert {f.format for f in files} == {"arrow"}
    result = run(str(tmp_path / "saved"), tmp_path / "out", json_keys=("text", "title"),
                 chunk_bytes=4096)
    assert result.documents == len(rows)
    assert same(reference, str(tmp_path / "out"), ("text", "title"))


def test_json_keys_pick_the_column(tmp_path, rows):
    ref = write_jsonl(tmp_path / "titles.jsonl", [{"title": r["title"]} for r in rows])
    run(ref, tmp_path / "ref", json_keys=("title",))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    run(str(tmp_path / "saved"), tmp_path / "out", json_keys=("title",))
    assert same(str(tmp_path / "ref"), str(tmp_path / "out"), ("title",))
    assert not Path(f"{tmp_path / 'out'}_text_document.bin").exists()


def test_dataset_objects_equal_jsonl_in_their_row_order(tmp_path, rows, reference):
    ds = datasets.Dataset.from_list(rows)
    # pieces of ~8 KiB: many resumable parts, and the output does not depend on the cuts
    result = run(ds, tmp_path / "obj", json_keys=("text", "title"), range_bytes=8192,
                 chunk_bytes=2048)
    assert result.files > 5
    assert same(reference, str(tmp_path / "obj"), ("text", "title"))

    shuffled = ds.shuffle(seed=3)  # an indices mapping over the same table
    order = [rows[i] for i in shuffled["n"]]
    run(write_jsonl(tmp_path / "shuffled.jsonl", order), tmp_path / "ref2")
    run(shuffled, tmp_path / "obj2")
    assert same(str(tmp_path / "ref2"), str(tmp_path / "obj2"))


def test_iterable_datasets_equal_jsonl_shard_by_shard(tmp_path, rows, reference):
    sharded = datasets.Dataset.from_list(rows).to_iterable_dataset(num_shards=4)
    result = run(sharded, tmp_path / "it", json_keys=("text", "title"), chunk_bytes=2048)
    assert result.files == 4
    assert same(reference, str(tmp_path / "it"), ("text", "title"))

    def gen():
        yield from rows

    generated = datasets.IterableDataset.from_generator(gen)
    run(generated, tmp_path / "gen", json_keys=("text", "title"))
    assert same(reference, str(tmp_path / "gen"), ("text", "title"))


def test_an_interrupted_object_run_resumes_its_finished_pieces(tmp_path, rows, monkeypatch):
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    clean = run(datasets.load_from_disk(str(tmp_path / "saved")), tmp_path / "clean",
                range_bytes=8192, chunk_bytes=2048)
    original = hf.RowRange.tables

    def interrupted(self, *args):
        if self.start >= len(rows) // 2:
            raise KeyboardInterrupt  # as a kill would stop the run, halfway through the pieces
        return original(self, *args)

    monkeypatch.setattr(hf.RowRange, "tables", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(datasets.load_from_disk(str(tmp_path / "saved")), tmp_path / "out",
            range_bytes=8192, chunk_bytes=2048)
    monkeypatch.setattr(hf.RowRange, "tables", original)
    # a new object of the same saved dataset has the same fingerprint, so its pieces match
    resumed = run(datasets.load_from_disk(str(tmp_path / "saved")), tmp_path / "out",
                  range_bytes=8192, chunk_bytes=2048)
    assert 1 <= resumed.files_resumed < resumed.files == clean.files
    assert same(str(tmp_path / "clean"), str(tmp_path / "out"))


def test_hub_snapshot_reads_its_one_split_without_the_card(tmp_path, rows, reference):
    snap = tmp_path / "snap"
    (snap / "data").mkdir(parents=True)
    (snap / "README.md").write_text("---\nconfigs:\n- config_name: default\n---\n# card\n")
    (snap / ".gitattributes").write_text("*.parquet filter=lfs\n")
    table = pa.Table.from_pylist(rows)
    pq.write_table(table.slice(0, 120), snap / "data" / "train-00000-of-00002.parquet",
                   row_group_size=50)
    pq.write_table(table.slice(120), snap / "data" / "train-00001-of-00002.parquet")
    run(str(snap), tmp_path / "out", json_keys=("text", "title"))
    assert same(reference, str(tmp_path / "out"), ("text", "title"))


def test_hub_snapshot_with_several_splits_names_each_splits_glob(tmp_path, rows):
    snap = tmp_path / "snap"
    (snap / "data").mkdir(parents=True)
    (snap / "README.md").write_text("---\nlicense: mit\n---\n")
    table = pa.Table.from_pylist(rows)
    for name, part in (("train-00000-of-00002", table.slice(0, 100)),
                       ("train-00001-of-00002", table.slice(100, 100)),
                       ("test-00000-of-00001", table.slice(200))):
        pq.write_table(part, snap / "data" / f"{name}.parquet")
    with pytest.raises(ConfigError, match="holds the splits train, test") as info:
        expand_inputs([str(snap)])
    train_glob = str(snap / "data" / "train-0000*")
    assert repr(train_glob) in info.value.hint
    files = expand_inputs([train_glob])
    assert [Path(f.path).name for f in files] == ["train-00000-of-00002.parquet",
                                                  "train-00001-of-00002.parquet"]


def test_split_names_follow_the_hub_convention():
    assert split_of("data/train-00000-of-00002.parquet") == "train"
    assert split_of("default/validation/0000.parquet") == "validation"
    assert split_of("en/c4-validation.00001-of-00008.json.gz") == "validation"
    assert split_of("data/dev.jsonl") == "validation"
    assert split_of("eval/part.parquet") == "test"
    assert split_of("corpus/shard_0001.parquet") == "train"
    assert split_of("trainee/x.parquet") == "train"  # no split word: train, not a substring


def test_dataset_dict_folder_asks_for_one_split(tmp_path, rows, reference):
    ds = datasets.Dataset.from_list(rows)
    datasets.DatasetDict(train=ds, test=ds.select(range(5))).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match="DatasetDict with splits train, test") as info:
        run(str(tmp_path / "dd"), tmp_path / "out")
    assert str(tmp_path / "dd" / "train") in info.value.hint
    run(str(tmp_path / "dd" / "train"), tmp_path / "out", json_keys=("text", "title"))
    assert same(reference, str(tmp_path / "out"), ("text", "title"))


def test_missing_column_and_null_text_are_bad_records_with_their_row(tmp_path, rows):
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(RecordError, match="missing_key: no column 'body'") as info:
        run(str(tmp_path / "saved"), tmp_path / "out", json_keys=("body",))
    assert info.value.path.endswith("data-00000-of-00001.arrow:1")
    assert "`json_keys=`" in info.value.hint  # the column is missing from the file, not a record

    with_null = [{"text": "a"}, {"text": None}, {"text": "b"}]
    datasets.Dataset.from_list(with_null).save_to_disk(str(tmp_path / "nulls"))
    with pytest.raises(RecordError, match="not_text") as info:
        run(str(tmp_path / "nulls"), tmp_path / "out")
    assert info.value.path.endswith(".arrow:2")
    skipped = run(str(tmp_path / "nulls"), tmp_path / "out", on_bad_record="skip")
    assert skipped.documents == 2 and skipped.skipped == {"not_text": 1}
    run(write_jsonl(tmp_path / "n.jsonl", with_null), tmp_path / "ref", on_bad_record="skip")
    assert same(str(tmp_path / "ref"), str(tmp_path / "out"))


@pytest.mark.parametrize("iterable", [False, True])
def test_objects_missing_the_column_are_bad_records(tmp_path, rows, iterable):
    ds = datasets.Dataset.from_list(rows)
    ds = ds.to_iterable_dataset(num_shards=2) if iterable else ds
    with pytest.raises(RecordError, match="missing_key: no column 'body'") as info:
        run(ds, tmp_path / "out", json_keys=("body",))
    assert info.value.path.endswith(":1")
    skipped = run(ds, tmp_path / "out", json_keys=("body",), on_bad_record="skip")
    assert skipped.documents == 0 and skipped.skipped == {"missing_key": len(rows)}


def test_truncated_arrow_file_is_a_record_error_and_skippable(tmp_path, rows):
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    arrow = tmp_path / "saved" / "data-00000-of-00001.arrow"
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    with pytest.raises(RecordError, match="cannot read the file to its end"):
        run(str(tmp_path / "saved"), tmp_path / "out")
    assert not Path(f"{tmp_path / 'out'}_text_document.idx").exists()
    skipped = run(str(tmp_path / "saved"), tmp_path / "out", on_bad_record="skip")
    assert skipped.skipped == {"unreadable_file": 1} and skipped.documents == 0


def test_arrow_ipc_file_format_reads_too(tmp_path, rows, reference):
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(tmp_path / "rows.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=70):
            writer.write_batch(batch)
    run(str(tmp_path / "rows.arrow"), tmp_path / "out", json_keys=("text", "title"),
        chunk_bytes=1024)
    assert same(reference, str(tmp_path / "out"), ("text", "title"))


def test_objects_cannot_go_to_ray_tasks(tmp_path, rows):
    with pytest.raises(ConfigError, match="save_to_disk"):
        run(datasets.Dataset.from_list(rows), tmp_path / "out", executor="ray")
