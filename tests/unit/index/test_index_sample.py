"""The vectorized sample index against a pure-Python port of Megatron's C++ loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from index_reference import sample_index_loop

from tokenload.errors import ConfigError
from tokenload.index import build_sample_index, num_samples_in_index, sample_index_dtype


def _build(sizes, doc_idx, s, epochs, drop_last, extra):
    sizes = np.asarray(sizes, dtype=np.int32)
    doc_idx = np.asarray(doc_idx, dtype=np.int32)
    tokens = int(sizes.sum()) if len(doc_idx) else 0  # every epoch holds every document once
    ours = build_sample_index(sizes, doc_idx, sequence_length=s, num_epochs=epochs,
                              tokens_per_epoch=tokens, drop_last=drop_last, extra=extra)
    ref = sample_index_loop(sizes, doc_idx, s, epochs, tokens, drop_last, extra)
    return ours, ref


@pytest.mark.parametrize(
    ("drop_last", "extra", "rows"),
    [
        (True, 1, [[0, 0], [0, 4], [2, 0]]),
        (True, 0, [[0, 0], [0, 4], [1, 3], [2, 4]]),
        (False, 1, [[0, 0], [0, 4], [2, 0], [2, 3]]),
        (False, 0, [[0, 0], [0, 4], [1, 3], [2, 4]]),
    ],
)
def test_spec_table(drop_last, extra, rows):
    """Spec §2.6: sizes [5, 3, 4], S = 4, one epoch, document order [0, 1, 2]."""
    ours, ref = _build([5, 3, 4], [0, 1, 2], 4, 1, drop_last, extra)
    assert ours.tolist() == rows == [list(r) for r in ref]
    assert ours.dtype == np.int32


def test_last_token_of_a_document_stays_on_it():
    # 3-token doc then 4-token doc, S = 3: sample 1 ends on the last token of doc 0
    ours, _ = _build([3, 4], [0, 1], 3, 1, True, 0)
    assert ours[1].tolist() == [0, 3]  # (i, len) with extra = 0, never (1, 0)
    ours, _ = _build([4, 4], [0, 1], 3, 1, True, 1)
    assert ours[1].tolist() == [0, 3]  # (i, len - 1) with extra = 1: the shared token


def test_float32_count_quirk():
    """Spec §2.6: one 16,777,228-token sequence, S = 3, extra = 1, keep the partial sample."""
    sizes = np.array([16_777_228], dtype=np.int32)
    doc = np.zeros(1, dtype=np.int32)
    kept = build_sample_index(sizes, doc, sequence_length=3, num_epochs=1,
                              tokens_per_epoch=16_777_228, drop_last=False, extra=1)
    assert kept.shape[0] - 1 == 5_592_410  # float32 count; exact arithmetic says 5,592,409
    assert kept[-2:].tolist() == [[0, 16_777_227], [0, 16_777_227]]  # last one zero-length
    assert num_samples_in_index(16_777_227, 3, False, single_precision=False) == 5_592_409
    dropped = build_sample_index(sizes, doc, sequence_length=3, num_epochs=1,
                                 tokens_per_epoch=16_777_228, drop_last=True, extra=1)
    assert dropped.shape[0] - 1 == 5_592_409
    np.testing.assert_array_equal(dropped, kept[:-1])


def test_float32_count_can_also_be_lower():
    # float32(2**24 + 1) rounds down to 2**24: C++ keeps 2**23 samples, exact ceil is 2**23 + 1
    assert num_samples_in_index(2**24 + 1, 2, False) == 2**23
    assert num_samples_in_index(2**24 + 1, 2, False, single_precision=False) == 2**23 + 1


def test_count_truncates_toward_zero_like_c():
    assert num_samples_in_index(-1, 8, True) == 0
    assert num_samples_in_index(-1, 8, False) == 0
    assert num_samples_in_index(17, 8, True) == 2


def test_dtype_rule():
    assert sample_index_dtype(2**31 - 1, 100) == np.int32
    assert sample_index_dtype(2**31, 100) == np.int64
    assert sample_index_dtype(10, 2**31 - 1) == np.int32


def test_empty_stream_gives_one_row():
    ours = build_sample_index(np.array([3], np.int32), np.zeros(0, np.int32), sequence_length=4,
                              num_epochs=1, tokens_per_epoch=0)
    assert ours.tolist() == [[0, 0]]


def test_bad_inputs_are_config_errors():
    with pytest.raises(ConfigError):
        build_sample_index(np.array([3, 4]), np.array([0, 1]), sequence_length=0, num_epochs=1,
                           tokens_per_epoch=7)
    with pytest.raises(ConfigError):
        build_sample_index(np.array([3, 4]), np.array([0, 1]), sequence_length=2, num_epochs=1,
                           tokens_per_epoch=7, extra=2)
    with pytest.raises(ConfigError):
        build_sample_index(np.array([3.0, 4.0]), np.array([0, 1]), sequence_length=2,
                           num_epochs=1, tokens_per_epoch=7)
    with pytest.raises(ConfigError, match="ids in"):  # an id past the file: never wrapped
        build_sample_index(np.array([3, 4]), np.array([0, 2]), sequence_length=2,
                           num_epochs=1, tokens_per_epoch=7)


@st.composite
def streams(draw, min_len=1):
    n = draw(st.integers(1, 30))
    sizes = draw(st.lists(st.integers(min_len, 40), min_size=n, max_size=n))
    epochs = draw(st.integers(1, 3))
    order = draw(st.permutations(list(range(n)) * epochs))
    return sizes, order, epochs


@settings(max_examples=300, deadline=None)
@given(streams(), st.integers(1, 50), st.booleans(), st.integers(0, 1))
def test_matches_cxx_loop(stream, s, drop_last, extra):
    sizes, order, epochs = stream
    ours, ref = _build(sizes, order, s, epochs, drop_last, extra)
    assert ours.tolist() == [list(r) for r in ref]


@settings(max_examples=200, deadline=None)
@given(streams(min_len=0), st.integers(1, 50), st.booleans(), st.integers(0, 1))
def test_matches_cxx_loop_with_empty_sequences(stream, s, drop_last, extra):
    sizes, order, epochs = stream
    ours, ref = _build(sizes, order, s, epochs, drop_last, extra)
    assert ours.tolist() == [list(r) for r in ref]


def _tokens_between(sizes, doc_idx, a, b):
    """Tokens covered from row a to row b inclusive of b's offset, walking the stream."""
    cum = np.concatenate([[0], np.cumsum(np.asarray(sizes)[doc_idx])])
    return (cum[b[0]] + b[1]) - (cum[a[0]] + a[1])


