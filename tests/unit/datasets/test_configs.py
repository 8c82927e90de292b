"""The config importers on configs as users have them: GPT-NeoX's own example YAML files and
Megatron-LM's own example training scripts (tests/fixtures/configs/, unmodified).

Megatron's scripts are run with bash as published; a ``torchrun`` stand-in first on PATH records
the command line, and the flags after ``pretrain_gpt.py`` go to the importer.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess

import numpy as np
import pytest

from support import FIXTURES, write_documents
from tokenload.datasets import build_datasets
from tokenload.datasets.config import ImportedConfig
from tokenload.datasets.megatron_flags import megatron_config_from_args
from tokenload.datasets.neox.neox_yaml import neox_config_from_yaml
from tokenload.errors import ConfigError
from tokenload.index import Blend

CONFIGS = FIXTURES / "configs"
NEOX = CONFIGS / "neox"
SCRIPTS = CONFIGS / "megatron"


# -- Megatron's example scripts -------------------------------------------------------------------
def script_argv(tmp_path, script: str, *positional: str) -> list[str]:
    """Megatron's flags as the published script passes them to pretrain_gpt.py."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "torchrun"
    stub.write_text('#!/bin/sh\nprintf "%s\\0" "$@" > "$ARGV_OUT"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "pretrain_gpt.py").touch()  # the llama script checks it exists
    out = tmp_path / "argv"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ARGV_OUT=str(out))
    for name in ("WANDB_API_KEY", "MASTER_ADDR", "MASTER_PORT", "SLURM_NNODES", "RANK"):
        env.pop(name, None)
    subprocess.run(["bash", str(SCRIPTS / script), *positional], cwd=tmp_path, env=env,
                   check=True, capture_output=True, timeout=60)
    argv = out.read_bytes().decode().split("\0")[:-1]
    return argv[argv.index("pretrain_gpt.py") + 1:]


def test_mixtral_script(tmp_path):
    script = "train_mixtral_8x7b_distributed.sh"
    argv = script_argv(tmp_path, script, "ckpt", "tok.model", "/d/pile")
    got = megatron_config_from_args(argv, world_size=64)  # pipeline 4: 16 data-parallel ranks
    f = got.fields
    assert f["blend"] == Blend(prefixes=("/d/pile",)) and f["blend_per_split"] is None
    assert (f["split"], f["sequence_length"], f["random_seed"]) == ("99990,8,2", 4096, 1234)
    assert f["create_attention_mask"] is True  # Megatron's default, no --no-create-... flag
    assert f["path_to_cache"] is None and "build_policy" not in f and "read_mode" not in f
    assert "tokenizer" not in f and "eod_id" not in f  # Llama2Tokenizer: nothing derived
    # train 500000 x 256; valid (500000 // 1000 + 1) x 10 x 256; test 10 x 256
    assert got.sizes == [128_000_000, 1_282_560, 2_560]
    assert got.extras["global_batch_size"] == 256 and got.extras["data_parallel_size"] == 16
    assert got.extras["tokenizer"] == {"tokenizer_type": "Llama2Tokenizer",
                                       "tokenizer_model": "tok.model"}
    assert got.config().sequence_length == 4096


