"""The encoding path's shortcuts give exactly what the general path gives: JSONL lines read as
views of the chunk (records, counts, bad-record examples and strict-mode errors), and gigatoken's
rows written straight into the output dtype with their EOD slots (``encode_documents``) against
``encode_batch`` + ``layout_documents``, on adversarial JSONL and for every gigatoken kind."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tokenizers import EXTRA, GIGATOKEN_KINDS, spec_for

from tokenload.errors import ConfigError, RecordError
from tokenload.preprocess import fast, load_tokenizer, records, sources
from tokenload.preprocess.encode import EncodeTask, encode_chunk, layout_documents
from tokenload.preprocess.fast import GigatokenTokenizer
from tokenload.preprocess.records import parse_chunk
from tokenload.preprocess.sources import Chunk

LONG = "long line " * 30_000  # 300 KB of text in one record

#: One JSONL line each: what a corpus may hold, good and bad.
ADVERSARIAL = [
    b'{"text": "plain ascii"}',
    b'{"text": "escapes \\n\\t\\r\\b\\f\\/ \\\\ \\" done"}',
    b'{"text": "\\u00e9\\u00E9 \\u65e5\\u672c \\ud83d\\ude00 surrogate pair"}',
    b'{"text": "lone high \\ud800 here"}',
    b'{"text": "lone low \\udc00 here"}',
    b'{"text": "reversed \\ude00\\ud83d pair"}',
    b'{"text": "nul \\u0000 inside"}',
    b'{"text": "raw\tcontrol"}',
    b'{"text": "bad escape \\x41"}',
    b'{"text": ""}',
    b'{"text": " "}',
    b'{"id": 7, "text": "after another key", "meta": {"text": "nested"}}',
    b'{"meta": {"text": "only nested"}}',
    b'{"text": "first", "text": "second wins"}',
    b'{"te\\u0078t": "escaped key"}',
    b'{"text": "crlf line"}\r',
    b"",
    b"   ",
    b"\r",
    b'\xef\xbb\xbf{"text": "byte order mark"}',
    b'{"text": "invalid utf-8 \xff\xfe"}',
    b'{"text": "overlong \xc0\xaf"}',
    b'{"text": "utf-8 surrogate \xed\xa0\x80"}',
    b'{"text": "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82 raw utf-8"}',
    b'{"text": "trailing garbage"} x',
    b'{"text": "two"}{"text": "objects"}',
    b'{"text": "unterminated',
    b'{"text": "no close"',
    b'{"text": 5}',
    b'{"text": null}',
    b'{"text": ["sentence one", "sentence two"]}',
    b'{"text": "other value bad", "x": NaN}',
    b'{"text": "big int", "n": 123456789012345678901234567890}',
    b'["text", "an array"]',
    b'"text"',
    b"not json at all",
    json.dumps({"text": LONG}).encode(),
    json.dumps({"text": "\u2028\u2029\u0085 separators \x7f"}).encode(),
    json.dumps({"text": "<|endoftext|> <s> </s> <unk> special-looking"}).encode(),
]
#: The lines a plain-text corpus holds: no sentence lists (those take the general path).
PLAIN = [line for line in ADVERSARIAL if b"sentence one" not in line]


def jsonl(payload: bytes, first: int = 1) -> Chunk:
    return Chunk("in.jsonl", "jsonl", first, payload, len(payload))


def parsed_both_ways(payload, keys, strict, monkeypatch):
    out = []
    for view_bytes in (0, 10**15):  # always views / never views
        monkeypatch.setattr(records, "VIEW_LINE_BYTES", view_bytes)
        try:
            p = parse_chunk(jsonl(payload, first=11), keys, strict)
            out.append((p.columns, p.documents, p.has_lists, dict(p.skipped), p.examples))
        except RecordError as exc:
            out.append(("error", str(exc), exc.record))  # type: ignore[attr-defined]
    return out


PAYLOADS = [
    b"\n".join(ADVERSARIAL) + b"\n",
    b"\n".join(ADVERSARIAL),  # the last line has no newline
    b"\r\n".join(ADVERSARIAL) + b"\r\n",
    b"\n".join(reversed(ADVERSARIAL)) + b"\n\n\n",
    b"",
    b"\n",
    b'{"text": "one"}',
]


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("keys", [("text",), ("text", "id"), ("id",)])
def test_line_views_give_the_same_records_counts_and_examples(payload, keys, monkeypatch):
    views, copies = parsed_both_ways(payload, keys, False, monkeypatch)
    assert views == copies
    if payload == PAYLOADS[0] and keys == ("text",):  # the corpus exercises every class
        assert set(views[3]) == {
            "blank_line",
            "malformed_json",
            "not_utf8",
            "missing_key",
            "not_text",
            "not_object",
        }


@pytest.mark.parametrize("line", ADVERSARIAL)
def test_line_views_give_the_same_strict_mode_error(line, monkeypatch):
    payload = b'{"text": "ok"}\n' + line + b'\n{"text": "after"}\n'
    views, copies = parsed_both_ways(payload, ("text",), True, monkeypatch)
    assert views == copies


def test_line_views_follow_the_split_rule():
    for payload in [*PAYLOADS, b"a\n\nb", b"\n\n", b"x"]:
        expected = payload.split(b"\n")
        if payload.endswith(b"\n"):
            expected.pop()
        assert [bytes(v) for v in records._line_views(payload)] == expected


def general(tok, texts, eod, dtype):
    ids, lengths = tok.encode_batch(list(texts))
    return layout_documents(ids, lengths, None, len(texts), eod, np.dtype(dtype))


def assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y)


def plain_texts(texts):
    parsed = parse_chunk(jsonl(b"\n".join(PLAIN)), ("text",), strict=False)
    return [*parsed.columns[0], *texts[:120], *EXTRA, " ".join(texts[:50]), ""]


GROUPINGS = [(1 << 20, 128, 1 << 26), (50, 0, 1 << 26), (300, 10**9, 1 << 26), (50, 128, 60)]


@pytest.mark.parametrize("name", GIGATOKEN_KINDS)
@pytest.mark.parametrize("group_chars, row_copy_width, one_text_chars", GROUPINGS)
def test_documents_written_in_place_equal_the_general_layout(
    name, group_chars, row_copy_width, one_text_chars, tokenizer_files, texts, monkeypatch
):
    monkeypatch.setattr(fast, "GROUP_CHARS", group_chars)
    monkeypatch.setattr(fast, "ROW_COPY_WIDTH", row_copy_width)
    monkeypatch.setattr(fast, "ONE_TEXT_CHARS", one_text_chars)
    tok = load_tokenizer(spec_for(name, tokenizer_files))
    assert isinstance(tok, GigatokenTokenizer)
    sample = plain_texts(texts)
    for eod in (None, tok.eod_id):
        for dtype in (tok.dtype, np.uint32, np.int32, np.int64):
            fused = tok.encode_documents(list(sample), eod, np.dtype(dtype))
            if name == "bytelevel_bos" or (name == "sp_bpe" and any("<s>" in t for t in sample)):
                assert fused is None  # affixes / texts for the native encoder: general path
                continue
            assert fused is not None
            assert_same(fused, general(tok, sample, eod, dtype))


@pytest.mark.parametrize("name", ["bytelevel", "sp_bpe"])
def test_documents_in_place_without_the_special_texts(name, tokenizer_files, texts):
    tok = load_tokenizer(spec_for(name, tokenizer_files))
    sample = [t for t in plain_texts(texts) if "<s>" not in t and "\x85" not in t]
    for eod in (None, tok.eod_id):
        consumed = list(sample)
        fused = tok.encode_documents(consumed, eod, tok.dtype)
        assert fused is not None and consumed == []  # the strings are let go
        assert_same(fused, general(tok, sample, eod, tok.dtype))
        tokens, seq_lengths, per_doc = fused
        assert per_doc.sum() == seq_lengths.size < len(sample)  # empty documents kept, no EOD
        assert int(seq_lengths.sum()) == tokens.size


@pytest.mark.parametrize("name", GIGATOKEN_KINDS)
def test_ids_stay_below_gigatokens_vocabulary_size(name, tokenizer_files, texts):
    """What lets the in-place path skip scanning the ids when the dtype holds the vocabulary."""
    tok = load_tokenizer(spec_for(name, tokenizer_files))
    flat, _ = tok.encode_batch(plain_texts(texts))
    assert 0 < int(flat.max()) < tok.giga.vocab_size <= np.iinfo(tok.dtype).max + 1


def test_an_id_beyond_the_dtype_raises_the_general_error(tokenizer_files, texts):
    tok = load_tokenizer(spec_for("bytelevel", tokenizer_files))
    sample = texts[:40]
    with pytest.raises(ConfigError) as general_error:
        general(tok, sample, tok.eod_id, np.uint8)
    with pytest.raises(ConfigError) as fused_error:
        tok.encode_documents(list(sample), tok.eod_id, np.dtype(np.uint8))
    assert str(fused_error.value) == str(general_error.value)
    assert "does not fit the output dtype uint8" in str(fused_error.value)


def test_an_eod_beyond_the_dtype_leaves_the_texts_to_the_general_path(tokenizer_files, texts):
    tok = load_tokenizer(spec_for("bytelevel", tokenizer_files))
    sample = texts[:5]
    kept = list(sample)
    assert tok.encode_documents(kept, 70_000, np.dtype(np.uint16)) is None
    assert kept == sample
    with pytest.raises(OverflowError):
        general(tok, sample, 70_000, np.uint16)


def encoded(task, chunk):
    e = encode_chunk(task, chunk)
    return e.outputs, e.documents, e.input_bytes, e.skipped, e.examples


@pytest.mark.parametrize("name", ["bytelevel", "bytelevel_bos", "sp_bpe", "tiktoken"])
@pytest.mark.parametrize("append_eod", [True, False])
def test_encode_chunk_equals_the_general_path_on_adversarial_jsonl(
    name, append_eod, tokenizer_files, monkeypatch
):
    spec = spec_for(name, tokenizer_files)
    tok = load_tokenizer(spec)
    encode_mod = __import__("tokenload.preprocess.encode", fromlist=["_TOKENIZERS"])
    monkeypatch.setitem(encode_mod._TOKENIZERS, spec, tok)
    task = EncodeTask(spec, ("text",), append_eod, False, str(tok.dtype))
    for lines in (PLAIN, ADVERSARIAL, PLAIN[::-1]):
        chunk = jsonl(b"\n".join(lines) + b"\n")
        fast_result = encoded(task, chunk)
        with monkeypatch.context() as m:
            m.setattr(GigatokenTokenizer, "encode_documents", lambda *a: None)
            m.setattr(records, "VIEW_LINE_BYTES", 10**15)
            general_result = encoded(task, chunk)
        for x, y in zip(fast_result[0], general_result[0], strict=True):
            assert_same(x, y)
        assert fast_result[1:] == general_result[1:]
        assert fast_result[3]["malformed_json"] > 0


def test_long_texts_by_the_one_text_call_give_the_padded_calls_ids(
    tokenizer_files, texts, monkeypatch
):
    for name in GIGATOKEN_KINDS:
        tok = load_tokenizer(spec_for(name, tokenizer_files))
        sample = [*texts[:30], " ".join(texts[:200]), *EXTRA]
        padded = tok.encode_batch(sample)
        monkeypatch.setattr(fast, "ONE_TEXT_CHARS", 100)
        one_text = tok.encode_batch(sample)
        monkeypatch.undo()
        assert_same(one_text, padded)


def test_one_large_document_is_not_held_many_times(tokenizer_files, tmp_path):
    """Peak RSS while one 60 MB document is encoded grows by less than the line plus 6 bytes a
    token (its string and UTF-8 bytes, the ids once as uint32, the uint16 output): 0.74-0.84 of
    that here, where the path before this one grew by 1.38-1.45 of it (the line split out as a
    copy, the padded call's second copy of the ids, the flat copy, the cast and the EOD
    insertion). Measured in a fresh process, so RSS is its own."""
    code = f"""
