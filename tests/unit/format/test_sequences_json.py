"""The sequences JSON (read_sequences, write_sequences) and TokenFile opened with its counts and
dtype: no header parsed, the length and dtype known unopened, a changed file refused."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from support import write_documents
from tokenload.errors import ConfigError, FormatError
from tokenload.format import SequenceCounts, TokenFile, read_sequences, write_sequences
from tokenload.format import opening as opening_module
from tokenload.format.idx import optimal_dtype

DOCS = [[1, 2, 3], [4, 5], [], [6, 7, 8, 9]]


@pytest.fixture
def prefix(tmp_path):
    return write_documents(tmp_path / "doc", DOCS)


def _counts(prefix) -> SequenceCounts:
    header = TokenFile(prefix).header
    return SequenceCounts(header.sequence_count, header.document_count, header.dtype)


def test_round_trip_keeps_megatron_format_and_dtypes(prefix, tmp_path):
    path = tmp_path / "seq.json"
    write_sequences(path, {prefix: _counts(prefix)})
    raw = json.loads(path.read_text())
    assert raw[prefix] == [4, 5]  # N sequences, D + 1 straight from the header
    assert raw["__tokenload_dtypes__"] == {prefix: "uint16"}
    assert read_sequences(path).entry(prefix) == SequenceCounts(4, 5, np.dtype(np.uint16))


def test_megatron_written_file_has_no_dtypes(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"a/b": [10, 4], "c": [0, 1]}))
    got = read_sequences(path)
    assert got.entry("a/b") == SequenceCounts(10, 4, None)
    assert list(got.entries) == ["a/b", "c"]


def test_missing_prefix_names_prefix_file_and_command(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"a": [1, 2]}))
    with pytest.raises(ConfigError) as err:
        read_sequences(path).entry("b")
    assert "'b'" in err.value.message and err.value.path == str(path)
    assert "tokenload sequences" in err.value.hint


@pytest.mark.parametrize(
    "text",
    ["{not json", "[1, 2]", '{"a": [1]}', '{"a": [1, 0]}', '{"a": ["1", 2]}', '{"a": [true, 2]}', '{"a": [-1, 2]}',
     '{"a": [1, 2], "__tokenload_dtypes__": {"a": "float7"}}', '{"a": [1, 2], "__tokenload_dtypes__": {"b": "int32"}}',
     '{"a": [1, 2], "__tokenload_dtypes__": ["int32"]}'],
)
def test_malformed_files_are_config_errors(text, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_sequences(path)
    assert err.value.path == str(path)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        read_sequences(tmp_path / "none.json")


def test_a_prefix_named_like_the_dtypes_key_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="__tokenload_dtypes__"):
        write_sequences(tmp_path / "x.json", {"__tokenload_dtypes__": SequenceCounts(1, 2, None)})
    assert not (tmp_path / "x.json").exists()


def test_token_file_with_counts_parses_no_header(prefix, monkeypatch):
    def no_header(*args, **kwargs):
        raise AssertionError("the header was parsed")

    monkeypatch.setattr(opening_module, "parse_header", no_header)
    tf = TokenFile(prefix, sequences=(4, 5), dtype="uint16", sequences_path="seq.json")
    assert [tf[i].tolist() for i in range(len(tf))] == [[1, 2, 3], [4, 5], [], [6, 7, 8, 9]]
    assert tf.document(3).tolist() == [6, 7, 8, 9] and tf.num_documents == 4


def test_length_and_dtype_known_without_opening(prefix):
    tf = TokenFile(prefix, sequences=(4, 5), dtype="uint16")
    os.remove(prefix + ".idx")
    os.remove(prefix + ".bin")
    assert (len(tf), tf.num_sequences, tf.dtype) == (4, 4, np.dtype(np.uint16))


def test_pickled_token_file_keeps_its_counts(prefix):
    tf = pickle.loads(pickle.dumps(TokenFile(prefix, sequences=(4, 5), dtype="uint16", sequences_path="s.json")))
    assert (tf.sequences, tf.given_dtype, tf.sequences_path) == ((4, 5), np.dtype(np.uint16), "s.json")
    assert tf[3].tolist() == [6, 7, 8, 9]


@pytest.mark.parametrize(
    "counts,dtype,message",
    [
        ((5, 5), "uint16", "index is 122 bytes, expected 134"),  # another size than the counts imply
        ((6, 2), "uint16", "header holds 4 sequences"),  # 12 x 2 = 8 x 3: the same size, other counts
        ((4, 5), "int32", "a code of int32"),
    ],
)
def test_changed_file_is_a_format_error_naming_both_files(prefix, counts, dtype, message):
    tf = TokenFile(prefix, sequences=counts, dtype=dtype, sequences_path="/jobs/seq.json")
    with pytest.raises(FormatError) as err:
        tf[0]
    assert message in err.value.message
    assert err.value.path == prefix + ".idx"
    assert "/jobs/seq.json" in err.value.message
    assert "tokenload sequences" in err.value.hint


def test_counts_without_dtype_read_the_header_and_must_agree(prefix):
    assert TokenFile(prefix, sequences=(4, 5)).dtype == np.dtype(np.uint16)
    with pytest.raises(FormatError, match="header holds 4 sequences"):
        TokenFile(prefix, sequences=(3, 5), sequences_path="s.json").num_tokens


def test_vocabularies_megatron_misreads_keep_their_dtype(tmp_path):
    """Megatron's writer stores a 65,500-token vocabulary as int32, its sequences path guesses
    uint16 for it; the dtype in tokenload's JSON reads the tokens right."""
    vocab = 65_500
    dtype = optimal_dtype(vocab)
    assert dtype == np.dtype(np.int32)
    prefix = write_documents(tmp_path / "big", [[65_499, 1, 65_000], [7]], dtype=dtype)
    path = tmp_path / "seq.json"
    write_sequences(path, {prefix: _counts(prefix)})
    entry = read_sequences(path).entry(prefix)
    tf = TokenFile(prefix, sequences=(entry.sequence_count, entry.document_count), dtype=entry.dtype)
    assert tf[0].tolist() == [65_499, 1, 65_000]
    with pytest.raises(FormatError):  # the guess (uint16) is refused, not read as other tokens
        TokenFile(prefix, sequences=(entry.sequence_count, entry.document_count), dtype="uint16")[0]