def test_llama3_script_with_mock_data(tmp_path):
    argv = script_argv(tmp_path, "train_llama3_8b_h100_fp8.sh")  # MOCK by default
    got = megatron_config_from_args(argv, world_size=8)
    f = got.fields
    assert "blend" not in f and "blend_per_split" not in f
    assert (f["vocab_size"], f["eod_id"], f["pad_id"]) == (128256, 128255, -1)
    assert f["tokenizer"]["vocab_size"] == "128256"
    assert f["split"] == "'99,1,0'"  # the quotes reach Megatron; its split regex skips them
    assert f["read_mode"] == "pread" and f["create_attention_mask"] is False
    assert f["path_to_cache"].endswith("benchmark_cache_llama3_8b_fp8")
    iters = 1_953_125_000 // 128
    assert got.sizes == [1_953_125_000, (iters // 100 + 1) * 32 * 128, 32 * 128]
    assert got.extras["num_workers"] == 1 and got.extras["tokenizer"]["tiktoken_pattern"] == "v2"
    cfg = got.config()
    assert cfg.mock and cfg.eod_id == 128255


def test_llama3_script_with_data_needs_the_eod_only_for_eod_flags(tmp_path):
    script = "train_llama3_8b_h100_fp8.sh"
    argv = script_argv(tmp_path, script, "ckpt", "tb", "meta/llama3", "/d/web")
    got = megatron_config_from_args(argv, world_size=8)
    assert got.fields["blend"] == Blend(prefixes=("/d/web",))
    assert got.extras["tokenizer"]["tokenizer_type"] == "HuggingFaceTokenizer"
    with pytest.raises(ConfigError, match="--eod-mask-loss needs the tokenizer's end-of-document"):
        megatron_config_from_args([*argv, "--eod-mask-loss"], world_size=8)
    masked = megatron_config_from_args([*argv, "--eod-mask-loss"], world_size=8, eod_id=128001)
    assert masked.fields["eod_mask_loss"] and masked.fields["eod_id"] == 128001


def test_gpt3_175b_script_is_refused_naming_the_schedule_as_megatron_refuses_it(tmp_path):
    """The published script expands its schedule unquoted: bash splits it, and megatron-core
    0.19.2's parser exits on "unrecognized arguments: 2.4B:320 ..."; quoted, it pairs the
    schedule with --global-batch-size, which megatron-core's validate_args refuses (ValueError).
    Quoted and without --global-batch-size it imports with megatron-core's counts: train = iters
    x micro x dp (12), the schedule's steps from 2.4B tokens = 1,171,875 samples of 2048 tokens."""
    argv = script_argv(tmp_path, "train_gpt3_175b_distributed.sh", "ckpt", "tb", "vocab.json",
                       "merges.txt", "/d/pile")
    with pytest.raises(ConfigError, match=r"unrecognized argument '2\.4B:320' after"
                                          " --step-batch-size-schedule") as caught:
        megatron_config_from_args(argv, world_size=1536)
    assert "quote" in caught.value.hint
    at = argv.index("--step-batch-size-schedule") + 1
    quoted = [*argv[:at], " ".join(argv[at:at + 6]), *argv[at + 6:]]
    with pytest.raises(ConfigError, match="--step-batch-size-schedule and --global-batch-size"):
        megatron_config_from_args(quoted, world_size=1536)
    at = quoted.index("--global-batch-size")
    got = megatron_config_from_args([*quoted[:at], *quoted[at + 2:]], world_size=1536)
    assert got.fields["split"] == "949,50,1" and got.sizes == [6_000_000, 60_120, 120]
    schedule = got.extras["step_batch_size_schedule"]
    assert schedule.steps == ((0, 16), (1_171_875, 320), (2_343_750, 624), (3_515_625, 928),
                              (4_687_500, 1232), (5_859_375, 1536))
    assert schedule.consumed_samples(100_000) == 35_046_688  # megatron-core's loop
    assert got.extras["tokenizer"] == {"vocab_file": "vocab.json", "merge_file": "merges.txt"}


@pytest.mark.parametrize(("argv", "stray"), [
    (["--seq-length", "8", "9"], "'9' after --seq-length"),
    (["--eod-mask-loss", "yes"], "'yes' after --eod-mask-loss"),
    (["--seed=3", "4"], "'4' after --seed"),
    (["--rampup-batch-size", "1", "2", "3", "4"], "'4' after --rampup-batch-size"),
])
def test_a_value_after_a_known_flags_values_is_refused_as_megatron_refuses_it(argv, stray):
    base = ["--data-path", "p", "--global-batch-size", "4", "--train-iters", "3",
            "--eval-interval", "2", "--num-layers", "2"]
    assert megatron_config_from_args([*base, "--seq-length", "8"], world_size=1).sizes[0] == 12
    with pytest.raises(ConfigError, match=f"unrecognized argument {stray}"):
        megatron_config_from_args([*base, "--seq-length", "8", *argv], world_size=1)


def test_no_eval_interval_is_refused_with_a_hint_that_works():
    """Megatron sizes the valid split from --eval-interval and fails without it (unless
    --skip-train, which is evaluation only): the hint says so and that a job that never evaluates
    passes --eval-iters 0 with any --eval-interval, which then gives an empty valid split (it
    once suggested --skip-train for that: a new user's finding)."""
    base = ["--data-path", "p", "--global-batch-size", "4", "--train-iters", "3", "--seq-length", "8"]
    with pytest.raises(ConfigError, match="no --eval-interval") as info:
        megatron_config_from_args([*base, "--eval-iters", "0"], world_size=1)
    assert "--eval-iters 0 with any --eval-interval" in info.value.hint
    assert "evaluation only" in info.value.hint
    sizes = megatron_config_from_args([*base, "--eval-iters", "0", "--eval-interval", "7"], world_size=1).sizes
    assert sizes[0] == 12 and sizes[1] == 0


NON_DATA_CASES = json.loads((FIXTURES / "megatron" / "non_data_flags.json").read_text())["cases"]


def test_non_data_flags_take_the_values_megatron_core_s_parser_takes():
    """A job's non-data flags (model, optimizer, logging, tokenizer options) pass through, each
    with as many values as megatron-core 0.19.2's parser gives it: a switch (``--bf16``) none,
    ``--lr`` one, ``--moe-aux-loss-coeff`` one or more, ``--flag=value`` that value only.
    What its parser refuses (a value after a switch, ``--bf16=1``, a second value, a missing
    one) is a ConfigError: 856 command lines, megatron-core's verdicts recorded in
    tests/fixtures/megatron/non_data_flags.json."""
    base = ["--data-path", "p", "--global-batch-size", "4", "--train-iters", "3",
            "--eval-interval", "2", "--seq-length", "8"]
    assert len(NON_DATA_CASES) == 856
    assert {c["accepted"] for c in NON_DATA_CASES} == {True, False}
    for case in NON_DATA_CASES:
        argv = [*base, *case["argv"]]
        if case["accepted"]:
            assert megatron_config_from_args(argv, world_size=1).sizes[0] == 12, argv
        else:
            with pytest.raises(ConfigError, match=r"Megatron flags: .*Megatron's parser"):
                megatron_config_from_args(argv, world_size=1)


def test_a_value_after_a_switch_is_refused_naming_both():
    base = ["--data-path", "p", "--global-batch-size", "4", "--train-iters", "3",
            "--eval-interval", "2", "--seq-length", "8"]
    with pytest.raises(ConfigError, match="unrecognized argument 'x' after --bf16, which takes"
                                          " no value") as caught:
        megatron_config_from_args([*base, "--bf16", "x"], world_size=1)
    assert "remove 'x'" in caught.value.hint


def test_gpt3_175b_script_before_the_schedule_imports_with_its_ramp_ignored(tmp_path, caplog):
    """Its --rampup-batch-size 16 16 5859375 with --train-iters: megatron-core 0.19.2 warns that
    the flag is deprecated and trains constant batches of 1536 (counts from its own code)."""
    argv = script_argv(tmp_path, "train_gpt3_175b_distributed.fa0dcc4.sh", "ckpt", "tb",
                       "vocab.json", "merges.txt", "/d/pile")
    with caplog.at_level(logging.WARNING, logger="tokenload"):
        got = megatron_config_from_args(argv, world_size=1536)  # tensor 8 x pipeline 16: 12 dp
    assert got.sizes == [768_000_000, 7_695_360, 15_360]
    assert got.extras["rampup_batch_size"] == [16, 16, 5_859_375]
    assert "--rampup-batch-size 16 16 5859375 is ignored" in caplog.text


@pytest.mark.parametrize(("extra", "match"), [
    (["--num-layerz", "2"], "unknown Megatron flag --num-layerz"),
    (["--seq-len", "8"], "unknown Megatron flag --seq-len"),  # no abbreviations, as Megatron
    (["--object-storage-cache-path", "/x"], "--object-storage-cache-path"),
    (["--dataloader-fast-cache-load"], "needs --data-cache-path"),
    (["--dataloader-type", "external"], "external"),
    (["--seed", "x"], "invalid int value"),
])
def test_unknown_or_unsupported_flags_are_named(extra, match):
    base = ["--data-path", "p", "--seq-length", "8", "--global-batch-size", "4",
            "--train-iters", "3", "--eval-interval", "2", "--num-layers", "2", "--lr", "1e-4"]
    assert megatron_config_from_args(base, world_size=1).sizes == [12, 800, 400]
    with pytest.raises(ConfigError, match=match):
        megatron_config_from_args([*base, *extra], world_size=1)


def test_megatron_fast_load_flags_and_the_datasets_they_make(tmp_path):
    docs = [list(range(i, i + 30)) for i in range(40)]
    prefix = write_documents(tmp_path / "web", docs)
    argv = ["--data-path", "2", prefix, "--split", "90,10,0", "--seq-length", "8",
            "--global-batch-size", "4", "--micro-batch-size", "2", "--train-iters", "5",
            "--eval-iters", "1", "--eval-interval", "5", "--data-cache-path", str(tmp_path / "c"),
            "--no-create-attention-mask-in-dataloader", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "100", "--reset-position-ids", "--num-layers", "2"]
    got = megatron_config_from_args(argv, world_size=2)
    assert got.sizes == [20, 8, 4] and got.extras["data_parallel_size"] == 2
    assert got.fields["eod_id"] == 99 and got.fields["reset_position_ids"] is True
    train, _valid, test = build_datasets(got.config(), got.sizes)
    assert len(train) >= 20 and test is None
    loading = ["--dataloader-defer-npy-index-mmap", "--per-dataset-sequences-path", "seq.json"]
    deferred = megatron_config_from_args([*argv, *loading], world_size=2)
    assert deferred.fields["build_policy"] == "none" and deferred.fields["sequences_path"] == "seq.json"
    # megatron-core's BlendedMegatronDatasetConfig asserts the fast load has no --data-path blend
    with pytest.raises(ConfigError, match="--dataloader-fast-cache-load and --data-path cannot be used"):
        megatron_config_from_args([*argv, "--dataloader-fast-cache-load"], world_size=2)
    per_split = [*argv[argv.index("--seq-length"):], "--train-data-path", prefix, "--valid-data-path", prefix]
    fast = megatron_config_from_args([*per_split, "--dataloader-fast-cache-load", *loading], world_size=2)
    assert fast.fields["build_policy"] == "none" and fast.fields["blend_per_split"][2] is None


def test_the_megatron_lm_providers_training_command_imports_as_is():
    """The flags tokenload's Megatron-LM provider adds (docs/MIGRATING.md tells users to add
    --tokenload-packing to the training command) are read by the importer too: the packing, and
    under --dataloader-type external the provider's order; external alone is still refused."""
    base = ["--data-path", "p", "--seq-length", "8", "--global-batch-size", "4", "--train-iters", "3",
            "--eval-interval", "2", "--num-layers", "2"]
    external = [*base, "--dataloader-type", "external"]
    got = megatron_config_from_args([*external, "--tokenload-packing", "best-fit"], world_size=1)
    assert got.fields["packing"] == "best-fit" and got.config().packing == "best-fit"
    assert "packing" not in megatron_config_from_args(base, world_size=1).fields
    spelt = megatron_config_from_args([*external, "--tokenload-packing", "concat"], world_size=1)
    assert "packing" not in spelt.fields and spelt.extras["dataloader_type"] == "single"  # the default, given
    for flags, order in ([[], "single"], [["--tokenload-dataloader-type", "cyclic"], "cyclic"]):
        got = megatron_config_from_args([*external, "--tokenload-packing", "best-fit", *flags], world_size=1)
        assert got.extras["dataloader_type"] == order and got.sizes == [12, 800, 400]
    with pytest.raises(ConfigError, match="--tokenload-packing with --dataloader-type single"):
        megatron_config_from_args([*base, "--tokenload-packing", "best-fit"], world_size=1)
    with pytest.raises(ConfigError, match="--full-validation with tokenload's Megatron-LM provider"):
        megatron_config_from_args([*external, "--tokenload-packing", "best-fit", "--full-validation"], world_size=1)
    with pytest.raises(ConfigError, match="--prepare-cache-world-size is tokenload prepare-cache's flag"):
        megatron_config_from_args([*base, "--prepare-cache-world-size", "8"])
    with pytest.raises(ConfigError, match="external: the job brings its own loader") as info:
        megatron_config_from_args([*base, "--dataloader-type", "external"], world_size=1)
    assert "--tokenload-dataloader-type single" in str(info.value)
    with pytest.raises(ConfigError, match="--tokenload-dataloader-type with --dataloader-type cyclic"):
        megatron_config_from_args([*base, "--dataloader-type", "cyclic", "--tokenload-dataloader-type", "single"],
                                  world_size=1)
    with pytest.raises(ConfigError, match="invalid choice"):
        megatron_config_from_args([*base, "--tokenload-packing", "bestfit"], world_size=1)


# -- GPT-NeoX's example configs -------------------------------------------------------------------
def test_neox_125m_with_local_setup():
    got = neox_config_from_yaml([NEOX / "125M.yml", NEOX / "local_setup.yml"], data_parallel_size=1)
    assert got.fields == {
        "order": "neox", "sequence_length": 2048, "random_seed": 1234,
        "blend": ["data/enwik8/enwik8_text_document"], "split": "969, 30, 1", "read_mode": "mmap",
    }
    # micro 4 x 1 data-parallel; 320000 iterations, eval every 1000 for 10 iterations
    assert got.sizes == [320000 * 4, 321 * 10 * 4, 10 * 4]
    assert got.extras["tokenizer"]["vocab_file"] == "data/gpt2-vocab.json"


def test_neox_20b():
    got = neox_config_from_yaml(NEOX / "20B.yml", data_parallel_size=12)  # 96 GPUs / (4 x 2)
    assert got.fields["split"] == "995,4,1"
    assert got.fields["blend"] == ["./data/pile_20B_tokenizer/pile_20B_tokenizer_text_document"]
    assert got.extras["train_batch_size"] == 4 * 32 * 12
    assert got.sizes == [150000 * 1536, 151 * 10 * 1536, 10 * 1536]


def test_neox_20b_data_parallel_size_from_the_world(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "96")
    monkeypatch.setenv("RANK", "0")
    assert neox_config_from_yaml(NEOX / "20B.yml").extras["train_batch_size"] == 1536
    monkeypatch.setenv("WORLD_SIZE", "4")  # fewer processes than pipe x model parallel
    with pytest.raises(ConfigError, match="data_parallel_size"):
        neox_config_from_yaml(NEOX / "20B.yml")


def test_neox_per_split_paths():
    got = neox_config_from_yaml([NEOX / "125M.yml", NEOX / "eleutherai_cluster.yml"],
                                data_parallel_size=2)
    assert got.fields["blend_per_split"] == [
        ["1.0", "/mnt/ssd-1/data/enwik8/enwik8_text_document"],
        ["1.0", "/mnt/ssd-1/data/enwik8/enwik8_val_text_document"],
        ["1.0", "/mnt/ssd-1/data/enwik8/enwik8_test_text_document"],
    ]
    assert "split" not in got.fields and "blend" not in got.fields


def test_neox_pythia_with_hyphenated_docker_paths():
    got = neox_config_from_yaml([NEOX / "pythia-1-4B.yml", NEOX / "docker-pythia-paths.yml"],
                                data_parallel_size=8)
    prefix = "/home/mchorse/data/pile_deduped/pile_0.87_deduped_text_document"
    assert got.fields["blend_per_split"] == [["1.0", prefix]] * 3
    assert got.sizes == [143000 * 128, 2 * 10 * 128, 10 * 128]
    assert got.extras["tokenizer"]["tokenizer_type"] == "HFTokenizer"
    assert got.extras["num_workers"] == 1


@pytest.mark.parametrize(("extra", "fields"), [
    ({"use_shared_fs": False}, {"build_policy": "local-rank0"}),
    ({"mmap_warmup": True}, {"warmup": True}),
    ({"data_impl": "cached"}, {"read_mode": "memory"}),
    ({"data_impl": "lazy"}, {"read_mode": "pread"}),
    ({"data_impl": "infer"}, {}),
    ({"train-data-paths": ["a", "b"], "train-data-weights": [1, 3], "valid_data_paths": ["c"],
      "test_data_paths": ["d"], "weight_by_num_documents": True, "weighted_sampler_alpha": 0.3},
     {"blend_per_split": [["1.0", "a", "3.0", "b"], ["1.0", "c"], ["1.0", "d"]],
      "weight_by_num_documents": True, "weighted_sampler_alpha": 0.3}),
    ({"eod_mask_loss": True}, {"eod_mask_loss": True, "eod_id": 50256}),
])
def test_neox_data_keys_map_onto_fields(extra, fields):
    base = {"data_path": "p", "seq_length": 8, "train_iters": 2, "train_batch_size": 4}
    if "blend_per_split" in fields:  # per-split paths, without data_path (NeoX asserts either/or)
        del base["data_path"]
    got = neox_config_from_yaml({**base, **extra}, eod_id=50256)
    expected = {"order": "neox", "sequence_length": 8, "random_seed": 1234}
    if "blend_per_split" not in fields:
        expected.update(blend=["p"], split="969, 30, 1")
    assert got.fields == {**expected, **fields}


@pytest.mark.parametrize(("conf", "match"), [
    ({"train_label_data_paths": ["x"]}, "train_label_data_paths is set"),
    ({"pos_train_data_paths": ["x"]}, "pos_train_data_paths is set"),
    ({"pack_impl": "unpacked"}, "pack_impl"),
    ({"dataset_impl": "online"}, "dataset_impl"),
    ({"train_impl": "dpo"}, "train_impl"),
    ({"data_imp": "mmap"}, "unknown NeoX key data_imp"),
    ({"data_impl": "fast"}, "data_impl is 'fast'"),
    ({"eod_mask_loss": True}, "pass eod_id"),
    ({"train_iters": None}, "neither train_iters nor train_epochs"),
    ({"train_batch_size": None}, "train_micro_batch_size_per_gpu"),
    ({"seq_length": None}, "no seq_length"),
    ({"data_path": None}, "no data"),
    ({"data_path": None, "train_data_paths": ["a"], "train_data_weights": [1, 2],
      "valid_data_paths": ["b"], "test_data_paths": ["c"]}, "2 train_data_weights for 1"),
    ({"data_path": None, "train_data_paths": ["a"], "valid_data_paths": ["b"]},
     "without test_data_paths"),
    # values GPT-NeoX's validate_types and checks refuse (seen side by side with its arguments)
    ({"train_data_paths": ["a"]}, "data_path or train/valid/test_data_paths, not both"),
    ({"seq_length": 128.7}, "seq_length is 128.7; expected an int"),
    ({"seed": 1.5}, "seed is 1.5; expected an int"),
    ({"train_iters": True}, "train_iters is True; expected an int"),
    ({"train_iters": "100"}, "expected an int"),
    ({"split": 1}, "split is 1; expected a string"),
    ({"train_iters": 0}, "train_iters is 0; expected 1 or more"),
    ({"train_epochs": 2}, "no train_epochs with train_iters"),
    ({"train_iters": 0, "train_epochs": 2}, "GPT-NeoX takes this pair, sizes training by"),
    ({"eval_interval": 0}, "eval_interval is 0"),
    ({"weighted_sampler_alpha": "x"}, "weighted_sampler_alpha is 'x'; expected a number"),
    ({"seed": 2**32}, "seed is 4294967296"),
    ({"mmap_warmup": "yes"}, "mmap_warmup is 'yes'; expected true or false"),
    ({"train_batch_size": 0}, "train_batch_size is 0; expected 1 or more"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps is 0"),
    # NeoX's validate_train_epochs
    ({"train_iters": None, "train_epochs": 1, "weight_by_num_documents": True},
     "weight_by_num_documents is True; expected false with train_epochs"),
    ({"data_path": None, "train_iters": None, "train_epochs": 1, "train_data_paths": ["a", "b"],
      "train_data_weights": [1.0, 2.0], "valid_data_paths": ["c"], "test_data_paths": ["d"]},
     "train_data_weights is \\[1.0, 2.0\\]; expected none, or all 1.0"),
    # NeoX's check_batch_parameters, where the data-parallel size is known (global_num_gpus)
    ({"train_micro_batch_size_per_gpu": 3, "global_num_gpus": 1},
     "train_batch_size 4 is not train_micro_batch_size_per_gpu 3 x gradient_accumulation_steps 1"),
    ({"train_batch_size": 6, "global_num_gpus": 4}, "train_batch_size 6 is not"),
    ({"train_batch_size": 8, "gradient_accumulation_steps": 3, "global_num_gpus": 2},
     "train_batch_size 8 is not train_micro_batch_size_per_gpu 1 x gradient_accumulation_steps 3"),
])
def test_neox_keys_it_cannot_honour_are_named(conf, match):
    base = {"data_path": "p", "seq_length": 8, "train_iters": 2, "train_batch_size": 4}
    with pytest.raises(ConfigError, match=match):
        neox_config_from_yaml({**base, **conf})


def test_neox_batch_check_needs_the_jobs_data_parallel_size(monkeypatch):
    """train_batch_size against micro x accumulation x data-parallel size, as GPT-NeoX checks it
    (1,350 combinations equal to its calculate/check_batch_parameters, run side by side), only
    where the data-parallel size is the job's: not in a lone process reading a job's config."""
    conf = {"data_path": "p", "seq_length": 8, "train_iters": 2, "train_batch_size": 8,
            "train_micro_batch_size_per_gpu": 3}
    assert neox_config_from_yaml(conf).extras["train_batch_size"] == 8  # dp unknown: as given
    for known in ({"data_parallel_size": 2}, {}):
        if not known:  # a rank of a launched 2-process job
            monkeypatch.setenv("WORLD_SIZE", "2")
            monkeypatch.setenv("RANK", "0")
        with pytest.raises(ConfigError, match="8 is not train_micro_batch_size_per_gpu 3"):
            neox_config_from_yaml(conf, **known)
        ok = {**conf, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}
        assert neox_config_from_yaml(ok, **known).sizes[0] == 16
    derived = neox_config_from_yaml({**conf, "train_micro_batch_size_per_gpu": None}, data_parallel_size=4)
    assert derived.extras["train_batch_size"] == 8 and derived.extras["micro_batch_size"] == 2
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    lone = neox_config_from_yaml({**conf, "train_micro_batch_size_per_gpu": None})
    assert lone.extras["micro_batch_size"] is None  # the job's data-parallel size is unknown here
    epochs = neox_config_from_yaml({"data_path": "p", "seq_length": 8, "train_epochs": 3,
                                    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})
    assert {k: epochs.extras[k] for k in ("micro_batch_size", "gradient_accumulation_steps", "train_iters",
                                          "train_epochs")} == {"micro_batch_size": 4, "gradient_accumulation_steps": 2,
                                                               "train_iters": None, "train_epochs": 3}


def test_neox_epochs_with_unit_weights():
    conf = {"train_data_paths": ["a", "b"], "train_data_weights": [1, 1.0],
            "valid_data_paths": ["c"], "test_data_paths": ["d"], "seq_length": 8, "train_epochs": 2,
            "train_micro_batch_size_per_gpu": 2}
    assert neox_config_from_yaml(conf).sizes == [None, None, None]


def test_neox_repeated_key_across_files(tmp_path):
    (tmp_path / "x.yml").write_text('{"seq_length": 4096}\n')
    with pytest.raises(ConfigError, match="'seq_length' is in both"):
        neox_config_from_yaml([NEOX / "125M.yml", tmp_path / "x.yml"])


def test_neox_epoch_mode():
    got = neox_config_from_yaml({"data_path": "p", "seq_length": 8, "train_epochs": 3,
                                 "train_micro_batch_size_per_gpu": 4})
    assert got.sizes == [None, None, None] and got.fields["num_epochs"] == 1
    # GPT-NeoX asserts a batch key in every mode, and a GPU count pipe x model parallel divides
    with pytest.raises(ConfigError, match="neither train_batch_size nor train_micro_batch_size_per_gpu"):
        neox_config_from_yaml({"data_path": "p", "seq_length": 8, "train_epochs": 3})
    with pytest.raises(ConfigError, match="6 processes are not divisible by pipe x model parallel size 4"):
        neox_config_from_yaml({"data_path": "p", "seq_length": 8, "train_epochs": 3, "global_num_gpus": 6,
                               "model_parallel_size": 4, "train_micro_batch_size_per_gpu": 4})


# -- the job's GPUs as GPT-NeoX's launcher counts them (hostfile, num_nodes, num_gpus) -------------
HOSTFILE = ("# the job's hosts\nworker-0 slots=8\nworker-1 slots=8\n\nworker-2 slots=8  # a comment\n"
            "worker-3 slots=8 max_slots=8\n")
LAUNCH_BASE = {"data_path": "p", "seq_length": 8, "train_iters": 10, "eval_iters": 0,
               "train_micro_batch_size_per_gpu": 1}


@pytest.fixture(autouse=True)
def no_default_hostfile(monkeypatch, tmp_path_factory):
    """NeoX reads DeepSpeed's /job/hostfile (or $DLTS_HOSTFILE) where the config names none: none
    here, whatever the machine running the tests has."""
    monkeypatch.setenv("DLTS_HOSTFILE", str(tmp_path_factory.getbasetemp() / "no-default-hostfile"))


def launch_conf(tmp_path, text=HOSTFILE, **keys):
    (tmp_path / "hostfile").write_text(text)
    return {**LAUNCH_BASE, "hostfile": str(tmp_path / "hostfile"), **keys}


@pytest.mark.parametrize(("keys", "gpus"), [
    ({}, 32),  # every slot of the hostfile
    ({"num_gpus": 8, "num_nodes": 4}, 32),
    ({"num_gpus": 4, "num_nodes": 2}, 8),  # the first 2 hosts, 4 GPUs each
    ({"num_nodes": 3}, 24),
    ({"num_gpus": 12}, 48),  # num_gpus per host, as NeoX counts (and DeepSpeed launches), past the slots
    ({"num_gpus": 0, "num_nodes": 0}, 32),  # NeoX reads them above 0 only
    ({"include": "worker-1:0,2@worker-3:7"}, 3),
    ({"include": "worker-1:0, 2@worker-1"}, 2),
    # a host named without slot ids gets none in the DeepSpeed NeoX pins (DeepSpeed's docs say 10)
    ({"include": "worker-0@worker-1:0,2"}, 2),
    ({"exclude": "worker-0@worker-1:0,2"}, 22),
    ({"include": "worker-1:0,2", "num_gpus": 2}, 2),  # num_gpus x hosts is what the launcher starts
    ({"num_nodes": 2, "model_parallel_size": 2, "pipe_parallel_size": 2}, 16),  # 4 data-parallel ranks
])
def test_neox_gpus_from_the_hostfile_as_neoxs_launcher(tmp_path, keys, gpus):
    """A config without global_num_gpus: NeoX's calculate_derived counts the hostfile's slots
    (obtain_resource_pool: DeepSpeed's fetch_hostfile and parse_inclusion_exclusion), the first
    num_nodes hosts, num_gpus a host; each count as GPT-NeoX ea7aefd with its DeeperSpeed 91d1c55
    gives it, run side by side. It sizes the batch of a micro-batch-only config."""
    got = neox_config_from_yaml(launch_conf(tmp_path, **keys))
    model = keys.get("model_parallel_size", 1) * keys.get("pipe_parallel_size", 1)
    assert got.extras["train_batch_size"] == gpus // model and got.sizes[0] == 10 * gpus // model
    # the job's size given outright wins, and the hostfile is not read then
    broken = launch_conf(tmp_path, "worker-0 slots=eight\n", **keys)
    assert neox_config_from_yaml(broken, world_size=8 * model).extras["train_batch_size"] == 8
    assert neox_config_from_yaml(broken, data_parallel_size=3).extras["train_batch_size"] == 3


def test_neox_global_num_gpus_and_the_default_hostfile(tmp_path, monkeypatch):
    """global_num_gpus in the config is NeoX's count as given: hostfile, num_gpus and num_nodes are
    not read then. Without a hostfile key NeoX reads DeepSpeed's /job/hostfile, or $DLTS_HOSTFILE,
    where it exists; with neither it counts this machine's GPUs, which a config reader cannot
    know: the world size is this process's, as before (1 here)."""
    broken = launch_conf(tmp_path, "worker-0 slots=eight\n", num_gpus=8, num_nodes=4, global_num_gpus=4)
    assert neox_config_from_yaml(broken).extras["train_batch_size"] == 4
    conf = {**LAUNCH_BASE, "num_gpus": 8, "num_nodes": 4}
    assert neox_config_from_yaml(conf).extras["train_batch_size"] == 1  # no hostfile anywhere
    monkeypatch.setenv("DLTS_HOSTFILE", launch_conf(tmp_path)["hostfile"])
    assert neox_config_from_yaml(conf).extras["train_batch_size"] == 32
    assert neox_config_from_yaml({**conf, "hostfile": ""}).extras["train_batch_size"] == 32  # NeoX: "" or default


def test_neox_num_gpus_without_a_hostfile_says_why_they_were_not_used():
    """A new user's finding: num_gpus 8 and num_nodes 2 with no hostfile, pipe 2 x model 2, failed
    with "1 processes are not divisible by pipe x model parallel size 4" alone. Right (NeoX counts
    this machine's GPUs then, not 8 x 2), but the error now says so, and what gives the count."""
    conf = {**LAUNCH_BASE, "num_gpus": 8, "num_nodes": 2, "pipe_parallel_size": 2, "model_parallel_size": 2}
    with pytest.raises(ConfigError) as info:
        neox_config_from_yaml(conf)
    assert info.value.message.startswith(
        "1 processes are not divisible by pipe x model parallel size 4; num_gpus 8 and num_nodes 2 were not"
        " used because there is no hostfile (the config names none, and DeepSpeed's default")
    assert "GPT-NeoX counts the GPUs of the machine it runs on (torch.cuda.device_count())" in info.value.message
    assert "--prepare-cache-world-size" in info.value.hint and "hostfile" in info.value.hint
    assert neox_config_from_yaml(conf, world_size=16).sizes[0] == 10 * 4
    # a named hostfile that is not here: this machine alone, whose GPUs NeoX counts without num_gpus
    with pytest.raises(ConfigError, match="the hostfile /no/such/hostfile is not a file on this machine, so"
                                          " GPT-NeoX's launcher has this machine alone and counts its GPUs"):
        neox_config_from_yaml({**conf, "num_gpus": None, "num_nodes": -1, "hostfile": "/no/such/hostfile"})
    with pytest.raises(ConfigError) as info:  # a GPU count given: the plain error, as before
        neox_config_from_yaml({**conf, "global_num_gpus": 6})
    assert info.value.message == "6 processes are not divisible by pipe x model parallel size 4"


def test_neox_extras_hold_the_data_parallel_size(tmp_path, monkeypatch):
    """A new user's finding: imported.extras had no data-parallel size. It is the one given, or
    the job's GPUs over pipe x model parallel sizes as NeoX derives it; None in a lone process
    that cannot know the job's GPUs (its sizes take a world of 1)."""
    conf = {**LAUNCH_BASE, "pipe_parallel_size": 2, "model_parallel_size": 2}

    def dp(config, **options):
        return neox_config_from_yaml(config, **options).extras["data_parallel_size"]

    assert dp(conf, data_parallel_size=3) == 3
    assert dp(conf, world_size=16) == 4
    assert dp({**conf, "global_num_gpus": 32}) == 8
    assert dp(launch_conf(tmp_path, pipe_parallel_size=2, model_parallel_size=2)) == 8  # the hostfile's 32
    assert dp([NEOX / "125M.yml", NEOX / "local_setup.yml"], data_parallel_size=1) == 1
    assert dp(LAUNCH_BASE) is None
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "0")
    assert dp(conf) == 2  # a rank of a launched job of 8 processes


def test_neox_hostfile_not_on_this_machine_is_this_machine_alone(tmp_path, monkeypatch, caplog):
    """NeoX's own 125M.yml names hostfile /mock_path: NeoX (DeepSpeed's fetch_hostfile) then runs
    on this machine alone, counting its GPUs (unknown here: the world is this process's), or
    num_gpus of them, with a warning naming the file; more than one node is refused, as NeoX's
    launcher refuses it."""
    files = [NEOX / "125M.yml", NEOX / "local_setup.yml"]  # micro batch 4
    assert neox_config_from_yaml(files).extras["train_batch_size"] == 4
    (tmp_path / "gpus.yml").write_text("num_gpus: 2\n")
    caplog.clear()
    with caplog.at_level("WARNING", logger="tokenload.datasets.neox.neox_launch"):
        assert neox_config_from_yaml([*files, tmp_path / "gpus.yml"]).extras["train_batch_size"] == 8
    assert "hostfile /mock_path is not on this machine" in caplog.text
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "0")
    assert neox_config_from_yaml(files).extras["train_batch_size"] == 32  # a rank of 8
    (tmp_path / "gpus.yml").write_text("num_gpus: 8\nnum_nodes: 4\n")
    with pytest.raises(ConfigError, match="num_nodes is 4 but the hostfile /mock_path is not a file on this"
                                          " machine, so GPT-NeoX's launcher has this machine alone") as info:
        neox_config_from_yaml([*files, tmp_path / "gpus.yml"])
    assert "--prepare-cache-world-size" in info.value.hint


@pytest.mark.parametrize(("text", "keys", "match"), [
    ("worker-0 slots 4\n", {}, "line 1 of the hostfile is 'worker-0 slots 4'; expected 'HOST slots=N'"),
    ("# hosts\nworker-0 slots=4.5\n", {}, "line 2 of the hostfile gives slots=4.5; expected a whole number of"
                                          " slots \\(DeepSpeed would read it as 4\\)"),
    ("worker-0 slots=4\nworker-0 slots=8\n", {}, "line 2 of the hostfile lists worker-0 again"),
    ("# nothing yet\n\n", {}, "the hostfile lists no host"),
    (b"\xff\xfe slots=4\n", {}, "the hostfile is not text"),
    (HOSTFILE, {"include": "worker-9"}, "include names host 'worker-9', but the hostfile .* lists 4 host\\(s\\)"),
    (HOSTFILE, {"exclude": "worker-1:8"}, "exclude names slot 8 of worker-1, which has slots=8"),
    (HOSTFILE, {"include": "worker-0:x"}, "include is 'worker-0:x', whose 'worker-0:x' is not NAME or NAME:SLOT"),
    (HOSTFILE, {"exclude": "worker-0:1:2"}, "is not NAME or NAME:SLOT"),
    (HOSTFILE, {"include": "worker-1:0", "exclude": "worker-2"}, "include and exclude are both set"),
    (HOSTFILE, {"num_nodes": 5}, "num_nodes is 5 but the hostfile .* lists 4 host\\(s\\) .*; expected num_nodes 4"
                                 " or less \\(GPT-NeoX would run on those 4 alone\\)"),
    (HOSTFILE, {"include": "worker-1:0", "num_nodes": 1}, "num_nodes is 1 with include 'worker-1:0'"),
    (HOSTFILE, {"include": "worker-1:0,2", "num_gpus": 4},
     "GPT-NeoX counts 4 x 1 host\\(s\\) = 4 GPUs, but its launcher drops num_gpus then and starts 2 processes"),
    (HOSTFILE, {"include": "worker-0@worker-1"}, "leave no GPU: .*, with include 'worker-0@worker-1'"),
    ("worker-0 slots=0\n", {}, "leave no GPU: .*, with no slot on any"),
    ("worker-0 slots=1000000000000\n", {}, "gives worker-0 slots=1000000000000; expected at most 65,536"),
    ("a slots=10000000000000000000\n", {"exclude": "a:1"}, "expected at most 65,536 GPUs on one host"),
    (HOSTFILE, {"num_gpus": "8"}, "num_gpus is '8'; expected an int"),
    (HOSTFILE, {"num_nodes": True}, "num_nodes is True; expected an int"),
    (HOSTFILE, {"include": ["worker-0"]}, "include is \\['worker-0'\\]; expected a string"),
])
def test_neox_launcher_keys_neox_refuses_are_named(tmp_path, text, keys, match):
    """What GPT-NeoX's launcher refuses (a bad hostfile, an unknown host or slot, include with
    exclude, num_nodes with either, a count it would not launch, no GPU), and num_nodes past the
    hostfile's hosts (NeoX takes them all): a ConfigError saying what to change."""
    path = tmp_path / "hostfile"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=match) as info:
        neox_config_from_yaml({**LAUNCH_BASE, "hostfile": str(path), **keys})
    assert info.value.hint
    with pytest.raises(ConfigError, match="hostfile is 5; expected a path"):
        neox_config_from_yaml({**LAUNCH_BASE, "hostfile": 5})


