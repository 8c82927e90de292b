"""An option given to an order that does not read it is a ``ConfigError`` naming the option and
the order, and saying what to do (issue 37); every order's own keywords keep working, and the
importers and adapters that fill a Megatron job's settings for every order pass only what the
chosen order reads.

The Megatron order's options are written here from the fields' documentation: the index caches'
folder (``path_to_cache``), the cache policy (``cache``: ``"off"`` is what the other orders do
anyway), the tokenizer identity in the caches' names (``tokenizer``) and what a blend does at a
resume under other weights (``mixture_change``: the computed order always continues and reads no
such option).
"""

from __future__ import annotations

import argparse
from typing import Any, ClassVar

import pytest

from tokenload.datasets import MegatronDataConfig
from tokenload.datasets.config import (
    ComputedOptions,
    ImportedConfig,
    MegatronOptions,
    NeoxOptions,
)
from tokenload.datasets.megatron_flags import megatron_config_from_args
from tokenload.errors import ConfigError

MEGATRON_ONLY: list[tuple[str, Any]] = [
    ("path_to_cache", "/data/index-cache"),
    ("cache", "strict"),
    ("tokenizer", {"class": "T", "vocab_size": "100"}),
    ("mixture_change", "continue"),
]
CASES = [(field, value, order) for field, value in MEGATRON_ONLY for order in ("computed", "neox")]


def _config(**kw: Any) -> MegatronDataConfig:
    return MegatronDataConfig(sequence_length=8, blend=["1", "a", "1", "b"], split="9,1,0", **kw)


@pytest.mark.parametrize(
    ("field", "value", "order"), CASES, ids=[f"{f}-{o}" for f, _, o in CASES]
)
def test_a_megatron_option_given_to_another_order_names_both_and_what_to_do(field, value, order):
    with pytest.raises(ConfigError) as info:
        _config(order=order, **{field: value})
    error = info.value
    assert error.field == field
    assert f"{field} applies to order='megatron' only, not {order!r}" in error.message
    assert repr(value) in error.message  # what was given
    assert error.hint is not None
    assert f"drop {field}" in error.hint and "order='megatron'" in error.hint


@pytest.mark.parametrize("order", ["computed", "neox"])
def test_what_the_other_orders_do_anyway_is_taken(order):
    # no index cache read or written, every rank building in memory: true of these orders
    assert _config(order=order, cache="off").order == order
    assert _config(order=order, build_policy="every-rank").order == order


def test_every_orders_own_keywords_keep_working():
    schedule = [(0, [1.0, 1.0]), (40, [1.0, 3.0])]
    megatron = _config(
        path_to_cache="/data/index-cache",
        cache="strict",
        tokenizer={"class": "T"},
        mixture_change="continue",
        build_policy="rank0",
        weights_schedule=schedule,
    ).typed()
    assert isinstance(megatron.order, MegatronOptions)
    assert (
        megatron.order.path_to_cache,
        megatron.order.cache,
        megatron.order.tokenizer,
        megatron.order.mixture_change,
        megatron.order.build_policy,
    ) == ("/data/index-cache", "strict", {"class": "T"}, "continue", "rank0")
    computed = _config(order="computed", block_size=4, weights_schedule=schedule).typed()
    assert isinstance(computed.order, ComputedOptions)
    assert computed.order.block_size == 4 and computed.order.schedule is not None
    neox = _config(
        order="neox", weight_by_num_documents=True, weighted_sampler_alpha=0.3, num_epochs=2
    ).typed()
    assert neox.order == NeoxOptions(
        weight_by_num_documents=True, weighted_sampler_alpha=0.3, num_epochs=2
    )


MEGATRON_ARGV = [
    "--data-path", "2", "/data/web", "--split", "90,10,0", "--seq-length", "8",
    "--global-batch-size", "4", "--micro-batch-size", "2", "--train-iters", "5",
    "--eval-iters", "1", "--eval-interval", "5", "--data-cache-path", "/data/index-cache",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--num-layers", "2",
]  # fmt: skip


