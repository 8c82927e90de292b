"""The sidecar-less Megatron-cache check in windows (issue 36, point 16): with windows and passes
a few documents and rows long, so that samples share a document across passes, span documents in
which no sample starts, and end a pass at every place, ``gpt_cache_mismatches`` says what a
sample-by-sample model of the index says (written here from Megatron's definition: sample k
starts at stream position min(k x S, end - extra), inside its document, positions never going
back) on caches built by tokenload's builder (one epoch and several, with and without
drop-last) and on each of them damaged once."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tokenload.datasets.megatron import cache_match
from tokenload.index.gpt import GPTIndexConfig, build_gpt_indices


def _model(lengths, documents, samples, sequence_length, extra):
    """Every (kind, sample) the index gets wrong, sample by sample; ``kind`` one of range,
    back, offset, position (range without a sample)."""
    starts = [0]
    for d in documents:
        starts.append(starts[-1] + int(lengths[d]))
    last = starts[-1] - extra
    wrong = set()
    for k, (p, o) in enumerate(samples.tolist()):
        if not 0 <= p < len(documents) or o < 0:
            wrong.add(("range", None))
            continue
        if k and p < samples[k - 1][0]:
            wrong.add(("back", k))
        if o > lengths[documents[p]]:
            wrong.add(("offset", k))
        elif starts[p] + o != (0 if k == 0 else min(k * sequence_length, last)):
            wrong.add(("position", k))
    return wrong


def _reported(reasons):
    if not reasons:
        return None
    (reason,) = reasons
    sample = re.search(r"sample (\d+)", reason)
    for kind, words in (("range", "outside the document index"), ("back", "earlier document"),
                        ("offset", "starts at offset"), ("position", "stream position")):
        if words in reason:
            return kind, (int(sample.group(1)) if kind != "range" else None)
    raise AssertionError(reason)


def _case(seed):
    rng = np.random.default_rng(seed)
    short = seed % 2 == 0  # documents shorter than a sample (gaps) or longer (shared documents)
    count = int(rng.integers(5, 60))
    lengths = rng.integers(1, 12 if short else 90, size=count + 7).astype(np.int32)
    begin = int(rng.integers(0, 7))
    sequence_length = int(rng.integers(5, 30)) if short else int(rng.integers(2, 9))
    config = GPTIndexConfig(sequence_length=sequence_length, random_seed=seed,
                            drop_last=bool(seed % 3), add_extra_token=bool(seed % 5))
    per_epoch = (int(lengths[begin : begin + count].sum()) - config.extra) // sequence_length
    num_samples = None if seed % 4 == 1 else int(per_epoch * rng.uniform(1, 3.5))
    idx = build_gpt_indices(lengths, np.arange(begin, begin + count), num_samples=num_samples,
                            config=config)
    arrays = {"document_index": idx.document_index, "sample_index": idx.sample_index,
              "shuffle_index": idx.shuffle_index}
    return rng, lengths, begin, begin + count, sequence_length, config.extra, arrays


def _damages(rng, arrays, lengths, begin, end):
    """One damage at a time: (name, arrays, lengths)."""
    samples = arrays["sample_index"]
    n = samples.shape[0]
    yield "none", arrays, lengths
    for _ in range(2):
        k = int(rng.integers(0, n))
        for name, column, delta in (("offset +1", 1, 1), ("offset -1", 1, -1),
                                    ("position +1", 0, 1), ("position -1", 0, -1)):
            changed = samples.copy()
            changed[k, column] += delta
            yield f"{name} at {k}", {**arrays, "sample_index": changed}, lengths
        if n > 2:
            swapped = samples.copy()
            swapped[[k, (k + 1) % n]] = swapped[[(k + 1) % n, k]]
            yield f"rows {k} and {k + 1} swapped", {**arrays, "sample_index": swapped}, lengths
        d = int(rng.integers(begin, end))  # a file rewritten with one length moved
        for delta in (1, -1):
            moved = lengths.copy()
            moved[d] = max(0, int(moved[d]) + delta)
            yield f"length of {d} {delta:+d}", arrays, moved


@pytest.mark.parametrize("window", [(1, 1), (2, 3), (5, 2), (64, 64)])
@pytest.mark.parametrize("seed", range(12))
def test_windows_say_what_the_sample_model_says(monkeypatch, seed, window):
    monkeypatch.setattr(cache_match, "_DOCS", window[0])
    monkeypatch.setattr(cache_match, "_ROWS", window[1])
    rng, lengths, begin, end, sequence_length, extra, arrays = _case(seed)
    for name, damaged, file_lengths in _damages(rng, arrays, lengths, begin, end):
        reasons = cache_match.gpt_cache_mismatches(damaged, file_lengths, begin, end,
                                                   sequence_length=sequence_length, extra=extra)
        wrong = _model(file_lengths, damaged["document_index"], damaged["sample_index"],
                       sequence_length, extra)
        if name == "none":
            assert reasons == [] and wrong == set()
        reported = _reported(reasons)
        assert (reported is None) == (not wrong), (name, reasons, sorted(wrong, key=str)[:5])
        assert reported is None or reported in wrong, (name, reasons, sorted(wrong, key=str)[:5])
