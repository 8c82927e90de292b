"""Straightforward pure-Python ports of Megatron's sequential index loops (spec §2.5-2.7, §3.4).

Written from the spec's description, one step at a time, deliberately without vectorization:
the tests compare tokenload's vectorized functions with these.
"""

from __future__ import annotations

import math
import sys

import numpy as np


def sample_index_loop(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch, drop_last, extra):
    """The C++ ``build_sample_idx`` walk, with float32 count when not dropping the last."""
    total = num_epochs * tokens_per_epoch - extra
    if drop_last:
        n = int(total / seq_length) if total < 0 else total // seq_length  # C truncation
    else:
        f = np.float32(np.int64(total)) / np.float32(seq_length)
        n = math.ceil(float(f))
    rows = [(0, 0)]
    i, off = 0, 0
    for _k in range(1, n + 1):
        rem = seq_length + extra
        while rem != 0:
            length = int(sizes[doc_idx[i]]) - off
            rem -= length
            if rem <= 0:
                off += rem + length - extra
                rem = 0
            else:
                if i == len(doc_idx) - 1:
                    off = int(sizes[doc_idx[i]]) - extra
                    break
                i += 1
                off = 0
        rows.append((i, off))
    return rows


def document_index_mgrid(documents, num_epochs, rng, separate):
    """Megatron's document index, built with its mgrid construction."""
    if not separate or num_epochs == 1:
        d = np.mgrid[0:num_epochs, 0 : len(documents)][1]
        d[:] = documents
        d = d.reshape(-1).astype(np.int32)
        rng.shuffle(d)
        return d
    first = document_index_mgrid(documents, num_epochs - 1, rng, False)
    last = document_index_mgrid(documents, 1, rng, False)
    return np.concatenate((first, last))


def shuffle_index_concat(num_samples, total_size, rng):
    """Megatron's shuffle index, built with two aranges and a concatenation."""
    dt = np.int64 if total_size >= np.iinfo(np.uint32).max - 1 else np.uint32
    a = np.arange(0, num_samples, dtype=dt)
    rng.shuffle(a)
    if num_samples == total_size:
        return a
    b = np.arange(num_samples, total_size, dtype=dt)
    rng.shuffle(b)
    return np.concatenate((a, b))


def num_epochs_loop(tokens_per_epoch, num_samples, seq_length, extra):
    """Megatron's epoch loop (callers must not pass an empty split with samples)."""
    if num_samples is None:
        return 1
    epochs, tokens = 1, tokens_per_epoch
    while tokens < num_samples * seq_length + extra:
        epochs += 1
        tokens += tokens_per_epoch
    return epochs


def blending_loop(weights, size):
    """The C++ greedy ``build_blending_indices``."""
    cur = [0] * len(weights)
    di, dsi = [], []
    for k in range(size):
        kd = max(float(k), 1.0)
        best, best_err = 0, weights[0] * kd - float(cur[0])
        for d in range(1, len(weights)):
            err = weights[d] * kd - float(cur[d])
            if err > best_err:
                best, best_err = d, err
        di.append(best)
        dsi.append(cur[best])
        cur[best] += 1
    return np.array(di, dtype=np.int16), np.array(dsi, dtype=np.int64)


def exhaustive_loop(sizes):
    """The C++ ``build_exhaustive_blending_indices``."""
    total = sum(sizes)
    weights = [float(s) / float(total) for s in sizes]
    cur = [0] * len(sizes)
    active = list(range(len(sizes)))
    di, dsi = [], []
    k = 0
    while active:
        kd = max(float(k), 1.0)
        best, best_err = 0, -sys.float_info.max
        for d in active:
            err = weights[d] * kd - float(cur[d])
            if err > best_err:
                best, best_err = d, err
        di.append(best)
        dsi.append(cur[best])
        cur[best] += 1
        if cur[best] == sizes[best]:
            active.remove(best)
        k += 1
    return np.array(di, dtype=np.int16), np.array(dsi, dtype=np.int64)


def assert_same_blend(ours, ref):
    """Both blending arrays equal the reference's, with Megatron's dtypes (int16, int64)."""
    assert ours[0].dtype == np.int16 and ours[1].dtype == np.int64
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[1], ref[1])
