"""The two O(1) document-index checks at open, and GPT-NeoX's boundary-less ``document_indices == [0]``."""

from __future__ import annotations

import numpy as np
import pytest

from support import write_documents
from tokenload.errors import FormatError
from tokenload.format import ReadMode, TokenFile, merge_token_files, verify
from tokenload.format.idx import encode_index

SEQUENCES = [[1, 2, 3], [4, 5], [], [6, 7, 8, 9]]


def _rewrite_documents(prefix: str, documents: list[int]) -> None:
    """Rewrite ``prefix``'s index with the same sequences and ``documents`` as document_indices."""
    tf = TokenFile(prefix, mode="memory")
    lengths, dtype = np.array(tf.sequence_lengths), tf.dtype
    tf.close()
    with open(prefix + ".idx", "wb") as f:
        f.writelines(encode_index(dtype, lengths, np.array(documents, dtype=np.int64)))


@pytest.fixture
def prefix(tmp_path):
    return write_documents(tmp_path / "d", SEQUENCES)


@pytest.mark.parametrize("mode", list(ReadMode))
@pytest.mark.parametrize(
    "documents,match",
    [
        ([1, 2, 3, 4], r"document_indices\[0\] is 1, expected 0"),
        ([2, 4], r"document_indices\[0\] is 2, expected 0"),
        ([0, 1, 2, 3], r"document_indices\[-1\] is 3, expected the sequence count 4"),
        ([0, 1, 2, 3, 4, 5], r"document_indices\[-1\] is 5, expected the sequence count 4"),
        ([0, 2], r"document_indices\[-1\] is 2, expected the sequence count 4"),
        ([3], r"document_indices\[0\] is 3, expected 0"),
    ],
)
def test_open_refuses_document_indices_that_do_not_span_the_sequences(prefix, mode, documents, match):
    _rewrite_documents(prefix, documents)
    tf = TokenFile(prefix, mode=mode)
    with pytest.raises(FormatError, match=match) as info:
        tf.num_sequences  # the first access opens
    assert str(info.value).startswith(prefix + ".idx: ")
    assert "HINT:" in str(info.value)


@pytest.mark.parametrize("mode", list(ReadMode))
def test_neox_merge_index_reads_each_sequence_as_a_document(prefix, mode):
    _rewrite_documents(prefix, [0])
    tf = TokenFile(prefix, mode=mode)
    assert tf.documents_from_sequences
    assert tf.num_documents == tf.num_sequences == 4
    assert tf.document_indices.tolist() == [0, 1, 2, 3, 4]
    for i, tokens in enumerate(SEQUENCES):
        assert tf.document(i).tolist() == tokens
        assert tf[i].tolist() == tokens
    assert verify(prefix) == []


def test_files_with_document_boundaries_are_not_flagged(prefix, tmp_path):
    assert not TokenFile(prefix).documents_from_sequences
    empty = write_documents(tmp_path / "empty", [])
    tf = TokenFile(empty)
    assert (tf.document_indices.tolist(), tf.num_documents, tf.documents_from_sequences) == ([0], 0, False)


def test_merging_a_neox_merged_file_writes_one_document_per_sequence(prefix, tmp_path):
    _rewrite_documents(prefix, [0])
    other = write_documents(tmp_path / "o", [[10, 11]])
    merge_token_files([prefix, other], tmp_path / "m")
    merged = TokenFile(tmp_path / "m")
    assert not merged.documents_from_sequences
    assert merged.document_indices.tolist() == [0, 1, 2, 3, 4, 5]
    assert verify(str(tmp_path / "m"), hashes=True) == []
