"""`tokenload prepare-cache`, run as a real command: Megatron's sample arithmetic, the caches
megatron-core's prepare_cache.py writes (fixtures/megatron/prepare_cache), one-line errors."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from support import FIXTURES, run_cli, run_shell, write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import CacheError, ConfigError

PREPARED = json.loads((FIXTURES / "megatron" / "prepare_cache" / "expected.json").read_text())
CASES = {c["id"]: c for c in PREPARED["cases"]}
NULL_1000 = json.loads((FIXTURES / "megatron" / "order" / "cases.json").read_text())["tokenizer"]["unique_identifiers"]
TOKENLOAD_ONLY = ("-tokenload.json", "-tokenload-build.json")


@pytest.fixture
def order_data(tmp_path):
    """A copy of megatron's order/ token files (prefixes gold/x ... rand/c relative to it)."""
    root = tmp_path / "data"
    for sub in ("gold", "rand"):
        shutil.copytree(FIXTURES / "megatron" / "order" / sub, root / sub)
    return root


@pytest.fixture
def one_prefix(tmp_path):
    """1000 documents of 3-9 tokens: enough for every sample count below, and for a test split
    under Megatron's default split."""
    docs = [[(7 * i + j) % 50 for j in range(3 + i % 7)] for i in range(1000)]
    return write_documents(tmp_path / "doc", docs)


