"""Input expansion, sharding, chunking and streaming decompression (truncation is detected)."""

from __future__ import annotations

import gzip
import json

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenload.errors import ConfigError
from tokenload.preprocess.inputs import expand_inputs, shard_files
from tokenload.preprocess.sources import ChunkSize, UnreadableFile, read_chunks


def touch(path, data=b"{}\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def test_expansion_keeps_given_order_and_sorts_globs_and_folders(tmp_path):
    b = touch(tmp_path / "b.jsonl")
    a2 = touch(tmp_path / "g" / "a2.jsonl.gz", gzip.compress(b"{}\n"))
    a1 = touch(tmp_path / "g" / "a1.jsonl")
    touch(tmp_path / "d" / ".hidden.jsonl")
    touch(tmp_path / "d" / "notes.csv")
    d2 = touch(tmp_path / "d" / "z" / "x.parquet")
    d1 = touch(tmp_path / "d" / "y.txt")
    files = expand_inputs([b, str(tmp_path / "g" / "*.jsonl*"), str(tmp_path / "d")])
    assert [f.path for f in files] == [b, a1, a2, d1, d2]
    assert [(f.format, f.compression) for f in files] == [
        ("jsonl", None),
        ("jsonl", None),
        ("jsonl", "gzip"),
        ("text", None),
        ("parquet", None),
    ]
    assert [f.format for f in expand_inputs([d1], "lines")] == ["lines"]


def test_expansion_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        expand_inputs([str(tmp_path / "missing.jsonl")])
    with pytest.raises(ConfigError, match="no file matches"):
        expand_inputs([str(tmp_path / "*.jsonl")])
    touch(tmp_path / "data.csv")
    with pytest.raises(ConfigError, match="`input_format=`"):
        expand_inputs([str(tmp_path / "data.csv")])
    with pytest.raises(ConfigError, match="holds no input files"):
        expand_inputs([str(tmp_path)])


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 12), shards=st.integers(1, 6))
def test_shards_are_contiguous_and_cover_every_file_once(n, shards):
    files = list(range(n))
    parts = [shard_files(files, shards, i) for i in range(shards)]
    assert [x for p in parts for x in p] == files
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def lines_file(tmp_path, n=300, name="x.jsonl"):
    data = b"".join(json.dumps({"text": "w" * (i % 37)}).encode() + b"\n" for i in range(n))
    return data, touch(tmp_path / name, data)


@pytest.mark.parametrize("chunk_bytes", [1024, 1500, 4096, 1 << 20])
def test_line_chunks_cover_the_file_and_count_lines(tmp_path, chunk_bytes):
    data, path = lines_file(tmp_path)
    chunks = list(read_chunks(expand_inputs([path])[0], chunk_bytes, ("text",)))
    assert b"".join(c.payload for c in chunks) == data
    assert all(c.payload.endswith(b"\n") for c in chunks)
    firsts = [c.first for c in chunks]
    assert firsts == [
        1 + data[: sum(len(c.payload) for c in chunks[:i])].count(b"\n") for i in range(len(chunks))
    ]


def test_a_line_longer_than_a_chunk_stays_whole(tmp_path):
    data = b"a" * 5000 + b"\nb\n" + b"c" * 3000
    path = touch(tmp_path / "long.txt", data)
    chunks = list(read_chunks(expand_inputs([path], "lines")[0], 1024, ("text",)))
    assert [c.payload for c in chunks] == [b"a" * 5000 + b"\n", b"b\n", b"c" * 3000]
    assert [c.first for c in chunks] == [1, 2, 3]


def test_chunk_size_follows_the_measured_rate_within_its_bounds():
    size = ChunkSize(4 << 20)
    assert size() == ChunkSize.FIRST  # small until a rate is measured
    size.observe(1 << 20, 10.0)  # a slow encoder: 100 KiB/s
    assert size() == ChunkSize.MINIMUM
    size.observe(1 << 20, 1.0)
    assert size() == int((1 << 20) * ChunkSize.TARGET_SECONDS)
    size.observe(1 << 20, 0.001)  # a fast one: capped
    assert size() == 4 << 20


def test_line_chunks_follow_a_changing_size(tmp_path):
    lines = [b"%05d\n" % i for i in range(3000)]
    path = touch(tmp_path / "many.jsonl", b"".join(lines))
    sizes = iter([64, 1024, 256] + [4096] * 100)
    current = [next(sizes)]

    def size():
        return current[0]

    chunks = []
    for chunk in read_chunks(expand_inputs([path], "lines")[0], size, ("text",)):
        chunks.append(chunk)
        current[0] = next(sizes)
    assert b"".join(c.payload for c in chunks) == b"".join(lines)
    assert [len(c.payload) for c in chunks[:3]] == [60, 1020, 252]
    assert [c.first for c in chunks[:3]] == [1, 11, 181]


