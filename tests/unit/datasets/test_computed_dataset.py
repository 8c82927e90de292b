"""The computed order's datasets (issue 12): windows of Megatron's splits, the items of the
Megatron order, blends, lazy files, fingerprints, and the same global samples on any number of
ranks and workers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.datasets.computed.computed_dataset import (
    ComputedBlendedDataset,
    ComputedGPTDataset,
    build_computed_datasets,
)
from tokenload.datasets.items import build_items
from tokenload.errors import ConfigError
from tokenload.format import TokenFile
from tokenload.index.splits import split_matrix, split_ranges

EOD = 0
ALL_OPTIONS = dict(
    eod_mask_loss=True, reset_position_ids=True, reset_attention_mask=True, create_attention_mask=True,
)


def _documents(seed: int, count: int, vocab: int = 900) -> list[np.ndarray]:
    """Documents that end with EOD, as preprocess writes them (tokens 1..vocab-1 inside)."""
    rng = np.random.default_rng(seed)
    return [np.append(rng.integers(1, vocab, size=int(n)), EOD) for n in rng.integers(0, 60, size=count)]


@pytest.fixture
def files(tmp_path):
    """Three token files of EOD-terminated documents, and their documents."""
    out = {}
    for i, count in enumerate((300, 200, 120)):
        docs = _documents(i, count)
        out[write_documents(tmp_path / f"part{i}", docs)] = docs
    return out


def _config(blend, **kw) -> MegatronDataConfig:
    kw.setdefault("split", "90,8,2")
    return MegatronDataConfig(sequence_length=kw.pop("sequence_length", 16), blend=blend, eod_id=EOD, **kw)


def test_windows_are_the_split_stream_cut_every_s_tokens(files):
    prefix, docs = next(iter(files.items()))
    s = 16
    splits = build_computed_datasets(_config([prefix], sequence_length=s), [None, None, None])
    ranges = split_ranges(split_matrix("90,8,2"), len(docs))
    for ds, (begin, end) in zip(splits, ranges):
        assert isinstance(ds, ComputedGPTDataset)
        stream = np.concatenate(docs[begin:end])
        n = (stream.size - 1) // s
        assert ds.samples_per_epoch == n and len(ds) == n  # None: one epoch
        windows = ds.windows_of(np.arange(n))
        assert sorted(windows.tolist()) == list(range(n))  # every window once per epoch
        tokens = ds.read_batch(np.arange(n))["windows"]
        expected = stream[windows[:, None] * s + np.arange(s + 1)]
        np.testing.assert_array_equal(tokens, expected)


@pytest.mark.parametrize("add_extra_token", [True, False])
@pytest.mark.parametrize(
    "options", [{}, ALL_OPTIONS, dict(inter_document_masking=True, eod_mask_loss=True)], ids=["plain", "mask", "cu"]
)
def test_items_equal_the_megatron_orders_items_of_the_same_tokens_and_boundaries(files, options, add_extra_token):
    prefix = next(iter(files))
    cfg = _config([prefix], add_extra_token=add_extra_token, **options)
    ds = build_computed_datasets(cfg, [100, 10, 10])[0]
    idx = np.arange(0, len(ds), 7)
    got = ds.__getitems__(idx)
    # the Megatron order's read: the document pieces of each sample, back to back
    tf = TokenFile(prefix)
    seqs, first, lengths, offsets = ds.documents(idx)
    starts = np.zeros_like(lengths)
    starts[first] = offsets
    text = tf.read_pieces(seqs, starts, lengths).astype(np.int64).reshape(idx.size, -1)
    want = build_items(text, cfg.item_config(), padded=False)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    # every document boundary inside a sample (a piece's end) is a reset of the position ids
    ends = np.cumsum(lengths)
    sample_of = np.repeat(np.arange(idx.size), np.diff(np.append(first, lengths.size)))
    seq_len = cfg.sequence_length
    for piece in range(lengths.size):
        column = ends[piece] - first_token(ends, first, sample_of[piece])
        last_piece = piece + 1 == lengths.size or sample_of[piece + 1] != sample_of[piece]
        if cfg.reset_position_ids and not last_piece and column < seq_len:
            assert got["position_ids"][sample_of[piece], column] == 0


def first_token(ends: np.ndarray, first: np.ndarray, sample: int) -> int:
    """Flat token position where ``sample`` begins."""
    return 0 if first[sample] == 0 else int(ends[first[sample] - 1])


def test_mock_data_matches_the_mock_sources_tokens():
    cfg = MegatronDataConfig(sequence_length=64, vocab_size=1000, eod_id=999, inter_document_masking=True)
    train, valid, test = build_computed_datasets(cfg, [1000, 100, 100])
    assert all(isinstance(d, ComputedGPTDataset) for d in (train, valid, test))
    batch = train.read_batch(np.arange(50))["windows"]
    seqs, first, lengths, offsets = train.documents(np.arange(50))
    starts = np.zeros_like(lengths)
    starts[first] = offsets
    np.testing.assert_array_equal(batch.ravel(), train.source.read_pieces(seqs, starts, lengths))
    assert "cu_seqlens" in train[3]


def test_a_blend_draws_by_its_weights_and_labels_each_sample_with_its_source(files):
    prefixes = list(files)
    blend = ["30", prefixes[0], "50", prefixes[1], "20", prefixes[2]]
    train = build_computed_datasets(_config(blend), [1000, 50, 50])[0]
    assert isinstance(train, ComputedBlendedDataset) and len(train) == 1000
    batch = train.__getitems__(np.arange(1000))
    counts = np.cumsum(batch["dataset_id"][:, None] == np.arange(3)[None, :], axis=0)
    m = np.arange(1, 1001)[:, None]
    assert (np.abs(counts - m * np.array([0.3, 0.5, 0.2])) < 1 + 1e-9).all()
    # each row is the window of its source that the mixture names
    draws = train.mixture.draw(np.arange(1000))
    for d, member in enumerate(train.datasets):
        rows = draws.source == d
        np.testing.assert_array_equal(
            batch["tokens"][rows], member.read_windows(draws.window[rows])[:, :-1].astype(np.int64)
        )


def test_an_unweighted_blend_weighs_by_windows_and_holds_one_epoch_of_each(files):
    train = build_computed_datasets(_config(list(files)), [None, None, None])[0]
    windows = [m.samples_per_epoch for m in train.datasets]
    assert len(train) == sum(windows)
    ids = train.__getitems__(np.arange(len(train)))["dataset_id"]
    assert np.bincount(ids).tolist() == windows  # every window of every source once


def test_no_file_is_opened_until_a_sample_touches_it(files, tmp_path, monkeypatch):
    import tokenload.datasets.computed.extents as extents
    from tokenload.format.sequences import counts_of, write_sequences

    prefixes = list(files)
    sequences = tmp_path / "sequences.json"
    write_sequences(sequences, {p: counts_of(TokenFile(p)) for p in prefixes})
    offsets = []
    real = extents.os.pread
    monkeypatch.setattr(extents.os, "pread", lambda fd, n, off: offsets.append(off) or real(fd, n, off))
    for path in (None, str(sequences)):
        offsets.clear()
        blend = ["99", prefixes[0], "1", prefixes[1]]
        train = build_computed_datasets(_config(blend, sequences_path=path), [64, 8, 8])[0]
        assert (0 in offsets) == (path is None)  # with a sequences JSON no header is read
        assert all(m.source._state is None for m in train.datasets)  # nothing mapped by the build
        first = train.__getitems__([0])["dataset_id"][0]
        opened = [m.source._state is not None for m in train.datasets]
        assert opened == [d == first for d in range(2)]


def test_startup_reads_no_index_array_and_keeps_nothing_per_document(files, monkeypatch):
    prefix = next(iter(files))
    reads = []
    import tokenload.datasets.computed.extents as extents

    real = extents.os.pread
    monkeypatch.setattr(extents.os, "pread", lambda fd, n, off: reads.append(n) or real(fd, n, off))
    build_computed_datasets(_config([prefix]), [10, 10, 10])
    assert reads and max(reads) <= 4 * 1024 and sum(reads) <= 3 * (34 + 16 + 8 * 1024)


def test_fingerprints_follow_content_and_configuration_not_paths(files, tmp_path):
    import shutil

    prefix = next(iter(files))
    copy = tmp_path / "elsewhere"
    copy.mkdir()
    for ext in (".idx", ".bin"):
        shutil.copy(prefix + ext, copy / ("moved" + ext))
    a = build_computed_datasets(_config([prefix]), [10, 10, 10])[0]
    b = build_computed_datasets(_config([str(copy / "moved")]), [10, 10, 10])[0]
    assert a.fingerprint == b.fingerprint
    assert a.windows_of(np.arange(10)).tolist() == b.windows_of(np.arange(10)).tolist()
    other = write_documents(tmp_path / "other", _documents(99, 300))
    for changed in (
        build_computed_datasets(_config([other]), [10, 10, 10])[0],
        build_computed_datasets(_config([prefix], random_seed=5), [10, 10, 10])[0],
        build_computed_datasets(_config([prefix], eod_mask_loss=True), [10, 10, 10])[0],
        build_computed_datasets(_config([prefix]), [10, 10, 10], block_size=4)[0],
    ):
        assert changed.fingerprint != a.fingerprint
    assert a.fingerprint != build_datasets(_config([prefix], cache="off"), [10, 10, 10])[0].fingerprint


def test_block_mode_reads_runs_of_neighbouring_windows(files):
    prefix = next(iter(files))
    ds = build_computed_datasets(_config([prefix], sequence_length=4), [None, None, None], block_size=8)[0]
    windows = ds.windows_of(np.arange(len(ds)))
    assert sorted(windows.tolist()) == list(range(len(ds)))
    blocks = windows // 8
    assert all(np.unique(blocks[i : i + 8]).size <= 2 for i in range(0, len(ds) - 8, 8))


def test_errors_are_config_errors(files, tmp_path):
    prefix = next(iter(files))
    with pytest.raises(ConfigError, match="less than one sample"):
        build_computed_datasets(_config([prefix], sequence_length=100_000), [10, 10, 10])
    with pytest.raises(ConfigError, match="block_size"):
        build_computed_datasets(_config([prefix]), [10, 10, 10], block_size=0)
    ds = build_computed_datasets(_config([prefix]), [10, 10, 10])[0]
    with pytest.raises(IndexError):
        ds.read_batch([len(ds)])


def test_same_token_file_twice_in_a_blend_keeps_two_orders(files):
    prefix = next(iter(files))
    train = build_computed_datasets(_config(["1", prefix, "1", prefix]), [200, 10, 10])[0]
    assert len(set(train.sources)) == 2
    assert json.dumps(train.mixture_state(100))  # JSON-able


# -- global sample k on any number of ranks and workers ----------------------------------------------


@pytest.mark.parametrize("blended", [False, True])
def test_global_sample_k_is_the_same_on_1_3_and_8_ranks_and_any_worker_count(files, blended):
    import torch

    from tokenload.loader import build_dataloader

    prefixes = list(files)
    blend = ["2", prefixes[0], "1", prefixes[1], "1", prefixes[2]] if blended else [prefixes[0]]
    dataset = build_computed_datasets(_config(blend), [480, 24, 24])[0]
    total = len(dataset)  # a single file's split holds whole epochs (>= 480)
    whole = dataset.__getitems__(np.arange(total))["tokens"]
    micro = 2
    for ranks in (1, 3, 8):
        for workers in (0, 2) if ranks != 3 else (0, 1, 3):
            got = {}
            for rank in range(ranks):
                loader = build_dataloader(
                    dataset, micro_batch_size=micro, dp_rank=rank, dp_size=ranks, num_workers=workers,
                    multiprocessing_context="fork",
                )
                for step, batch in enumerate(loader):
                    base = step * micro * ranks + rank * micro  # the sampler's slice of step
                    for j, row in enumerate(batch["tokens"]):
                        got[base + j] = row
                loader.close()
            assert sorted(got) == list(range(len(got))) and len(got) == total - total % (micro * ranks)
            np.testing.assert_array_equal(torch.stack([got[k] for k in sorted(got)]).numpy(), whole[: len(got)])


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_a_weighted_blend_split_asked_for_no_sample_is_built_empty(files, tmp_path, packing):
    """A split of a blend member holding less than one sample is refused only when samples are
    asked of it: with size 0 (the doctor's valid and test, Megatron's --eval-iters 0) it is built
    empty, as the Megatron order builds it."""
    prefix = next(iter(files))
    tiny = write_documents(tmp_path / "tiny", [np.array([5, 6, EOD])] * 60)  # test split: 1 doc
    cfg = _config(["0.5", prefix, "0.5", tiny], split="90,8,2", packing=packing)
    train, valid, test = build_computed_datasets(cfg, [50, 0, 0])
    assert len(train) == 50 and len(valid) == 0 and len(test) == 0
    assert test.read_batch([])["windows"].shape[0] == 0
    if packing == "concat":
        with pytest.raises(ConfigError, match=r"the test split of .*tiny holds 3 tokens .*less than one sample"):
            build_computed_datasets(cfg, [50, 0, 4])