def _md5s(folder) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def _prepare_json(*args, cwd=None) -> dict:
    cache = Path(cwd or ".", args[list(args).index("--data-cache-path") + 1])
    cache.mkdir(parents=True, exist_ok=True)  # prepare-cache writes into an existing folder only
    out = run_cli("prepare-cache", *args, "--json", cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_caches_are_megatron_prepare_caches(case_id, order_data, tmp_path):
    case = CASES[case_id]
    cache = tmp_path / "cache"
    result = _prepare_json(*case["argv"], "--data-cache-path", cache, cwd=order_data)
    counts = case["counts"]
    for key in ("world_size", "data_parallel_size", "global_batch_size", "train_iters"):
        assert result[key] == counts[key], key
    assert result["train_valid_test_num_samples"] == counts["train_valid_test_num_samples"]
    assert {s: result[f"{s}_dataset_length"] for s in ("train", "valid", "test")} == case["lengths"]
    assert result["tokenizer"] == NULL_1000
    got = _md5s(cache)
    assert {n: got.get(n) for n in case["files"]} == case["files"]  # same names, same bytes
    assert all(n.endswith(TOKENLOAD_ONLY) for n in set(got) - set(case["files"]))
    for name, text in case["descriptions"].items():
        assert (cache / name).read_text() == text
    assert sorted(result["files_written"]) == sorted(got)


def test_build_policy_none_loads_the_prepared_caches(order_data, tmp_path, monkeypatch):
    case = CASES["weighted_blend_gbs"]
    cache = tmp_path / "cache"
    _prepare_json(*case["argv"], "--data-cache-path", cache, cwd=order_data)
    before = _md5s(cache)
    monkeypatch.chdir(order_data)
    config = MegatronDataConfig(
        sequence_length=16, blend=["30", "gold/x", "70", "rand/a"], split="80,15,5", tokenizer=NULL_1000,
        path_to_cache=str(cache), build_policy="none",
    )
    datasets = build_datasets(config, case["counts"]["train_valid_test_num_samples"])
    assert {s: len(d) for s, d in zip(("train", "valid", "test"), datasets)} == case["lengths"]
    assert _md5s(cache) == before


# sizes Megatron's flags reach (a global batch of 1; --full-validation for one valid epoch) and
# sizes they cannot (a split of one epoch other than valid, a valid count no interval gives)
JOB_SIZES = [[40, 12, 4], [40, None, 8], [None, 10, 4], [40, 20, 0], [40, None, None]]


@pytest.mark.parametrize("sizes", JOB_SIZES)
def test_the_missing_cache_command_builds_the_caches_the_job_loads(sizes, one_prefix, tmp_path):
    """The command a build_policy='none' job prints, run as it is, prepares exactly its caches."""
    config = MegatronDataConfig(sequence_length=4, blend=[one_prefix], split="90,5,5",
                                path_to_cache=str(tmp_path / "c"), build_policy="none")
    with pytest.raises(CacheError) as info:
        build_datasets(config, sizes)
    command = str(info.value).split("with: ", 1)[1].split("  (or use", 1)[0]
    assert command.startswith(f"mkdir -p {tmp_path / 'c'} && tokenload prepare-cache ")
    out = run_shell(command)
    assert out.returncode == 0, out.stderr
    loaded = build_datasets(config, sizes)
    built = build_datasets(dataclasses.replace(config, build_policy="every-rank", path_to_cache=None), sizes)
    for got, want in zip(loaded, built):
        assert len(got) == len(want)
        rows = np.arange(0, len(want), max(1, len(want) // 7))
        np.testing.assert_array_equal(got.__getitems__(rows)["tokens"], want.__getitems__(rows)["tokens"])


def test_a_scheduled_jobs_command_prepares_its_entries_and_sources(tmp_path):
    """A weights_schedule job under build_policy='none': the command it prints (with
    --weights-schedule) prepares the source the first entry leaves out and every entry's
    blending arrays (one cache); the job then loads them all and serves the stream it serves in
    memory."""
    rng = np.random.default_rng(3)
    prefixes = [write_documents(tmp_path / name, [rng.integers(1, 90, size=int(n)).tolist()
                                                  for n in rng.integers(2, 12, size=300)])
                for name in ("a", "b", "c")]
    schedule = [(0, [5, 3, 0]), (100, [1, 1, 8]), (250, [2.5, 7, 1])]
    blend = [x for p in prefixes for x in ("1", p)]
    config = MegatronDataConfig(sequence_length=4, blend=blend, split="100,0,0",
                                weights_schedule=schedule, path_to_cache=str(tmp_path / "c"),
                                build_policy="none")
    with pytest.raises(CacheError) as info:
        build_datasets(config, [400, 0, 0])
    command = str(info.value).split("with: ", 1)[1].split("  (or use", 1)[0]
    assert "--weights-schedule '[[0,[5.0,3.0,0.0]],[100,[1.0,1.0,8.0]],[250,[2.5,7.0,1.0]]]'" in command
    out = run_shell(command)
    assert out.returncode == 0, out.stderr
    assert "weights schedule    3 entries; changes at samples 100, 250" in out.stdout
    loaded = build_datasets(config, [400, 0, 0])[0]
    assert sorted(loaded.entry_spans) == [1, 2] and loaded.entry_arrays.paths is not None
    assert len(list((tmp_path / 'c').glob('*-BlendedDataset-train-description.txt'))) == 1
    memory = build_datasets(dataclasses.replace(config, cache="off", build_policy="auto"), [400, 0, 0])[0]
    rows = np.arange(400)
    np.testing.assert_array_equal(loaded.__getitems__(rows)["tokens"], memory.__getitems__(rows)["tokens"])
    out = run_cli("prepare-cache", "--data-path", *blend, "--split", "100,0,0", "--seq-length", "4",
                  "--data-cache-path", str(tmp_path / "c"), "--train-samples", "400",
                  "--global-batch-size", "1", "--eval-iters", "0", "--eval-interval", "1",
                  "--weights-schedule", "[[0, [1, 2]]]")
    assert out.returncode != 0 and "has 2 weights; the blend has 3 sources" in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2, out.stderr


# Megatron's arithmetic: train = iters x gbs (or --train-samples), valid = (iters // interval + 1)
# x eval_iters x eval gbs, test = eval_iters x eval gbs; gbs = micro x world // (tp x pp x cp).
COUNTS = [
    (["--global-batch-size", "8", "--train-iters", "100", "--eval-interval", "10", "--eval-iters", "3"],
     8, 1, [800, 264, 24]),
    (["--micro-batch-size", "2", "--prepare-cache-world-size", "8", "--train-iters", "10", "--eval-interval",
      "5", "--eval-iters", "2"], 16, 8, [160, 96, 32]),
    (["--micro-batch-size", "2", "--prepare-cache-world-size", "8", "--tensor-model-parallel-size", "2",
      "--pipeline-model-parallel-size", "2", "--train-iters", "10", "--eval-interval", "5", "--eval-iters", "2"],
     4, 2, [40, 24, 8]),
    (["--micro-batch-size", "3", "--train-iters", "4", "--eval-interval", "2", "--eval-iters", "1"], 3, 1, [12, 9, 3]),
    (["--global-batch-size", "8", "--train-samples", "50", "--eval-interval", "4", "--eval-iters", "1"],
     8, 1, [50, 16, 8]),
    (["--global-batch-size", "8", "--train-iters", "10", "--eval-interval", "5", "--eval-iters", "2",
      "--eval-global-batch-size", "2"], 8, 1, [80, 12, 4]),
    (["--global-batch-size", "8", "--train-iters", "10", "--eval-interval", "5", "--eval-iters", "2",
      "--start-eval-at-iter", "5"], 8, 1, [80, 32, 16]),
    (["--global-batch-size", "2", "--train-iters", "10", "--eval-iters", "4", "--skip-train"], 2, 1, [20, 8, 8]),
    (["--global-batch-size", "1", "--train-iters", "10", "--eval-interval", "100"], 1, 1, [10, 100, 100]),
]


@pytest.mark.parametrize("flags,gbs,dp,samples", COUNTS)
def test_sample_counts_follow_megatron(flags, gbs, dp, samples, one_prefix, tmp_path):
    result = _prepare_json("--data-path", one_prefix, "--split", "90,5,5", "--seq-length", "4",
                           "--data-cache-path", tmp_path / "c", *flags)
    assert (result["global_batch_size"], result["data_parallel_size"]) == (gbs, dp)
    assert result["train_valid_test_num_samples"] == samples
    assert result["train_dataset_length"] >= samples[0]


def test_text_output_names_counts_lengths_and_missing_tokenizer(one_prefix, tmp_path):
    (tmp_path / "c").mkdir()
    out = run_cli("prepare-cache", "--data-path", one_prefix, "--seq-length", "4", "--data-cache-path",
                  tmp_path / "c", "--global-batch-size", "2", "--train-iters", "3", "--eval-interval", "2",
                  "--eval-iters", "1", "--eod-mask-loss")
    assert out.returncode == 0, out.stderr
    assert "samples             train 6, valid 4, test 2" in out.stdout
    assert "'969, 30, 1' (Megatron's default without --split)" in out.stdout
    assert "tokenizer identity  None" in out.stdout
    assert "--eod-mask-loss: item flags, no effect on the caches" in out.stdout
    assert "train dataset length" in out.stdout and "test dataset length" in out.stdout
    assert out.stderr == ""  # no progress bar when stderr is not a terminal


def test_tokenizer_identity_derived_or_copied(one_prefix, tmp_path):
    base = ["--data-path", one_prefix, "--split", "1,0,0", "--seq-length", "4", "--global-batch-size", "1",
            "--train-iters", "2", "--eval-iters", "0", "--skip-train", "--data-cache-path"]
    null = _prepare_json(*base, tmp_path / "a", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000")
    assert null["tokenizer"] == NULL_1000
    eod = _prepare_json(*base, tmp_path / "b", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
                        "--null-tokenizer-eod-id", "5")
    assert list(eod["tokenizer"].items())[2:] == [("vocab_size", "1000"), ("eod_id", "5"), ("pad_id", "-1")]
    description = next((tmp_path / "a").glob("*-GPTDataset-train-description.txt"))
    copied = _prepare_json(*base, tmp_path / "c", "--tokenizer-identity", description)
    assert copied["tokenizer"] == NULL_1000
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == sorted(p.name for p in (tmp_path / "a").iterdir())
    inline = _prepare_json(*base, tmp_path / "d", "--tokenizer-identity", json.dumps(NULL_1000))
    assert inline["files_written"] == copied["files_written"]


def test_order_computed_has_nothing_to_prepare(tmp_path):
    out = run_cli("prepare-cache", "--order", "computed", "--data-path", "nowhere", "--data-cache-path", tmp_path / "c")
    assert out.returncode == 0, out.stderr
    assert "nothing to prepare" in out.stdout
    assert not (tmp_path / "c").exists()


ERRORS = [  # (base flags removed, flags added, what the one line says)
    ([], ["--mock-data"], "--mock-data has no token files"),
    (["--data-path"], ["--data-path", "x", "{prefix}", "2", "{prefix}"], "mixes numeric and non-numeric"),
    ([], ["--train-data-path", "{prefix}"], "are given together"),
    (["--data-path"], ["--data-path", "{prefix}-missing"], "cannot read the index"),
    (["--eval-interval"], [], "no --eval-interval"),
    ([], ["--prepare-cache-world-size", "6", "--tensor-model-parallel-size", "4"], "not divisible"),
    ([], ["--micro-batch-size", "3"], "not a multiple of micro batch size"),
    ([], ["--tokenizer-type", "GPT2BPETokenizer"], "derives only NullTokenizer"),
    ([], ["--tokenizer-identity", "{{not json"], "is not JSON"),
    (["--train-iters"], [], "no training length"),
    ([], ["--train-valid-test-num-samples", "8", "epoch", "2"], "both give the sizes"),
    (["--train-iters", "--eval-interval", "--global-batch-size"], ["--train-valid-test-num-samples", "8", "-1", "2"],
     "expected a number >= 0 or 'epoch'"),
]


@pytest.mark.parametrize("removed,added,message", ERRORS)
def test_user_errors_are_one_line(removed, added, message, one_prefix, tmp_path):
    (tmp_path / "c").mkdir()
    base = {"--data-path": [one_prefix], "--split": ["99,1,0"], "--seq-length": ["4"], "--data-cache-path":
            [str(tmp_path / "c")], "--global-batch-size": ["4"], "--train-iters": ["2"], "--eval-interval": ["1"]}
    argv = [x for flag, values in base.items() if flag not in removed for x in (flag, *values)]
    out = run_cli("prepare-cache", *argv, *(x.format(prefix=one_prefix) for x in added))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenload prepare-cache: error:"), out.stderr
    assert message in lines[0]
    assert "[HINT:" in lines[0]


def test_the_training_jobs_whole_command_line_prepares_its_caches(one_prefix, tmp_path):
    """docs/SCALE.md: prepare the caches "with the training job's own flags". The job's command
    (model, optimizer, logging flags, loading flags, a HuggingFace tokenizer with its identity
    copied from Megatron, the provider's --tokenload-packing) prepares the caches the data flags
    alone prepare; a flag tokenload does not know is still refused (a migration trial found the
    command refused)."""
    identity = json.dumps({**NULL_1000, "class": "megatron.core.tokenizers.text.HuggingFaceTokenizer"})
    data = ["--data-path", one_prefix, "--split", "90,5,5", "--seq-length", "8", "--global-batch-size", "4",
            "--train-iters", "6", "--eval-iters", "1", "--eval-interval", "3", "--tokenizer-identity", identity]
    job = ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "1", "--lr", "1e-4",
           "--lr-decay-style", "cosine", "--bf16", "--save", str(tmp_path / "ckpt"), "--log-interval", "1",
           "--micro-batch-size", "2", "--num-workers", "4", "--dataloader-type", "external",
           "--dataloader-inter-document-masking", "--dataloader-defer-npy-index-mmap", "--no-mmap-bin-files",
           "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "tok.json",
           "--tokenload-dataloader-type", "single", "--tokenload-packing", "best-fit"]
    whole = _prepare_json(*job, *data, "--data-cache-path", tmp_path / "whole")
    alone = _prepare_json(*data, "--packing", "best-fit", "--data-cache-path", tmp_path / "alone")
    assert whole["train_valid_test_num_samples"] == alone["train_valid_test_num_samples"] == [24, 12, 4]
    names = [sorted(p.name for p in (tmp_path / side).iterdir()) for side in ("whole", "alone")]
    assert names[0] == names[1]
    assert any("packed" in p.name or "row" in p.name for p in (tmp_path / "whole").iterdir())
    (tmp_path / "x").mkdir()
    refused = run_cli("prepare-cache", *job, "--no-such-flag", "1", *data, "--data-cache-path", tmp_path / "x")
    assert refused.returncode == 2 and "unrecognized arguments: --no-such-flag (" in refused.stderr
    assert "--num-layers" not in refused.stderr.splitlines()[-1]  # the job's own flags are no typos
    tokenizer = ["--tokenizer-special-tokens", "<unk>", "<s>", "--trust-remote-code", "--tokenizer-hf-no-use-fast"]
    special = _prepare_json(*job, *tokenizer, *data, "--data-cache-path", tmp_path / "tok")  # megatron-core 0.19.2's
    assert special["train_valid_test_num_samples"] == [24, 12, 4]
    unquoted = run_cli("prepare-cache", *job, "--step-batch-size-schedule", "0:4", "12:4", *data,
                       "--data-cache-path", tmp_path / "x")  # fmt: skip
    assert unquoted.returncode == 2
    assert "unrecognized argument '12:4' after --step-batch-size-schedule" in unquoted.stderr
    assert 'quote the whole value (--step-batch-size-schedule "0:4 12:4 ...")' in unquoted.stderr
    assert "no such flag" not in unquoted.stderr
    # the hint names the flag whose value was split, not another (a new user's finding)
    split = run_cli("prepare-cache", *data[:2], "--split", "90,", "5,", "5", *data[4:], "--data-cache-path",
                    tmp_path / "x")  # fmt: skip
    assert split.returncode == 2 and 'quote the whole value (--split "90, 5, ...")' in split.stderr, split.stderr
    for job_packing, packing in (("best-fit", "concat"), ("concat", "best-fit")):  # the two disagree
        clash = run_cli("prepare-cache", *job[:-2], "--tokenload-packing", job_packing, "--packing", packing, *data,
                        "--data-cache-path", tmp_path / "x")  # fmt: skip
        assert clash.returncode == 2, clash.stderr
        assert f"--packing {packing} and --tokenload-packing {job_packing} disagree" in clash.stderr
    null = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "999", "--tokenizer-identity", json.dumps(NULL_1000)]
    clash = run_cli("prepare-cache", *data[:-2], *null, "--data-cache-path", tmp_path / "x")
    assert clash.returncode == 2 and "is not the identity of the job's NullTokenizer flags" in clash.stderr


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--seed", "-1"], "--seed is -1; expected 0..2**32-1"),  # the configuration's check
        (["--train-valid-test-num-samples", "100000000000000", "0", "0"], "epochs are needed"),
    ],
)
def test_a_command_that_fails_makes_no_cache_folder(tmp_path, flags, words):
    """prepare-cache made --data-cache-path before the build, so a seed out of RandomState's
    range or more samples than int32 epochs left an empty folder (red-team finding); the seed's
    error named random_seed. The folder is made by the build, as it writes a file."""
    prefix = write_documents(tmp_path / "a", [[1, 2, 3, 4]] * 40)
    cache = tmp_path / "made" / "cache"
    base = ["--data-path", prefix, "--split", "100,0,0", "--seq-length", 4, "--data-cache-path",
            cache]
    if "--train-valid-test-num-samples" not in flags:
        base += ["--train-valid-test-num-samples", 8, 0, 0]
    out = run_cli("prepare-cache", *base, *flags)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert words in out.stderr and "HINT" in out.stderr, out.stderr
    assert not (tmp_path / "made").exists()
    done = run_cli("prepare-cache", "--data-path", prefix, "--split", "100,0,0", "--seq-length", 4,
                   "--data-cache-path", cache, "--train-valid-test-num-samples", 8, 0, 0)
    assert done.returncode == 0 and list(cache.glob("*.npy")), done.stderr


