"""tokenload.integrations.megatron without Megatron: the mapping of Megatron's parsed ``args``,
the refusals, the iterator Megatron calls ``next()`` on, and the metrics it writes. The same
code against megatron-core's own functions: ``test_megatron_training.py``."""

from __future__ import annotations

import argparse
import math
from typing import ClassVar

import numpy as np
import pytest

from support import write_documents
from tokenload.errors import ConfigError
from tokenload.integrations.megatron import (
    data_config_from_args,
    loaders_from_args,
    metric_scalars,
)

EOD = 99


def megatron_args(**changes) -> argparse.Namespace:
    """The attributes of Megatron's ``args`` the adapter reads, at Megatron's defaults."""
    values = dict(
        seq_length=16, seed=1234, data_path=None, data_args_path=None, train_data_path=None,
        valid_data_path=None, test_data_path=None, per_split_data_args_path=None, split=None,
        mock_data=False, data_cache_path=None, mmap_bin_files=True, eod_mask_loss=False,
        reset_position_ids=False, reset_attention_mask=False,
        create_attention_mask_in_dataloader=True, dataloader_inter_document_masking=False,
        dataloader_fast_cache_load=False, dataloader_defer_npy_index_mmap=False,
        per_dataset_sequences_path=None, mid_level_dataset_surplus=0.005, num_workers=0,
        micro_batch_size=2, global_batch_size=4, consumed_train_samples=0,
        consumed_valid_samples=0, data_sharding=True, tensorboard_log_interval=1,
        dataloader_type="external",
    )
    values.update(changes)
    return argparse.Namespace(**values)


class Tokenizer:
    """Megatron's tokenizer as the adapter sees it (its ``pad`` raises when there is none)."""

    unique_identifiers: ClassVar[dict[str, str]] = {"class": "my.Tokenizer", "tokenizer_path": "/t"}
    eod = EOD
    vocab_size = 100

    @property
    def pad(self):
        raise NotImplementedError("no pad token")


@pytest.fixture
def prefixes(tmp_path):
    rng = np.random.default_rng(0)
    out = []
    for name in ("a", "b"):
        docs = [np.append(rng.integers(0, EOD, int(rng.integers(3, 40))), EOD) for _ in range(40)]
        out.append(write_documents(tmp_path / name, docs))
    return out


@pytest.mark.parametrize(("changes", "match"), [
    ({"data_cache_path": "CACHE"}, "--dataloader-fast-cache-load and --data-path cannot be used together"),
    ({}, "--dataloader-fast-cache-load needs --data-cache-path"),
])
def test_the_fast_cache_load_is_checked_alike_by_the_provider_the_importer_and_prepare_cache(
        prefixes, tmp_path, changes, match):
    """megatron-core's BlendedMegatronDatasetConfig refuses the fast cache load with --data-path,
    and without --data-cache-path: the provider took both (the second with Megatron's folder
    beside each file), the importer refused them, prepare-cache took them (a new user's finding).
    All three refuse them now, in the same words."""
    from support import run_cli
    from tokenload.datasets.megatron_flags import megatron_config_from_args
    from tokenload.errors import ConfigError

    cache = str(tmp_path / "cache")
    values = {k: cache if v == "CACHE" else v for k, v in changes.items()}
    args = megatron_args(data_path=[prefixes[0]], split="90,8,2", dataloader_fast_cache_load=True, **values)
    with pytest.raises(ConfigError, match=match):
        data_config_from_args(args, Tokenizer())
    argv = ["--data-path", prefixes[0], "--split", "90,8,2", "--seq-length", "16", "--global-batch-size", "4",
            "--train-iters", "3", "--eval-iters", "1", "--eval-interval", "2", "--dataloader-fast-cache-load",
            *(["--data-cache-path", cache] if values else [])]
    with pytest.raises(ConfigError, match=match):
        megatron_config_from_args(argv, world_size=1)
    done = run_cli("prepare-cache", *argv)
    assert done.returncode == 2 and match.split(" (")[0] in done.stderr, done.stderr


def test_args_map_onto_the_config(prefixes, tmp_path):
    args = megatron_args(data_path=["30", prefixes[0], "70", prefixes[1]], split="90,8,2",
                         data_cache_path=str(tmp_path / "cache"), mmap_bin_files=False,
                         create_attention_mask_in_dataloader=False, eod_mask_loss=True,
                         dataloader_defer_npy_index_mmap=True, seed=7)
    config = data_config_from_args(args, Tokenizer())
    assert tuple(config.blend.weights) == (30.0, 70.0) and config.split == "90,8,2"
    assert (config.read_mode, config.build_policy, config.random_seed) == ("pread", "none", 7)
    assert not config.create_attention_mask and config.eod_mask_loss
    assert config.path_to_cache == str(tmp_path / "cache")
    assert (config.eod_id, config.pad_id, config.vocab_size) == (EOD, -1, 100)
    assert dict(config.tokenizer) == Tokenizer.unique_identifiers
    per_split = megatron_args(train_data_path=[prefixes[0]], valid_data_path=[prefixes[1]])
    assert data_config_from_args(per_split).blend_per_split[2] is None
    assert data_config_from_args(megatron_args(data_path=[prefixes[0]])).split == "969, 30, 1"
    mock = data_config_from_args(megatron_args(mock_data=True), Tokenizer())
    assert mock.mock and mock.vocab_size == 100


