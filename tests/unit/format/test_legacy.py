"""GPT-NeoX's files read and convert: the legacy fairseq "cached/lazy" index (TNTIDX), NeoX's
MMIDIDX with its swapped float codes 6/7, and NeoX's merged files without document boundaries.

The fixtures under tests/fixtures/legacy/ were written by GPT-NeoX's own builders and read back by
its own readers (make_fixtures.py, expected.json); ``legacy_files`` writes the same layouts from
the spec for the corruption and fuzz tests.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from legacy_files import tntidx_bytes, write_neox_mmidx, write_tntidx
from test_corruption import FUZZ, _fuzz_once

from support import FIXTURES
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import FormatError
from tokenload.format import (
    ReadMode,
    TokenFile,
    TokenFileWriter,
    check_file,
    convert_token_file,
    describe,
)

LEGACY = FIXTURES / "legacy"
EXPECTED = json.loads((LEGACY / "expected.json").read_text())["files"]
TNTIDX = sorted(name for name in EXPECTED if name.startswith("cached"))
DOCS = [[[1, 2, 3], [4]], [[]], [], [[70000, 5]]]  # an empty sequence, an empty document, an int32 id


def _md5(path) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


# -- against GPT-NeoX's own files and readers ------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("mode", list(ReadMode))
def test_reads_what_neox_reads(name, mode):
    meta, neox = EXPECTED[name], EXPECTED[name]["neox"]
    assert _md5(LEGACY / f"{name}.idx") == meta["md5"]["idx"] and _md5(LEGACY / f"{name}.bin") == meta["md5"]["bin"]
    tf = TokenFile(LEGACY / name, mode=mode, allow_float=True)  # float fixtures: data files
    assert tf.dtype.name == neox["dtype"] == meta["dtype"]
    assert tf.header.index_format == ("TNTIDX" if neox["infer"] == "cached" else "MMIDIDX")
    assert tf.sequence_lengths.dtype == np.int32 and tf.sequence_lengths.tolist() == neox["sizes"]
    assert [tf[i].tolist() for i in range(len(tf))] == neox["items"]
    assert [a.tolist() for a in tf[:]] == neox["slice"]
    assert neox.get("cached_items", neox.get("warm_items")) == neox["items"]
    if neox["infer"] == "cached":
        assert tf.sequence_pointers.tolist() == [o * neox["element_size"] for o in neox["data_offsets"][:-1]]
    else:
        assert tf.sequence_pointers.tolist() == neox["pointers"]
    if neox["doc_idx"] == [0]:  # NeoX's merge_file_ (both formats) does not merge doc_idx
        assert tf.documents_from_sequences and tf.document_indices.tolist() == list(range(len(tf) + 1))
    else:
        assert not tf.documents_from_sequences and tf.document_indices.tolist() == neox["doc_idx"]
    documents = [[t for s in doc for t in s] for doc in meta["documents"]]
    if tf.documents_from_sequences:
        documents = [seq for doc in meta["documents"] for seq in doc]
    assert [tf.document(d).tolist() for d in range(tf.num_documents)] == documents


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_spec_layout_writer_gives_neox_builders_bytes(name, tmp_path):
    """The spec's byte layout (legacy_files) is the one NeoX's builders write, byte for byte."""
    meta, neox = EXPECTED[name], EXPECTED[name]["neox"]
    dtype = np.dtype(meta["dtype"]).type
    doc_idx = [0] if neox["doc_idx"] == [0] else None
    if name in TNTIDX:
        idx, data = tntidx_bytes(meta["documents"], dtype, doc_idx=doc_idx)
        assert (idx, data) == ((LEGACY / f"{name}.idx").read_bytes(), (LEGACY / f"{name}.bin").read_bytes())
    else:
        prefix = write_neox_mmidx(tmp_path / name, meta["documents"], dtype, doc_idx=doc_idx)
        assert _md5(prefix + ".idx") == meta["md5"]["idx"] and _md5(prefix + ".bin") == meta["md5"]["bin"]


def _writer_bytes(tmp_path, documents, dtype) -> tuple[bytes, bytes]:
    """What tokenload's MMIDIDX writer (megatron-core's bytes) writes for these documents."""
    with TokenFileWriter(tmp_path / "expected", dtype) as w:
        for doc in documents:
            w.add_document(np.array([t for s in doc for t in s], dtype=dtype), [len(s) for s in doc])
    return (tmp_path / "expected.idx").read_bytes(), (tmp_path / "expected.bin").read_bytes()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_convert_writes_megatron_core_bytes_for_the_same_documents(name, tmp_path):
    meta, neox = EXPECTED[name], EXPECTED[name]["neox"]
    documents = meta["documents"]
    if neox["doc_idx"] == [0]:  # no boundaries recorded: each sequence becomes a document
        documents = [[seq] for doc in documents for seq in doc]
    sidecar = convert_token_file(LEGACY / name, tmp_path / "out")
    expected = _writer_bytes(tmp_path, documents, np.dtype(meta["dtype"]))
    assert ((tmp_path / "out.idx").read_bytes(), (tmp_path / "out.bin").read_bytes()) == expected
    assert (tmp_path / "out.idx").read_bytes()[:9] == b"MMIDIDX\x00\x00"
    code = (tmp_path / "out.idx").read_bytes()[17]
    assert code == {"int32": 4, "uint16": 8, "float32": 7, "float64": 6}[meta["dtype"]]  # megatron-core's codes
    out = TokenFile(tmp_path / "out", dtype_codes="megatron", allow_float=True)
    assert [a.tolist() for a in out[:]] == neox["items"] and not out.documents_from_sequences
    assert sidecar.metadata["converted_from"]["index_format"] == ("TNTIDX" if name in TNTIDX else "MMIDIDX")


def test_legacy_file_and_its_conversion_give_the_same_samples(tmp_path):
    docs = [[list(range(i, i + 5 + i % 7))] for i in range(60)]
    legacy = write_tntidx(tmp_path / "legacy", docs)
    convert_token_file(legacy, tmp_path / "mmidx")

    def samples(prefix, cache):
        cfg = MegatronDataConfig(sequence_length=8, blend=[prefix], split="1,0,0", path_to_cache=str(cache))
        train = build_datasets(cfg, [40, 0, 0])[0]
        return [train[i]["tokens"].tolist() for i in range(len(train))]

    assert samples(legacy, tmp_path / "c1") == samples(str(tmp_path / "mmidx"), tmp_path / "c2")


def test_info_and_verify_on_legacy_files():
    d = describe(str(LEGACY / "cached"))
    assert (d["index_format"], d["dtype"], d["documents"], d["empty_documents"]) == ("TNTIDX", "int32", 5, 1)
    assert check_file(str(LEGACY / "cached")).problems == []
    merged = check_file(str(LEGACY / "cached_merged"))
    assert merged.problems == [] and "each sequence is a document" in merged.checked[0]
    assert check_file(str(LEGACY / "cached"), vocab_size=1000).problems[0].startswith("token 70000")


def test_warmup_and_pickling_of_a_legacy_file(tmp_path):
    import pickle

    prefix = write_tntidx(tmp_path / "w", DOCS)
    tf = TokenFile(prefix, warmup=True)
    assert [a.tolist() for a in tf[:]] == [[1, 2, 3], [4], [], [70000, 5]]
    again = pickle.loads(pickle.dumps(tf))
    assert again.document(0).tolist() == [1, 2, 3, 4] and again.document_indices.tolist() == [0, 2, 3, 3, 4]


# -- GPT-NeoX's float codes ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_neox_float_codes_read_by_the_bin_size(tmp_path, dtype):
    prefix = write_neox_mmidx(tmp_path / "f", [[[0.5, 1.5]], [[2.5]]], dtype)
    for mode in ReadMode:
        tf = TokenFile(prefix, mode=mode, allow_float=True)
        assert tf.dtype == dtype and [a.tolist() for a in tf[:]] == [[0.5, 1.5], [2.5]]
    assert TokenFile(prefix, dtype_codes="neox", allow_float=True).dtype == dtype
    note = describe(prefix)["dtype_note"]
    assert "GPT-NeoX's table" in note
    with pytest.raises(FormatError, match="swapped between megatron-core and GPT-NeoX") as info:
        TokenFile(prefix, dtype_codes="megatron", allow_float=True).dtype
    assert "dtype_codes='auto'" in str(info.value)
    with pytest.raises(FormatError, match="not a token dtype"):  # never a token file
        TokenFile(prefix).dtype


def test_megatron_float_codes_still_follow_megatron_core(tmp_path):
    with TokenFileWriter(tmp_path / "m", np.float32) as w:  # megatron-core's code 7
        w.add_document(np.array([0.5, 1.5], np.float32))
    tf = TokenFile(tmp_path / "m", allow_float=True)
    assert (tf.header.code, tf.dtype) == (7, np.float32) and "megatron-core's table" in describe(
        str(tmp_path / "m")
    )["dtype_note"]


def test_legacy_element_size_decides_float_codes(tmp_path):
    """fairseq's original code 6 is float64 (element size 8), NeoX's is float32 (4)."""
    fair = write_tntidx(tmp_path / "fair", [[[0.25, 2.0]]], np.float64, code=6)
    tf = TokenFile(fair, allow_float=True)
    assert tf.dtype == np.float64 and tf[0].tolist() == [0.25, 2.0]
    with pytest.raises(FormatError, match="element size is 8 bytes, but dtype code 6 is float32"):
        TokenFile(fair, dtype_codes="neox", allow_float=True).dtype
    with pytest.raises(FormatError, match="dtype code 6 means float64, which is not a token dtype"):
        TokenFile(fair).dtype


# -- corruption ------------------------------------------------------------------------------------

N, S, D = 4, 4, 5
HEAD = 56
DIMS, OFFS, SIZES, DOCIDX = HEAD, HEAD + 8 * (N + 1), HEAD + 16 * (N + 1), HEAD + 16 * (N + 1) + 8 * S


@pytest.fixture
def legacy(tmp_path):
    prefix = write_tntidx(tmp_path / "l", DOCS)
    return prefix, (tmp_path / "l.idx").read_bytes()


def _expect(prefix, data, match):
    with open(prefix + ".idx", "wb") as f:
        f.write(data)
    for mode in ReadMode:
        with pytest.raises(FormatError, match=match) as info:
            tf = TokenFile(prefix, mode=mode)
            tf[:]
        assert "HINT:" in str(info.value) and str(info.value).startswith(prefix)


def _put(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + struct.pack("<q", value) + data[at + 8 :]


@pytest.mark.parametrize(
    "at,value,match",
    [
        (8, 2, "version is 2, expected 1"),
        (16, 0, "dtype code is 0"),
        (16, 9, "dtype code is 9"),
        (24, 2, "element size is 2 bytes, but dtype code 4 is int32"),
        (32, 5, r"expected \d+ for 5 items, 4 sizes"),
        (32, 2**40, "truncated"),
        (40, 6, r"expected \d+ for 4 items, 6 sizes"),
        (48, 7, "6 documents"),
        (48, 0, "document count is 0"),
        (DIMS + 8 * 2, 3, r"dim_offsets are not \[0, 1, \.\.\., 4\]"),
        (OFFS + 8 * 1, 4, r"data_offsets\[1\] is 4, expected 3"),
        (OFFS, -1, r"data_offsets\[0\] is -1, expected 0"),
        (SIZES + 8 * 3, -2, "sequence 3 has length -2"),
        (SIZES + 8 * 3, 2**31, "expected at most 2147483647"),
        (SIZES + 8 * 1, 2, r"data_offsets\[2\] is 4, expected 5"),
        (DOCIDX, 1, r"document_indices\[0\] is 1, expected 0"),
        (DOCIDX + 8 * 4, 3, r"document_indices\[-1\] is 3, expected the sequence count 4"),
        (DOCIDX + 8 * 2, 1, "doc_idx decreases at document 1"),
    ],
)
def test_each_legacy_field_altered(legacy, at, value, match):
    prefix, idx = legacy
    _expect(prefix, _put(idx, at, value), match)


def test_multidimensional_items_are_named(tmp_path):
    prefix = write_tntidx(tmp_path / "m", [[[1, 2, 3, 4]]])
    idx = (tmp_path / "m.idx").read_bytes()
    # one item of shape (2, 2): dim_offsets [0, 2], sizes [2, 2], data_offsets [0, 4]
    head = idx[:40] + struct.pack("<Q", 2) + idx[48:56]
    arrays = np.array([0, 2, 0, 4, 2, 2, 0, 1], "<i8").tobytes()
    _expect(prefix, head + arrays, "item 0 has 2 dimensions, expected 1")


def test_legacy_truncated_at_every_region_and_padded(legacy):
    prefix, idx = legacy
    for cut in [0, 8, 9, 16, 55, 56, DIMS + 8, OFFS, SIZES, DOCIDX, len(idx) - 1]:
        _expect(prefix, idx[:cut], "shorter than|truncated|magic")
    _expect(prefix, idx + b"\x00" * 8, "longer than its header says")


@pytest.mark.parametrize("delta", [-4, 4, 8])
def test_legacy_bin_size_disagrees(legacy, delta):
    prefix, idx = legacy
    data = Path(prefix + ".bin").read_bytes()
    with open(prefix + ".bin", "wb") as f:
        f.write(data[:delta] if delta < 0 else data + bytes(delta))
    _expect(prefix, idx, r"\.bin is")


def test_legacy_has_no_modes(legacy):
    with pytest.raises(FormatError, match="has no sequence modes"):
        TokenFile(legacy[0], multimodal=True).header


def test_fuzz_helper_reads_the_legacy_file(legacy):
    dtype, sequences, documents = _fuzz_once(*legacy)
    assert (dtype, sequences, documents) == (
        "int32",
        [[1, 2, 3], [4], [], [70000, 5]],
        [[1, 2, 3, 4], [], [], [70000, 5]],
    )


@FUZZ
@given(
    edits=st.lists(st.tuples(st.integers(0, 255), st.integers(0, 255)), min_size=1, max_size=8),
    cut=st.one_of(st.none(), st.integers(0, 260)),
)
def test_fuzz_mutated_legacy_index_only_raises_format_error(legacy, edits, cut):
    prefix, idx = legacy
    data = bytearray(idx)
    for pos, byte in edits:
        data[pos % len(data)] = byte
    _fuzz_once(prefix, bytes(data if cut is None else data[:cut]))


@FUZZ
@given(
    region=st.sampled_from([DIMS, OFFS, SIZES, DOCIDX]),
    index=st.integers(0, 4),
    value=st.integers(-(2**63), 2**63 - 1),
)
def test_fuzz_legacy_array_values_only_raise_format_error(legacy, region, index, value):
    prefix, idx = legacy
    count = {DIMS: N + 1, OFFS: N + 1, SIZES: S, DOCIDX: D}[region]
    _fuzz_once(prefix, _put(idx, region + 8 * (index % count), value))


@FUZZ
@given(fields=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 2**64 - 1)), min_size=1, max_size=3))
def test_fuzz_legacy_header_only_raises_format_error(legacy, fields):
    prefix, idx = legacy
    data = bytearray(idx)
    for field, value in fields:
        data[8 * field : 8 * field + 8] = struct.pack("<Q", value)
    _fuzz_once(prefix, bytes(data))

