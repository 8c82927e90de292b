"""Corrupt, truncated and mismatched token files give FormatError with a HINT, never garbage."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import write_documents
from tokenload.errors import FormatError
from tokenload.format import ReadMode, TokenFile


def _load_everything(prefix, mode="mmap"):
    """Open and read every sequence and document (what a dataset would eventually touch)."""
    tf = TokenFile(prefix, mode=mode)
    for i in range(tf.num_sequences):
        tf[i]
    for d in range(tf.num_documents):
        tf.document(d)
    tf[:]
    return tf


@pytest.fixture
def pair(tmp_path):
    prefix = write_documents(tmp_path / "c", [[1, 2, 3], [4, 5], [], [6, 7, 8, 9]])
    return prefix, (tmp_path / "c.idx").read_bytes()


def _expect_format_error(prefix, match):
    with pytest.raises(FormatError, match=match) as info:
        _load_everything(prefix)
    assert "HINT:" in str(info.value)
    assert str(info.value).startswith(prefix)


@pytest.mark.parametrize(
    "offset,value,match",
    [
        (0, b"XMIDIDX\x00\x00", "magic"),
        (9, struct.pack("<Q", 2), "version is 2"),
        (17, struct.pack("<B", 0), "dtype code is 0"),
        (17, struct.pack("<B", 9), "dtype code is 9"),
        (18, struct.pack("<Q", 5), "expected .* for 5 sequences"),
        (18, struct.pack("<Q", 2**40), "expected .* sequences"),
        (26, struct.pack("<Q", 7), "expected .* 6 documents"),
        (26, struct.pack("<Q", 0), "document count is 0"),
    ],
)
def test_each_header_field_altered(pair, offset, value, match):
    prefix, idx = pair
    corrupted = idx[:offset] + value + idx[offset + len(value) :]
    with open(prefix + ".idx", "wb") as f:
        f.write(corrupted)
    _expect_format_error(prefix, match)


def test_dtype_code_changed_to_other_width_is_caught_by_bin_size(pair):
    prefix, idx = pair
    with open(prefix + ".idx", "wb") as f:
        f.write(idx[:17] + struct.pack("<B", 4) + idx[18:])  # uint16 -> int32
    _expect_format_error(prefix, r"\.bin is 18 bytes, not a multiple of the int32")


def test_legacy_fairseq_index_is_named(pair):
    prefix, _ = pair
    with open(prefix + ".idx", "wb") as f:
        f.write(b"TNTIDX\x00\x00" + bytes(40))
    _expect_format_error(prefix, "legacy fairseq")


def test_truncation_at_every_region_boundary(pair):
    prefix, idx = pair
    n, d = 4, 5
    boundaries = [0, 1, 9, 17, 18, 26, 33, 34, 34 + 4 * n, 34 + 12 * n, 34 + 12 * n + 8 * d - 1]
    for cut in boundaries:
        with open(prefix + ".idx", "wb") as f:
            f.write(idx[:cut])
        with pytest.raises(FormatError, match=r"shorter than|truncated") as info:
            _load_everything(prefix)
        assert "HINT:" in str(info.value), cut


def test_trailing_bytes_in_index(pair):
    prefix, idx = pair
    with open(prefix + ".idx", "wb") as f:
        f.write(idx + b"\x00\x00")
    _expect_format_error(prefix, "longer than its header")


@pytest.mark.parametrize("mode", list(ReadMode))
@pytest.mark.parametrize("delta", [-2, -1, 1, 2, 4])
def test_bin_size_disagrees_with_index(pair, mode, delta):
    prefix, _ = pair
    data = Path(prefix + ".bin").read_bytes()
    with open(prefix + ".bin", "wb") as f:
        f.write(data[:delta] if delta < 0 else data + bytes(delta))
    with pytest.raises(FormatError, match=r"\.bin is") as info:
        _load_everything(prefix, mode)
    assert "HINT:" in str(info.value)


def test_pointer_outside_bin_is_format_error(pair):
    prefix, idx = pair
    # sequence 1's pointer (second int64 after the 4 lengths) moved far past the end of .bin
    at = 34 + 4 * 4 + 8
    with open(prefix + ".idx", "wb") as f:
        f.write(idx[:at] + struct.pack("<q", 10_000) + idx[at + 8 :])
    with pytest.raises(FormatError, match=r"sequence 1 has pointer 10000 .* expected pointer\[i \+ 1\]"):
        TokenFile(prefix)[1]


# -- fuzzing ---------------------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _read_all(prefix, mode):
    """Every sequence, the whole-file slice and every document, read in ``mode``; or the
    FormatError's message. Checks each successful read against the index and the raw ``.bin``."""
    try:
        tf = _load_everything(prefix, mode)
        lengths = tf.sequence_lengths.tolist()
        sequences = [tf[i].tolist() for i in range(tf.num_sequences)]
        documents = [tf.document(d).tolist() for d in range(tf.num_documents)]
        whole = [s.tolist() for s in tf[:]]
    except FormatError as exc:
        return str(exc)
    raw = np.fromfile(prefix + ".bin", dtype=tf.dtype)
    assert whole == sequences
    assert [len(s) for s in sequences] == lengths
    for i, tokens in enumerate(sequences):
        start = int(tf.sequence_pointers[i]) // tf.dtype.itemsize
        assert tokens == raw[start : start + lengths[i]].tolist(), i
    bounds = tf.document_indices.tolist()
    for d, tokens in enumerate(documents):
        assert tokens == [t for s in sequences[bounds[d] : bounds[d + 1]] for t in s], d
    return tf.dtype.name, sequences, documents