# -- an imported NeoX config serves NeoX's items ---------------------------------------------------
NEOX_DATA = json.loads((FIXTURES / "neox" / "cases.json").read_text())
NEOX_CASES = {c["id"]: c for c in NEOX_DATA["cases"]}
NEOX_ARRAYS = np.load(FIXTURES / "neox" / "cases.npz")


def neox_files(folder, names) -> None:
    """The NeoX fixture's token files: token j of sequence i is (i * 131 + j * 7) % 50000."""
    for name in names:
        lengths = NEOX_DATA["data_files"][name]["sequence_lengths"]
        docs = [(i * 131 + np.arange(k) * 7) % 50000 for i, k in enumerate(lengths)]
        write_documents(folder / name, docs)


def build_imported(got: ImportedConfig):
    """What a user does with an import: the config it makes, through the public builder."""
    from tokenload.datasets import MegatronDataConfig, build_datasets

    config = got.config()
    assert isinstance(config, MegatronDataConfig) and config.order == "neox"
    return build_datasets(config, got.sizes)


@pytest.mark.parametrize(("cid", "conf"), [
    ("n000", {"data_path": "a", "split": "969, 30, 1", "seq_length": 16, "train_iters": 20,
              "train_batch_size": 2, "eval_iters": 1, "eval_interval": 6}),
    ("n014", {"train-data-paths": ["a", "b"], "valid-data-paths": ["d"], "test-data-paths": ["e"],
              "seq_length": 16, "train_iters": 20, "train_batch_size": 10, "eval_iters": 1,
              "eval_interval": 15}),
    ("n020", {"train_data_paths": ["a", "b", "c"], "valid_data_paths": ["a", "d"],
              "test_data_paths": ["b"], "weight_by_num_documents": True,
              "seq_length": 16, "train_iters": 30, "train_batch_size": 10, "eval_iters": 1,
              "eval_interval": 12}),
])
def test_imported_neox_config_serves_neoxs_items(tmp_path, cid, conf):
    case = NEOX_CASES[cid]
    neox_files(tmp_path, "abcde")
    for key in ("data_path", "train-data-paths", "valid-data-paths", "test-data-paths",
                "train_data_paths", "valid_data_paths", "test_data_paths"):
        if key in conf:
            value = conf[key]
            paths = [value] if isinstance(value, str) else value
            conf[key] = [str(tmp_path / p) for p in paths]
    got = neox_config_from_yaml(conf)
    assert got.sizes == case["num_samples"]
    for name, ds in zip(("train", "valid", "test"), build_imported(got)):
        rec = case["splits"][name]
        if rec is None:
            assert ds is None
            continue
        assert len(ds) == rec["len"]
        items = ds.__getitems__(rec["item_index"])
        text = NEOX_ARRAYS[f"{cid}/{name}/item_text"]
        np.testing.assert_array_equal(items["tokens"], text[:, :-1])