import json, resource
import numpy as np
from tokenload.preprocess import fast
from tokenload.preprocess.config import TokenizerSpec
from tokenload.preprocess.encode import EncodeTask, encode_chunk
from tokenload.preprocess.sources import Chunk
fast.ONE_TEXT_CHARS = 1 << 20
spec = TokenizerSpec(kind="HuggingFaceTokenizer", model={tokenizer_files["bytelevel"]!r})
task = EncodeTask(spec, ("text",), True, False, "uint16")
def chunk(line):
    return Chunk("in.jsonl", "jsonl", 1, line, len(line))
encode_chunk(task, chunk(b'{{"text": "warm up"}}'))
unit = "word and more words\\n\\"quoted\\" caf\u00e9 "
line = json.dumps({{"text": unit * (60 * 2**20 // len(unit))}}).encode() + b"\\n"
with open("/proc/self/statm") as f:
    base = int(f.read().split()[1]) * resource.getpagesize()
encoded = encode_chunk(task, chunk(line))
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec from the process that started this
# one (pytest, hundreds of MB into a full run), while VmHWM belongs to this process's own memory
with open("/proc/self/status") as f:
    peak = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
grown = peak - base
assert encoded.documents == 1 and encoded.outputs[0][2].tolist() == [1]
print(grown / (len(line) + 6 * encoded.outputs[0][0].size))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 1.1


def reference_line_chunks(blocks, size):
    """``sources._line_chunks`` before long lines were searched once (every round searched the
    first ``size()`` bytes again): the pieces it gave are the rule."""
    buf = bytearray()
    scanned = 0
    for block in blocks:
        buf += block
        while len(buf) >= (target := size()):
            cut = buf.rfind(b"\n", 0, target)
            if cut < 0:
                cut = buf.find(b"\n", max(target, scanned))
                if cut < 0:
                    scanned = len(buf)
                    break
            piece = bytes(buf[: cut + 1])
            del buf[: cut + 1]
            scanned = 0
            yield piece
    if buf:
        yield bytes(buf)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.integers(0, 300), max_size=40),
    block=st.integers(1, 97),
    sizes=st.lists(st.integers(1, 200), min_size=1, max_size=8),
    last_newline=st.booleans(),
)
def test_line_chunks_cut_where_they_cut_before(lines, block, sizes, last_newline):
    data = b"\n".join(b"x" * n for n in lines) + (b"\n" if last_newline and lines else b"")

    def pieces(chunker):
        calls = iter(range(10**9))
        blocks = (data[i : i + block] for i in range(0, len(data), block))
        return list(chunker(blocks, lambda: sizes[next(calls) % len(sizes)]))

    got = pieces(sources._line_chunks)
    assert got == pieces(reference_line_chunks)
    assert b"".join(got) == data
