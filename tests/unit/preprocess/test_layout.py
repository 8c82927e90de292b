"""The vectorized document layout equals Megatron-LM's preprocess_data.py rule applied document by
document: zero-token sequences dropped, EOD appended to the last sequence of a non-empty
document only, an empty document kept with zero sequences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenload.errors import ConfigError
from tokenload.format import TokenFile, TokenFileWriter
from tokenload.preprocess.encode import layout_documents
from tokenload.preprocess.parts import write_documents

EOD = 999

# a document: either one text (an int: its token count) or a list of sentences (token counts)
documents = st.lists(
    st.one_of(st.integers(0, 6), st.lists(st.integers(0, 4), max_size=4)), max_size=25
)


def megatron_rule(docs, ids_of, eod):
    """preprocess_data.py's Encoder.encode + add_document, one document at a time."""
    out = []
    for doc in docs:
        sentences = doc if isinstance(doc, list) else [doc]
        doc_ids, lens = [], []
        for n in sentences:
            sentence = ids_of(n)
            if len(sentence) > 0:
                doc_ids.extend(sentence)
                lens.append(len(sentence))
        if doc_ids and eod is not None:
            doc_ids.append(eod)
            lens[-1] += 1
        out.append((doc_ids, lens))
    return out


def encoded_inputs(docs):
    """Flat ids, per-text lengths and owners, as the tokenizer + pipeline produce them."""
    counter = iter(range(10**6))
    texts, owners = [], []
    for d, doc in enumerate(docs):
        for n in doc if isinstance(doc, list) else [doc]:
            texts.append([next(counter) % 500 for _ in range(n)])
            owners.append(d)
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    flat = np.array([i for t in texts for i in t], dtype=np.int64)
    return texts, flat, lengths, np.array(owners, dtype=np.int64)


@settings(max_examples=150, deadline=None)
@given(docs=documents, append_eod=st.booleans())
def test_layout_equals_megatron_rule(docs, append_eod):
    texts, flat, lengths, owners = encoded_inputs(docs)
    it = iter(texts)
    expected = megatron_rule(docs, lambda n: next(it), EOD if append_eod else None)
    tokens, seq_lengths, per_doc = layout_documents(
        flat, lengths, owners, len(docs), EOD if append_eod else None, np.dtype(np.uint16)
    )
    assert tokens.dtype == np.uint16 and seq_lengths.dtype == np.int32
    seq_bounds = np.concatenate(([0], np.cumsum(per_doc)))
    tok_bounds = np.concatenate(([0], np.cumsum(seq_lengths)))
    got = []
    for d in range(len(docs)):
        s0, s1 = seq_bounds[d], seq_bounds[d + 1]
        got.append((tokens[tok_bounds[s0] : tok_bounds[s1]].tolist(), seq_lengths[s0:s1].tolist()))
    assert got == expected


@settings(max_examples=60, deadline=None)
@given(docs=documents)
def test_write_documents_equals_add_document_loop(tmp_path_factory, docs):
    folder = tmp_path_factory.mktemp("w")
    texts, flat, lengths, owners = encoded_inputs(docs)
    tokens, seq_lengths, per_doc = layout_documents(
        flat, lengths, owners, len(docs), EOD, np.dtype(np.uint16)
    )
    with TokenFileWriter(folder / "fast", np.uint16) as w:
        write_documents(w, tokens, seq_lengths, per_doc)
    it = iter(texts)
    with TokenFileWriter(folder / "slow", np.uint16) as w:
        for doc_ids, lens in megatron_rule(docs, lambda n: next(it), EOD):
            w.add_document(np.array(doc_ids, dtype=np.int64), lens)
    for ext in (".bin", ".idx"):
        assert (folder / f"fast{ext}").read_bytes() == (folder / f"slow{ext}").read_bytes()
    assert TokenFile(str(folder / "fast")).num_documents == len(docs)


def test_byte_ids_with_eod_256_are_widened_not_wrapped():
    flat = np.frombuffer(b"ab", dtype=np.uint8)
    tokens, seq_lengths, per_doc = layout_documents(
        flat, np.array([2, 0]), None, 2, 256, np.dtype(np.uint16)
    )
    assert (
        tokens.tolist() == [97, 98, 256]
        and seq_lengths.tolist() == [3]
        and per_doc.tolist() == [1, 0]
    )


def test_ids_beyond_the_dtype_are_refused():
    with pytest.raises(ConfigError, match="does not fit the output dtype uint16"):
        layout_documents(np.array([70000]), np.array([1]), None, 1, None, np.dtype(np.uint16))