def test_multi_member_gzip_and_multi_frame_zstd(tmp_path):
    data, _ = lines_file(tmp_path)
    half = len(data) // 2
    gz = touch(tmp_path / "m.jsonl.gz", gzip.compress(data[:half]) + gzip.compress(data[half:]))
    cctx = zstandard.ZstdCompressor()
    zst = touch(tmp_path / "m.jsonl.zst", cctx.compress(data[:half]) + cctx.compress(data[half:]))
    for path in (gz, zst):
        chunks = list(read_chunks(expand_inputs([path])[0], 2048, ("text",)))
        assert b"".join(c.payload for c in chunks) == data


@pytest.mark.parametrize("ext", [".gz", ".zst"])
def test_truncated_or_corrupt_compressed_files_are_unreadable(tmp_path, ext):
    data, _ = lines_file(tmp_path, n=3000)
    packed = gzip.compress(data) if ext == ".gz" else zstandard.ZstdCompressor().compress(data)
    cut = touch(tmp_path / f"cut.jsonl{ext}", packed[: len(packed) * 2 // 3])
    with pytest.raises(UnreadableFile, match="truncated"):
        list(read_chunks(expand_inputs([cut])[0], 4096, ("text",)))
    junk = touch(tmp_path / f"junk.jsonl{ext}", b"this is not compressed at all")
    with pytest.raises(UnreadableFile):
        list(read_chunks(expand_inputs([junk])[0], 4096, ("text",)))


def test_fsspec_urls_are_expanded_and_streamed():
    fs = fsspec.filesystem("memory")
    fs.pipe({"/tl-src/b.jsonl": b'{"text": "b"}\n', "/tl-src/a.jsonl": b'{"text": "a"}\n'})
    try:
        files = expand_inputs(["memory://tl-src/*.jsonl"])
        assert [f.path for f in files] == ["memory:///tl-src/a.jsonl", "memory:///tl-src/b.jsonl"]
        assert [c.payload for c in read_chunks(files[0], 1024, ("text",))] == [b'{"text": "a"}\n']
    finally:
        fs.rm("/tl-src", recursive=True)


def test_parquet_batches_carry_row_numbers_and_missing_columns(tmp_path):
    table = pa.table({"text": [f"row {i}" for i in range(1000)], "other": list(range(1000))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=300)
    file = expand_inputs([str(tmp_path / "t.parquet")])[0]
    chunks = list(read_chunks(file, 2048, ("text",)))
    assert len(chunks) > 1
    rows = [r for c in chunks for r in c.payload.column("text").to_pylist()]
    assert rows == table.column("text").to_pylist()
    assert [c.first for c in chunks] == [
        1 + sum(c.payload.num_rows for c in chunks[:i]) for i in range(len(chunks))
    ]
    missing = list(read_chunks(file, 2048, ("body",)))
    assert sum(c.payload["rows"] for c in missing) == 1000
    corrupt = touch(tmp_path / "bad.parquet", b"PAR1 this is not parquet")
    with pytest.raises(UnreadableFile):
        list(read_chunks(expand_inputs([corrupt])[0], 2048, ("text",)))


def test_folders_and_globs_skip_token_files_sidecars_and_work_folders(tmp_path):
    data = touch(tmp_path / "data.jsonl")
    touch(tmp_path / "out_text_document.bin", b"\0\0")
    touch(tmp_path / "out_text_document.idx", b"\0")
    touch(tmp_path / "out_text_document.json", b"{}")
    touch(tmp_path / "out.tokenload-work" / "000000_text.json")
    listed = [str(tmp_path)], [str(tmp_path / "*")], [str(tmp_path / "**" / "*.json*")]
    for patterns in listed:
        assert [f.path for f in expand_inputs(patterns)] == [data], patterns


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=60),
    last_newline=st.booleans(),
    range_bytes=st.integers(1, 200),
)
def test_byte_ranges_hold_every_line_once_in_order(tmp_path_factory, lines, last_newline, range_bytes):
    """Each line goes to the range its first byte lies in, so the ranges' chunks, joined, are the
    file, whatever the cut (empty lines, a line longer than a range, no final newline)."""
    from tokenload.preprocess.sources import byte_ranges, read_range_chunks

    data = b"\n".join(lines) + (b"\n" if last_newline and lines else b"")
    path = touch(tmp_path_factory.mktemp("ranges") / "r.jsonl", data)
    file = expand_inputs([path])[0]
    spans = byte_ranges(file, range_bytes)
    assert spans == [(0, -1)] or (spans[0][0] == 0 and spans[-1][1] == len(data))
    pieces = [c.payload for s in spans for c in read_range_chunks(file, *s, 1024, ("text",))]
    assert b"".join(pieces) == data
    assert all(p.endswith(b"\n") for p in pieces[:-1])


def test_compressed_and_parquet_files_are_one_range(tmp_path):
    from tokenload.preprocess.sources import byte_ranges

    gz = expand_inputs([touch(tmp_path / "a.jsonl.gz", gzip.compress(b"{}\n" * 5000))])[0]
    assert byte_ranges(gz, 1024) == [(0, -1)]
    big = expand_inputs([touch(tmp_path / "b.jsonl", b"{}\n" * 5000)])[0]
    assert byte_ranges(big, 4096) == [(0, 4096), (4096, 8192), (8192, 12288), (12288, 15000)]
