"""Token files written by megatron-core 0.19.2 (tests/fixtures/megatron/format) read back
identically, and tokenload writes byte-identical files for the same documents."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from support import FIXTURES
from tokenload.format import ReadMode, TokenFile, TokenFileWriter, merge_token_files

FORMAT = FIXTURES / "megatron" / "format"
NAMES = sorted(p.stem for p in FORMAT.glob("*.json"))


def _meta(name):
    return json.loads((FORMAT / f"{name}.json").read_text())


def _md5(path):
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def test_fixtures_present():
    assert {"worked_example", "random_u16", "int32_large", "merged", "gold_x", "gold_y"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", list(ReadMode))
def test_megatron_files_read_back(name, mode):
    meta = _meta(name)
    tf = TokenFile(FORMAT / name, mode=mode)
    index = meta["index"]
    assert tf.dtype == np.dtype(meta["dtype"])
    assert tf.num_sequences == index["sequence_count"]
    assert len(tf.document_indices) == index["document_count"]
    assert tf.sequence_lengths.tolist() == index["sequence_lengths"]
    assert tf.sequence_pointers.tolist() == index["sequence_pointers"]
    assert tf.document_indices.tolist() == index["document_indices"]
    if meta["writer"] == "add_document":
        for d, doc in enumerate(meta["documents"]):
            assert tf.document(d).tolist() == doc["tokens"]


@pytest.mark.parametrize("name", [n for n in NAMES if _meta(n)["writer"] == "add_document"])
def test_tokenload_writes_identical_bytes(tmp_path, name):
    meta = _meta(name)
    with TokenFileWriter(tmp_path / name, meta["dtype"]) as w:
        for doc in meta["documents"]:
            w.add_document(np.array(doc["tokens"], dtype=np.int64), doc["lengths"])
    assert _md5(tmp_path / f"{name}.idx") == meta["md5"]["idx"]
    assert _md5(tmp_path / f"{name}.bin") == meta["md5"]["bin"]


def test_merge_matches_megatron_add_index(tmp_path):
    meta = _meta("merged")
    merge_token_files([str(FORMAT / p) for p in meta["add_index"]], tmp_path / "merged")
    assert _md5(tmp_path / "merged.idx") == meta["md5"]["idx"]
    assert _md5(tmp_path / "merged.bin") == meta["md5"]["bin"]


def test_neox_dtype_codes_swap_floats():
    """GPT-NeoX's table swaps codes 6 and 7; integer token codes read the same under both."""
    from tokenload.format.idx import parse_header

    head = (FORMAT / "random_u16.idx").read_bytes()
    size = len(head)
    float_head = head[:17] + bytes([7]) + head[18:34]
    assert parse_header(float_head, size, "x").dtype == np.float32
    assert parse_header(float_head, size, "x", dtype_codes="neox").dtype == np.float64
    assert TokenFile(FORMAT / "random_u16", dtype_codes="neox").dtype == np.uint16


def test_foreign_json_beside_prefix_is_not_a_sidecar(tmp_path):
    from tokenload.errors import FormatError
    from tokenload.format import read_sidecar

    (tmp_path / "p.json").write_text('{"name": "not ours"}')
    assert read_sidecar(tmp_path / "p") is None
    (tmp_path / "p.json").write_text('{"format": "tokenload-token-file", "bogus": 1}')
    with pytest.raises(FormatError, match="not a valid tokenload sidecar"):
        read_sidecar(tmp_path / "p")