@pytest.mark.parametrize("name,flag", [
    ("sft", "--sft"), ("fim_data", "--fim-data"), ("full_validation", "--full-validation"),
    ("multiple_validation_sets", "--multiple-validation-sets"),
    ("hybrid_context_parallel", "--hybrid-context-parallel"),
    ("phase_transition_iterations", "--phase-transition-iterations"),
])
def test_unsupported_flags_are_refused_by_name(prefixes, name, flag):
    args = megatron_args(data_path=[prefixes[0]], **{name: [5] if "phase" in name else True})
    with pytest.raises(ConfigError, match=flag):
        data_config_from_args(args)


def test_no_data_is_a_config_error():
    with pytest.raises(ConfigError, match="--data-path"):
        data_config_from_args(megatron_args())


def _loaders(prefixes, kind, **changes):
    args = megatron_args(data_path=[prefixes[0]], split="90,8,2", **changes)
    return loaders_from_args(args, [40, 8, 4], tokenizer=Tokenizer(), dp_rank=0, dp_size=1,
                             kind=kind)


def test_single_ends_where_the_order_ends_and_cyclic_goes_on(prefixes):
    train, _valid, _test = _loaders(prefixes, "single", consumed_train_samples=8)
    left = len(train.loader)
    assert left == (len(train.loader.dataset) - 8) // 2
    batches = list(train)  # Megatron's iterator: next() until StopIteration
    assert len(batches) == left and set(batches[0]) >= {"tokens", "labels", "loss_mask",
                                                         "position_ids", "attention_mask"}
    assert train.loader.consumed_samples == 8 + 2 * left
    cyclic, _, _ = _loaders(prefixes, "cyclic")
    epoch = len(cyclic.loader)
    seen = [next(cyclic)["tokens"] for _ in range(epoch + 3)]  # into the second epoch
    assert cyclic.loader.consumed_samples == 2 * (epoch + 3)
    assert len(seen) == epoch + 3


def test_valid_starts_at_consumed_valid_samples(prefixes):
    _, valid, _ = _loaders(prefixes, "single", consumed_valid_samples=4)
    _, fresh, _ = _loaders(prefixes, "single")
    for _ in range(2):
        next(fresh)
    assert np.array_equal(next(valid)["tokens"], next(fresh)["tokens"])
    # --skip-train (evaluation only): Megatron evaluates from sample 0, whatever was consumed
    _, skip, _ = _loaders(prefixes, "single", consumed_valid_samples=4, skip_train=True)
    _, first, _ = _loaders(prefixes, "single")
    assert np.array_equal(next(skip)["tokens"], next(first)["tokens"])


class Writer:
    """Records what Megatron's TensorBoard writer (``add_scalar``) would receive."""

    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))


def test_train_metrics_go_to_megatrons_writers_at_each_log_interval(prefixes):
    writer = Writer()
    args = megatron_args(data_path=["1", prefixes[0], "1", prefixes[1]], split="90,8,2",
                         tensorboard_log_interval=2, consumed_train_samples=4)
    train, _, _ = loaders_from_args(args, [40, 8, 4], tokenizer=Tokenizer(), dp_rank=0,
                                    dp_size=1, writers=lambda: (writer, None))
    for _ in range(8):  # micro-batches of 2, global batch 4: from consumed 4 to 20
        next(train)
    steps = sorted({step for _, _, step in writer.scalars})
    assert steps == [2, 4]  # iterations 2 to 5 completed, written at the even ones
    values = {tag: value for tag, value, step in writer.scalars if step == 4}
    assert values["tokenload/consumed-samples"] == 16
    assert values["tokenload/samples"] == 12  # served by this loader since it started
    sources = [v for t, v in values.items() if t.startswith("tokenload/source/")
               and t.endswith("/samples")]
    assert len(sources) == 2 and sum(sources) == 12