def test_a_neox_yaml_on_disk_serves_neoxs_items_through_the_classmethod(tmp_path):
    from tokenload.datasets import MegatronDataConfig

    case = NEOX_CASES["n000"]
    neox_files(tmp_path, "a")
    yml = tmp_path / "data.yml"
    yml.write_text(
        f'{{"data_path": "{tmp_path / "a"}", "split": "969, 30, 1", "seq_length": 16,\n'
        ' "train_iters": 20, "train_batch_size": 2, "eval_iters": 1, "eval_interval": 6,\n'
        ' "mmap_warmup": true, "data_impl": "mmap"}\n'
    )
    got = MegatronDataConfig.from_neox_config(yml)
    assert got.config().warmup and got.sizes == case["num_samples"]
    train = build_imported(got)[0]
    rec = case["splits"]["train"]
    items = train.__getitems__(rec["item_index"])
    np.testing.assert_array_equal(items["tokens"], NEOX_ARRAYS["n000/train/item_text"][:, :-1])


def test_megatron_world_size_from_world_size_alone(monkeypatch):
    """megatron.training's parse_args reads WORLD_SIZE with no RANK: the importer takes it too
    (it used to fall back to 1 and size the batch of micro x 1; megatron-core 0.19.2 gives
    (2400, 280, 40) for these flags at WORLD_SIZE=4, run side by side)."""
    argv = ["--data-path", "p", "--seq-length", "8", "--micro-batch-size", "2", "--train-iters", "300",
            "--eval-iters", "5", "--eval-interval", "50", "--num-layers", "2"]
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    got = megatron_config_from_args(argv)
    assert got.sizes == [2400, 280, 40] and got.extras["data_parallel_size"] == 4
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ConfigError, match="WORLD_SIZE='four' is not an integer"):
        megatron_config_from_args(argv)
    monkeypatch.delenv("WORLD_SIZE")
    assert megatron_config_from_args(argv).sizes == [600, 70, 10]