def test_a_full_disk_is_one_error_whose_hint_fits_the_command(tmp_path):
    """A cache write that fails for room (a real full tmpfs as the cache folder, a mount point)
    says the filesystem is full, and prepare-cache's hint does not offer the library's way out
    of building in memory (a command that writes caches has none): red-team findings."""
    from support import mounted_tmpfs

    prefix = write_documents(tmp_path / "a", [list(range(1, 200))] * 400)
    with mounted_tmpfs(tmp_path / "full", "size=16k") as cache:
        out = run_cli("prepare-cache", "--data-path", prefix, "--split", "100,0,0", "--seq-length",
                      4, "--data-cache-path", cache, "--train-valid-test-num-samples", 8, 0, 0)
        assert out.returncode == 2 and "the filesystem is full" in out.stderr, out.stderr
        assert "--data-cache-path" in out.stderr and "in memory" not in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_the_providers_flags_without_the_external_loader_are_refused_as_the_importer_refuses_them(one_prefix,
                                                                                                   tmp_path):
    """``--tokenload-packing`` belongs to a job under ``--dataloader-type external`` (where the
    provider runs): the importer refused it elsewhere, prepare-cache took it (a new user's
    finding). Both refuse it now, in the same words; with the external loader both take it."""
    from tokenload.datasets.megatron_flags import megatron_config_from_args

    data = ["--data-path", one_prefix, "--split", "90,5,5", "--seq-length", "8", "--global-batch-size", "4",
            "--train-iters", "6", "--eval-iters", "1", "--eval-interval", "3"]
    words = "--tokenload-packing with --dataloader-type single: it is a flag of tokenload's Megatron-LM provider"
    with pytest.raises(ConfigError, match=words):
        megatron_config_from_args([*data, "--tokenload-packing", "best-fit"], world_size=1)
    done = run_cli("prepare-cache", *data, "--tokenload-packing", "best-fit", "--data-cache-path", tmp_path / "c")
    assert done.returncode == 2 and words in done.stderr, done.stderr
    external = [*data, "--tokenload-packing", "best-fit", "--dataloader-type", "external"]
    assert megatron_config_from_args(external, world_size=1).fields["packing"] == "best-fit"
    assert _prepare_json(*external, "--data-cache-path", tmp_path / "c")["train_valid_test_num_samples"] == [24, 12, 4]