@settings(max_examples=200, deadline=None)
@given(streams(), st.integers(1, 50), st.integers(0, 1))
def test_every_sample_spans_exactly_s_tokens(stream, s, extra):
    """Row k sits at stream position k*S, so each sample reads S + extra tokens; only the final
    sample of a kept partial stream is shorter (its end row is pinned to the last token)."""
    sizes, order, epochs = stream
    for drop_last in (True, False):
        ours, _ = _build(sizes, order, s, epochs, drop_last, extra)
        rows = ours.tolist()
        total = int(np.asarray(sizes)[order].sum())
        for k in range(1, len(rows)):
            span = _tokens_between(sizes, order, rows[k - 1], rows[k])
            if (k + 1 == len(rows) or k * s + extra > total) and not drop_last:
                assert span <= s
            else:
                assert span == s
            # the last token the sample needs lies inside the document its end row names
            if k * s + extra <= total:
                assert 0 <= rows[k][1] + extra - 1 < sizes[order[rows[k][0]]]


def test_chunked_pass_matches_single_pass(monkeypatch):
    """Force many document chunks: the carried offsets must give the same rows."""
    from tokenload.index import sample

    rng = np.random.default_rng(3)
    sizes = rng.integers(0, 50, size=500).astype(np.int32)
    order = rng.permutation(np.tile(np.arange(500, dtype=np.int32), 2))
    whole = {d: _build(sizes, order, 7, 2, d, 1)[0] for d in (True, False)}
    monkeypatch.setattr(sample, "_CHUNK", 13)
    for drop_last in (True, False):
        chunked, ref = _build(sizes, order, 7, 2, drop_last, 1)
        assert chunked.tolist() == [list(r) for r in ref]
        np.testing.assert_array_equal(chunked, whole[drop_last])