def test_an_imported_config_takes_fields_on_top(tmp_path):
    """docs/MIGRATING.md: a Megatron description's tokenizer object, a build policy or packing
    on top of the imported fields; another order keeps only the imported fields it reads, and a
    user's own field that the order does not read is refused."""
    argv = ["--data-path", "p", "--seq-length", "8", "--global-batch-size", "4", "--train-iters", "3",
            "--eval-interval", "2", "--num-layers", "2", "--data-cache-path", str(tmp_path)]
    imported = megatron_config_from_args(argv, world_size=1)
    ident = {"class": "HuggingFaceTokenizer", "tokenizer_path": ["t.json"]}
    got = imported.config(tokenizer=ident, build_policy="none", packing="best-fit")
    assert dict(got.tokenizer) == ident and (got.build_policy, got.packing) == ("none", "best-fit")
    assert got.path_to_cache == str(tmp_path) and imported.config().packing == "concat"
    computed = imported.config(order="computed")
    assert computed.order == "computed" and computed.path_to_cache is None
    with pytest.raises(ConfigError, match="path_to_cache applies to order='megatron' only"):
        imported.config(order="computed", path_to_cache=str(tmp_path))


def test_megatron_arithmetic_edges_as_megatron_core(monkeypatch):
    """Red-team findings, each run side by side with megatron-core 0.19.2's parse_args,
    validate_args and get_train_valid_test_num_samples: --train-samples 0 is unset there (train
    = iters x batch), a bad world size is refused, the world is WORLD_SIZE's alone (not SLURM's;
    a RANK without it is rank 0 of 1), context parallelism needs S a multiple of 2 x cp, and
    --tokenizer-type has megatron-core's choices."""
    base = ["--data-path", "p", "--seq-length", "8", "--global-batch-size", "4", "--eval-interval", "2",
            "--num-layers", "2"]
    for name in ("WORLD_SIZE", "RANK", "SLURM_PROCID", "SLURM_NTASKS", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    skip = megatron_config_from_args([*base, "--train-iters", "10", "--train-samples", "0", "--skip-train",
                                      "--eval-iters", "2"], world_size=1)
    assert skip.sizes == [40, 8, 8]  # megatron-core: [40, 8, 8] (tokenload gave [0, 8, 8])
    for bad in (0, -2):
        with pytest.raises(ConfigError, match=f"world_size is {bad}; expected 1 or more"):
            megatron_config_from_args([*base, "--train-iters", "3"], world_size=bad)
    micro = [*base[:4], "--micro-batch-size", "2", "--train-iters", "10", "--eval-iters", "1", "--eval-interval", "5",
             "--num-layers", "2"]
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert megatron_config_from_args(micro).extras["data_parallel_size"] == 1  # megatron-core: 1
    monkeypatch.setenv("RANK", "3")
    assert megatron_config_from_args(micro).extras["data_parallel_size"] == 1
    with pytest.raises(ConfigError, match="sequence length 8 is not a multiple of 2 x context-parallel size 3"):
        megatron_config_from_args([*base, "--train-iters", "3", "--context-parallel-size", "3"], world_size=3)
    assert megatron_config_from_args([*base, "--train-iters", "3", "--context-parallel-size", "2",
                                      "--global-batch-size", "2"], world_size=2).extras["data_parallel_size"] == 1
    tokenizer = ["--tokenizer-special-tokens", "<unk>", "<s>", "--tokenizer-sentencepiece-legacy",
                 "--no-tokenizer-sentencepiece-ignore-extra-whitespaces", "--padded-vocab-size", "1024"]
    assert megatron_config_from_args([*base, "--train-iters", "3", *tokenizer], world_size=1).sizes[0] == 12
    with pytest.raises(ConfigError, match="invalid choice: 'Bogus'"):
        megatron_config_from_args([*base, "--train-iters", "3", "--tokenizer-type", "Bogus"], world_size=1)


def test_neox_batch_keys_as_neoxs_calculate_batch_parameters():
    """Red-team findings, against GPT-NeoX's own calculate_derived/calculate_batch_parameters:
    gradient_accumulation_steps: null (a TypeError before; NeoX derives it), the accumulation
    NeoX derives in extras, the job's GPUs (prepare-cache's world) divided by pipe x model
    parallel sizes, and a data-parallel size below 1 refused."""
    base = {"data_path": "p", "seq_length": 8, "train_iters": 10, "eval_iters": 0}
    null = neox_config_from_yaml({**base, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": None,
                                  "global_num_gpus": 4})
    assert null.sizes[0] == 10 * 2 * 1 * 4 and null.extras["gradient_accumulation_steps"] == 1
    derived = neox_config_from_yaml({**base, "train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                                     "gradient_accumulation_steps": None, "global_num_gpus": 2})
    assert (derived.extras["micro_batch_size"], derived.extras["gradient_accumulation_steps"]) == (2, 4)
    parallel = {**base, "pipe_parallel_size": 2, "model_parallel_size": 2, "train_micro_batch_size_per_gpu": 2}
    assert neox_config_from_yaml(parallel, world_size=8).sizes == [40, 0, 0]  # dp 2: NeoX's [40, 12, 4] less eval
    assert neox_config_from_yaml({**parallel, "train_batch_size": 4}, world_size=8).extras["train_batch_size"] == 4
    assert neox_config_from_yaml(parallel, world_size=np.int64(8)).sizes == [40, 0, 0]  # NumPy ints are ints
    assert neox_config_from_yaml(parallel, data_parallel_size=np.int32(2)).sizes == [40, 0, 0]
    for name in ("data_parallel_size", "world_size"):
        for bad in (0, -2):
            with pytest.raises(ConfigError, match=f"{name} is {bad}; expected a positive int"):
                neox_config_from_yaml(parallel, **{name: bad})



@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_a_neox_blend_weighted_by_document_counts_keeps_neoxs_weights_in_the_megatron_order(tmp_path, alpha):
    """``weight_by_num_documents`` is NeoX's order's option: served in the Megatron (or computed)
    order, an imported config blended by the config's data weights instead, other data than the
    NeoX job's, without a word (a helper's finding). The blend now carries NeoX's weights from the
    files' document counts; a blend given as an override is the user's own."""
    from tokenload.datasets.neox.neox_indices import neox_weights_by_num_docs
    from tokenload.format import TokenFile

    neox_files(tmp_path, "abc")
    paths = [str(tmp_path / p) for p in "abc"]
    conf = {"train_data_paths": paths, "train_data_weights": [5.0, 1.0, 1.0], "valid_data_paths": paths[:1],
            "test_data_paths": paths[1:], "weight_by_num_documents": True, "weighted_sampler_alpha": alpha,
            "seq_length": 16, "train_iters": 30, "train_batch_size": 10, "eval_iters": 1, "eval_interval": 12}
    got = neox_config_from_yaml(conf)
    counts = [TokenFile(p).num_sequences for p in paths]
    assert len(set(counts)) > 1  # the counts, not the data weights, must decide
    want = neox_weights_by_num_docs(counts, alpha=alpha)
    for order in ("megatron", "computed"):
        config = got.config(order=order)
        train = config.blend_per_split[0]
        assert [float(w) for w in train[0::2]] == want and list(train[1::2]) == paths
        assert config.blend_per_split[1] == ["1.0", paths[0]]  # one file: weight 1
        assert not config.weight_by_num_documents
    assert got.config().weight_by_num_documents  # the NeoX order reads it itself
    own = got.config(order="megatron", blend_per_split=[["1", paths[0]], None, None])
    assert own.blend_per_split[0] == ["1", paths[0]]
