"""The executors' one interface and the summaries they return as records: a marker's JSON reads
back as the record that wrote it, field for field, and anything else reads as no record."""

from __future__ import annotations

import json

import pytest

from tokenload.preprocess import PreprocessConfig, TokenizerSpec
from tokenload.preprocess.cluster import RayExecutor
from tokenload.preprocess.executor import Executor
from tokenload.preprocess.load import load_tokenizer
from tokenload.preprocess.pipeline import executor_for
from tokenload.preprocess.pool import LocalExecutor
from tokenload.preprocess.summaries import FileSummary, RangeSummary, Totals

COUNTS = dict(path="/d/a.jsonl", stamp="12:34", documents=3, tokens={"text": 7}, skipped={})


def _roundtrip(summary):
    return json.loads(json.dumps(summary.to_json(), sort_keys=True))


def test_a_local_files_marker_lists_no_parts_and_reads_back_the_same():
    summary = FileSummary(**COUNTS)
    assert _roundtrip(summary) == {**COUNTS}
    assert FileSummary.from_json(_roundtrip(summary)) == summary


def test_a_ray_files_marker_lists_its_parts_and_a_range_its_span_and_lines():
    ranged = FileSummary(**COUNTS, parts=("000001.00000", "000001.00001"))
    assert _roundtrip(ranged)["parts"] == ["000001.00000", "000001.00001"]
    assert FileSummary.from_json(_roundtrip(ranged)) == ranged
    span = RangeSummary(**COUNTS, span=(0, 4096), lines=17)
    assert _roundtrip(span) == {**COUNTS, "range": [0, 4096], "lines": 17}
    assert RangeSummary.from_json(_roundtrip(span)) == span


@pytest.mark.parametrize(
    "broken",
    [
        {},
        {**COUNTS, "documents": "3"},
        {**COUNTS, "tokens": [1, 2]},
        {**COUNTS, "path": None},
        {**COUNTS, "parts": "000001"},
    ],
)
def test_a_marker_that_is_not_a_summary_reads_as_none(broken):
    assert FileSummary.from_json(broken) is None
    if "parts" not in broken:  # a range lists no parts
        assert RangeSummary.from_json({**broken, "range": [0, 1], "lines": 0}) is None


def test_bad_records_count_every_reason_but_blank_lines():
    summary = FileSummary(**{**COUNTS, "skipped": {"blank_line": 5, "malformed_json": 2}})
    assert summary.bad_records == 2


def test_totals_sum_the_files_with_every_key():
    files = [FileSummary(**COUNTS), FileSummary(**{**COUNTS, "skipped": {"not_text": 1}})]
    assert Totals.of(files, ("text", "title")) == Totals(
        6, {"text": 14, "title": 0}, {"not_text": 1}
    )


def test_both_executors_share_one_interface():
    config = PreprocessConfig(
        inputs=("a",), output_prefix="x", tokenizer=TokenizerSpec(kind="byte")
    )
    tok = load_tokenizer(config.tokenizer)
    assert isinstance(executor_for(config, tok), LocalExecutor)
    ray = PreprocessConfig(
        inputs=("a",), output_prefix="x", tokenizer=TokenizerSpec(kind="byte"), executor="ray"
    )
    assert isinstance(executor_for(ray, tok), RayExecutor)
    assert issubclass(LocalExecutor, Executor) and issubclass(RayExecutor, Executor)
