"""Document boundaries with ``inter_document_masking`` equal megatron-core 0.19.2's on every
sample of the committed fixtures (tests/fixtures/megatron/boundaries, written by megatron-core
through make_boundaries.py): cu_seqlens, max_seqlen and the per-document position ids come from
the documents' lengths, not from EOD tokens, on files whose documents all end with EOD, none
does, and EOD ids sit inside documents; with empty documents, padded last validation samples,
with and without the extra token, and a blend."""

from __future__ import annotations

from megatron_boundaries import compare
from support import FIXTURES


def test_boundaries_equal_megatron_core(tmp_path):
    seen = compare(FIXTURES / "megatron" / "boundaries", tmp_path)
    # the fixtures hold the edge cases: proven, not assumed
    assert seen["samples"] > 1000
    assert seen["repeated_boundaries"] > 0  # zero-length documents inside a sample
    assert seen["padded"] > 0  # the last validation samples
    assert seen["first_document_of_one_token"] > 0  # e.g. starting at a document's last token
    assert seen["eod_rule_differs"] > 100  # where the EOD rule would have given other boundaries