def test_a_megatron_jobs_import_under_another_order_keeps_only_what_that_order_reads():
    imported = megatron_config_from_args(MEGATRON_ARGV, world_size=1)
    assert imported.fields["path_to_cache"] == "/data/index-cache"  # the job's own settings
    assert imported.fields["tokenizer"] is not None
    megatron = imported.config()
    assert megatron.path_to_cache == "/data/index-cache"
    assert megatron.tokenizer == imported.fields["tokenizer"]
    for order in ("computed", "neox"):
        other = ImportedConfig({**imported.fields, "order": order}, imported.sizes, {}).config()
        assert (other.order, other.path_to_cache, other.tokenizer) == (order, None, None)
        assert other.eod_id == megatron.eod_id  # what every order reads is kept


def test_the_megatron_adapter_under_the_computed_order_drops_the_jobs_fast_load(tmp_path):
    from tokenload.integrations.megatron import data_config_from_args

    args = _megatron_args(str(tmp_path))
    args.dataloader_defer_npy_index_mmap = True  # (the fast cache load refuses --data-path)
    computed = data_config_from_args(args, order="computed")
    assert (computed.order, computed.path_to_cache, computed.build_policy) == (
        "computed",
        None,
        "auto",
    )
    megatron = data_config_from_args(args)
    assert (megatron.path_to_cache, megatron.build_policy) == (str(tmp_path), "none")
    with pytest.raises(ConfigError, match="build_policy applies to order='megatron'"):
        data_config_from_args(args, order="computed", build_policy="none")


def _megatron_args(cache: str) -> argparse.Namespace:
    return argparse.Namespace(
        seq_length=16,
        seed=1234,
        data_path=["p"],
        data_args_path=None,
        train_data_path=None,
        valid_data_path=None,
        test_data_path=None,
        per_split_data_args_path=None,
        split="9,1,0",
        mock_data=False,
        data_cache_path=cache,
        mmap_bin_files=True,
        dataloader_fast_cache_load=False,
        dataloader_defer_npy_index_mmap=False,
        per_dataset_sequences_path=None,
        mid_level_dataset_surplus=0.005,
    )


class _Tokenizer:
    unique_identifiers: ClassVar[dict[str, Any]] = {"class": "NullTokenizer", "vocab_size": 100}
    eod = 99
    vocab_size = 100


def test_the_megatron_adapter_passes_the_jobs_cache_and_tokenizer_to_the_megatron_order_only():
    from tokenload.integrations.megatron import data_config_from_args

    args = _megatron_args("/data/index-cache")
    megatron = data_config_from_args(args, _Tokenizer())
    assert megatron.path_to_cache == "/data/index-cache"
    assert megatron.tokenizer == _Tokenizer.unique_identifiers
    computed = data_config_from_args(args, _Tokenizer(), order="computed")
    assert (computed.path_to_cache, computed.tokenizer, computed.eod_id) == (None, None, 99)
    # a keyword the user gives is never dropped: given to an order that does not read it, refused
    with pytest.raises(ConfigError, match="path_to_cache applies to order='megatron' only"):
        data_config_from_args(args, order="computed", path_to_cache="/elsewhere")
    with pytest.raises(ConfigError, match="mixture_change applies to order='megatron' only"):
        data_config_from_args(args, order="computed", mixture_change="continue")


def test_the_doctor_times_the_computed_order_without_the_megatron_orders_cache_folder():
    from tokenload.doctor.checks import _data_config
    from tokenload.doctor.report import DoctorConfig

    job = DoctorConfig(data_path=["p"], seq_length=16, data_cache_path="/data/index-cache")
    assert _data_config(job).path_to_cache == "/data/index-cache"
    computed = _data_config(job, order="computed", build_policy="auto")
    assert (computed.order, computed.path_to_cache) == ("computed", None)


@pytest.mark.parametrize(
    ("keyword", "said"),
    [
        ("seed", "did you mean random_seed?"),
        ("sequnce_length", "did you mean sequence_length"),
        ("zzz", "no such field"),
    ],
)
def test_a_keyword_that_is_no_field_is_a_config_error_naming_the_nearest(keyword, said):
    """A misspelt keyword (a new user's ``seed=``) is a ConfigError with the field meant, not
    Python's TypeError; the config still pickles and ``dataclasses.replace`` still works."""
    import dataclasses
    import pickle

    with pytest.raises(ConfigError, match=said):
        MegatronDataConfig(sequence_length=8, blend=["p"], split="1,0,0", **{keyword: 1})
    config = MegatronDataConfig(sequence_length=8, blend=["p"], split="1,0,0", random_seed=3)
    assert pickle.loads(pickle.dumps(config)) == config
    assert dataclasses.replace(config, random_seed=4).random_seed == 4
