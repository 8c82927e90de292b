"""Chunk parsing: Megatron's one-line-one-document rule, blank lines, sentence lists, and every
bad-record class with its file:line message (error mode) or its count (skip mode)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tokenload.errors import RecordError
from tokenload.preprocess.records import parse_chunk
from tokenload.preprocess.sources import Chunk


def jsonl(payload: bytes, first: int = 1) -> Chunk:
    return Chunk("in.jsonl", "jsonl", first, payload, len(payload))


def test_jsonl_documents_blank_lines_and_sentence_lists():
    payload = (
        b'{"text": "a", "id": 1}\n\n   \n{"text": ""}\n{"text": ["s1", "", "s2"]}\n{"text": "last"}'
    )
    parsed = parse_chunk(jsonl(payload), ("text",), strict=True)
    assert parsed.columns == [["a", "", ["s1", "", "s2"], "last"]]
    assert parsed.documents == 4 and parsed.has_lists
    assert parsed.skipped == {"blank_line": 2}


def test_jsonl_several_keys_stay_aligned():
    payload = b'{"a": "x", "b": "y"}\n{"a": "z"}\n{"b": "w", "a": "v"}\n'
    parsed = parse_chunk(jsonl(payload), ("a", "b"), strict=False)
    assert parsed.columns == [["x", "v"], ["y", "w"]]
    assert parsed.skipped == {"missing_key": 1}


BAD = [
    (b'{"text": "a"', "malformed_json", "not valid JSON"),
    (b'{"text": "caf\xe9"}', "not_utf8", "byte 0xe9 at byte offset 13"),
    (b'["text"]', "not_object", "a JSON array where an object was expected"),
    (b'{"content": "x"}', "missing_key", "no key 'text' (keys present: 'content')"),
    (b'{"text": null}', "not_text", "key 'text' holds a JSON null"),
    (b'{"text": 42}', "not_text", "holds a JSON number"),
    (b'{"text": ["a", 1]}', "not_text", "holds a JSON array"),
    (b'{"text": "\\ud800"}', "malformed_json", "surrogate"),
]


@pytest.mark.parametrize("line,reason,detail", BAD)
def test_each_bad_record_class_stops_with_file_line_and_reason(line, reason, detail):
    payload = b'{"text": "ok"}\n' + line + b'\n{"text": "after"}\n'
    with pytest.raises(RecordError) as info:
        parse_chunk(jsonl(payload, first=41), ("text",), strict=True)
    text = str(info.value)
    assert text.startswith(f"in.jsonl:42: {reason}: ")
    assert detail in text
    assert "`on_bad_record='skip'`" in text


@pytest.mark.parametrize("line,reason,detail", BAD)
def test_each_bad_record_class_is_counted_in_skip_mode(line, reason, detail):
    payload = b'{"text": "ok"}\n' + line + b'\n{"text": "after"}\n'
    parsed = parse_chunk(jsonl(payload, first=41), ("text",), strict=False)
    assert parsed.columns == [["ok", "after"]]
    assert parsed.skipped == {reason: 1}
    assert str(parsed.examples[0]).startswith(f"in.jsonl:42: {reason}: ")


def test_lines_format_strips_line_ends_and_skips_empty_lines():
    payload = b"first\r\nsecond\n\n  \nlast"
    parsed = parse_chunk(Chunk("t.txt", "lines", 1, payload, len(payload)), ("text",), strict=True)
    assert parsed.columns == [["first", "second", "  ", "last"]]
    assert parsed.skipped == {"blank_line": 1}


def test_lines_format_reports_the_non_utf8_line():
    payload = b"good\nbad \xff\ngood again\n"
    with pytest.raises(RecordError, match=r"t.txt:11: not_utf8"):
        parse_chunk(Chunk("t.txt", "lines", 10, payload, len(payload)), ("text",), strict=True)
    parsed = parse_chunk(
        Chunk("t.txt", "lines", 10, payload, len(payload)), ("text",), strict=False
    )
    assert parsed.columns == [["good", "good again"]] and parsed.skipped == {"not_utf8": 1}


def test_text_format_is_one_document_even_when_empty():
    parsed = parse_chunk(Chunk("d.txt", "text", 1, b"a\nb\n", 4), ("body",), strict=True)
    assert parsed.columns == [["a\nb\n"]]
    empty = parse_chunk(Chunk("e.txt", "text", 1, b"", 0), ("body",), strict=True)
    assert empty.columns == [[""]] and empty.documents == 1
    with pytest.raises(RecordError, match=r"d.txt:3: not_utf8"):
        parse_chunk(Chunk("d.txt", "text", 1, b"a\nb\n\xc3(", 6), ("body",), strict=True)


def test_parquet_rows_nulls_binary_and_missing_columns():
    batch = pa.record_batch(
        {
            "text": pa.array(["a", None, "c", "d"]),
            "raw": pa.array([b"x", b"y", b"\xff", b"w"], type=pa.binary()),
        }
    )
    chunk = Chunk("p.parquet", "parquet", 101, batch, 0)
    parsed = parse_chunk(chunk, ("text", "raw"), strict=False)
    assert parsed.columns == [["a", "d"], ["x", "w"]]
    assert parsed.skipped == {"not_text": 1, "not_utf8": 1}
    with pytest.raises(RecordError, match=r"p.parquet:102: not_text"):
        parse_chunk(chunk, ("text",), strict=True)
    missing = Chunk("p.parquet", "parquet", 1, {"rows": 3, "names": ["body"]}, 0)
    with pytest.raises(RecordError, match=r"p.parquet:1: missing_key: no column 'text'"):
        parse_chunk(missing, ("text",), strict=True)
    assert parse_chunk(missing, ("text",), strict=False).skipped == {"missing_key": 3}