def test_train_metrics_under_a_batch_schedule_are_written_at_megatrons_iterations(prefixes):
    """Under --step-batch-size-schedule megatron-core sets args.global_batch_size to micro x
    dp (2 here) and takes each step's batch in micro-batches ('0:4 160:8' at --seq-length 16:
    4 samples a step, 8 once 10 samples are received). The metrics are written once per
    iteration, at its number (not once per micro-batch)."""
    from tokenload.megatron_args import StepBatchSchedule

    writer = Writer()
    text = "0:4 160:8"
    args = megatron_args(data_path=["1", prefixes[0], "1", prefixes[1]], split="90,8,2",
                         global_batch_size=2, step_batch_size_schedule=text)
    train, _, _ = loaders_from_args(args, [80, 8, 4], tokenizer=Tokenizer(), dp_rank=0,
                                    dp_size=1, writers=lambda: (writer, None))
    schedule = StepBatchSchedule.parse(text, 16)
    consumed = 0
    for _ in range(7):  # Megatron's loop: the step's batch in micro-batches of 2
        batch = schedule.batch_at(consumed)
        for _ in range(batch // 2):
            next(train)
        consumed += batch
    assert [schedule.batch_of_step(k) for k in range(7)] == [4, 4, 4, 8, 8, 8, 8]
    assert sorted({step for _, _, step in writer.scalars}) == list(range(1, 8))
    values = {tag: value for tag, value, step in writer.scalars if step == 5}
    assert values["tokenload/consumed-samples"] == schedule.consumed_samples(5) == 28


def test_metric_scalars_are_finite_numbers():
    m = {"samples": 10, "tokens": 160, "active_s": 2.0, "consumed_samples": 40, "epoch": 0,
         "bytes_read": 320, "repeating": ["x"],
         "data_wait": {"share": None, "mean_s": 0.5, "p99_s": float("nan"), "max_s": 1.0},
         "sources": [{"name": "x", "samples": 10, "tokens": 160, "epoch": 0}]}
    out = metric_scalars(m)
    assert out["tokenload/samples-per-s"] == 5.0 and out["tokenload/tokens-per-s"] == 80.0
    assert out["tokenload/data-wait-mean-ms"] == 500.0
    assert "tokenload/data-wait-share" not in out and "tokenload/data-wait-p99-ms" not in out
    assert out["tokenload/source/x/tokens"] == 160 and out["tokenload/repeating-sources"] == 1
    assert all(isinstance(v, float) and math.isfinite(v) for v in out.values())


def test_tokenload_packing_flag_makes_rows_of_whole_documents(prefixes):
    from tokenload.integrations.megatron import add_arguments

    parsed = add_arguments(argparse.ArgumentParser()).parse_args(["--tokenload-packing", "best-fit"])
    assert parsed.tokenload_packing == "best-fit"
    default = add_arguments(argparse.ArgumentParser()).parse_args([])
    assert default.tokenload_packing is None  # concat: the flag not given
    assert data_config_from_args(megatron_args(data_path=[prefixes[0]], tokenload_packing=None)).packing == "concat"
    args = megatron_args(data_path=[prefixes[0]], split="100,0,0", tokenload_packing="best-fit")
    config = data_config_from_args(args, Tokenizer())
    assert config.packing == "best-fit"
    assert data_config_from_args(megatron_args(data_path=[prefixes[0]]), Tokenizer()).packing == "concat"


def test_an_evaluation_split_of_no_sample_gets_no_loader(prefixes):
    """--eval-iters 0 with a weighted blend: valid and test are built for 0 samples; they get no
    loader (Megatron then runs no evaluation), where the loader used to refuse them with "the
    dataset has 0 samples"."""
    args = megatron_args(data_path=["30", prefixes[0], "70", prefixes[1]], split="90,8,2")
    train, valid, test = loaders_from_args(args, [40, 0, 0], tokenizer=Tokenizer(), dp_rank=0, dp_size=1)
    assert train is not None and len(train.loader.dataset) >= 40
    assert valid is None and test is None
    from tokenload.datasets import build_datasets
    from tokenload.loader import build_dataloader

    empty = build_datasets(data_config_from_args(args, Tokenizer()), [40, 0, 0])[1]
    with pytest.raises(ConfigError, match="0 samples; a loader needs at least one") as info:
        build_dataloader(empty, micro_batch_size=2, num_workers=0)
    assert "needs no loader" in str(info.value)


def test_a_tokenizers_numpy_ids_are_its_ids(prefixes):
    """A tokenizer whose eod, pad and vocabulary size are NumPy ints: the same config as with
    Python ints (they were dropped as no id: pad -1, no EOD: a red-team finding)."""

    class NumpyTokenizer(Tokenizer):
        eod = np.int64(EOD)
        vocab_size = np.uint32(100)
        pad = np.int64(5)

    class IntTokenizer(Tokenizer):
        pad = 5

    args = megatron_args(data_path=[prefixes[0]], split="90,8,2")
    got, want = data_config_from_args(args, NumpyTokenizer()), data_config_from_args(args, IntTokenizer())
    assert (got.eod_id, got.pad_id, got.vocab_size) == (want.eod_id, want.pad_id, want.vocab_size) == (EOD, 5, 100)
    assert type(got.eod_id) is int and got == want


def test_the_fast_cache_load_refuses_a_data_args_path_blend_as_megatron_does(prefixes, tmp_path):
    """``--data-args-path`` gives megatron-core's blend as ``--data-path`` does, and its fast
    cache load asserts there is none (a red-team finding: it was taken)."""
    from tokenload.errors import ConfigError

    path = tmp_path / "blend.txt"
    path.write_text(f"1 {prefixes[0]}\n")
    args = megatron_args(data_args_path=str(path), split="90,8,2", dataloader_fast_cache_load=True,
                         data_cache_path=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="--dataloader-fast-cache-load and --data-args-path cannot be used"):
        data_config_from_args(args, Tokenizer())