def _fuzz_once(prefix, data):
    """A fuzzed index gives the same outcome in every read mode: the same FormatError, or the same
    tokens, and those consistent with the sequence lengths and the ``.bin`` bytes."""
    with open(prefix + ".idx", "wb") as f:
        f.write(data)
    outcomes = {mode: _read_all(prefix, mode) for mode in ReadMode}
    assert outcomes[ReadMode.PREAD] == outcomes[ReadMode.MMAP] == outcomes[ReadMode.MEMORY]
    return outcomes[ReadMode.MMAP]


def test_fuzz_helper_checks_successful_reads(pair):
    """The unmodified index reads back the written documents, so a success is a real check."""
    prefix, idx = pair
    dtype, _sequences, documents = _fuzz_once(prefix, idx)
    assert (dtype, documents) == ("uint16", [[1, 2, 3], [4, 5], [], [6, 7, 8, 9]])


@FUZZ
@given(data=st.binary(max_size=300))
def test_fuzz_random_bytes_only_raise_format_error(pair, data):
    _fuzz_once(pair[0], data)


@FUZZ
@given(
    edits=st.lists(st.tuples(st.integers(0, 129), st.integers(0, 255)), min_size=1, max_size=8),
    cut=st.one_of(st.none(), st.integers(0, 130)),
)
def test_fuzz_mutated_valid_index_only_raises_format_error(pair, edits, cut):
    prefix, idx = pair
    data = bytearray(idx)
    for pos, byte in edits:
        data[pos % len(data)] = byte
    if cut is not None:
        data = data[:cut]
    _fuzz_once(prefix, bytes(data))


@FUZZ
@given(
    field=st.sampled_from(["lengths", "pointers", "documents"]),
    index=st.integers(0, 4),
    value=st.integers(-(2**31), 2**31 - 1),
)
def test_fuzz_array_values_only_raise_format_error(pair, field, index, value):
    prefix, idx = pair
    n, d = 4, 5
    offset, width, count = {
        "lengths": (34, 4, n),
        "pointers": (34 + 4 * n, 8, n),
        "documents": (34 + 12 * n, 8, d),
    }[field]
    at = offset + width * (index % count)
    packed = struct.pack("<i" if width == 4 else "<q", value)
    _fuzz_once(prefix, idx[:at] + packed + idx[at + width :])


@pytest.mark.parametrize("mode", list(ReadMode))
def test_slice_with_a_length_that_disagrees_with_the_pointers_is_a_format_error(pair, mode):
    """A corrupt length that the O(1) checks cannot see (sequence 0: 3 -> 0 tokens) must not shift
    the tokens a slice returns: a slice, a document and a single read all name sequence 0."""
    prefix, idx = pair
    with open(prefix + ".idx", "wb") as f:
        f.write(idx[:34] + struct.pack("<i", 0) + idx[38:])
    tf = TokenFile(prefix, mode=mode)
    for read in (lambda: tf[:], lambda: tf.document(0), lambda: tf[0]):
        with pytest.raises(FormatError, match=r"c\.idx: sequence 0 has pointer 0 and length 0"):
            read()
    assert tf[1].tolist() == [4, 5]  # sound sequences still read
