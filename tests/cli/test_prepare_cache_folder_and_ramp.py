"""`tokenload prepare-cache`, run as a real command (issue 36, points 14 and 15): a missing
``--data-cache-path`` is created, with its parents, as Megatron's prepare_cache.py and a build
with ``path_to_cache`` create it (the same files as into a folder made beforehand; nothing made
when the command fails on its inputs; a file in the way is a one-line error), and the batch flags
give megatron-core 0.19.2's sample counts: ``--rampup-batch-size`` accepted with a warning and
ignored, ``--step-batch-size-schedule`` followed (the values below are megatron-core's own, from
its parse_args + validate_args + update_train_iters + get_train_valid_test_num_samples)."""

from __future__ import annotations

import json

import pytest

from support import run_cli, write_documents


@pytest.fixture
def prefix(tmp_path):
    docs = [[(7 * i + j) % 50 for j in range(3 + i % 7)] for i in range(1000)]
    return write_documents(tmp_path / "doc", docs)


def _prepare(prefix, cache, *flags):
    return run_cli("prepare-cache", "--data-path", prefix, "--split", "90,5,5", "--seq-length", "4",
                   "--data-cache-path", cache, *flags, "--json")


BATCH = ["--global-batch-size", "8", "--train-iters", "20", "--eval-interval", "10",
         "--eval-iters", "2"]


def test_a_missing_cache_folder_is_created_with_its_parents(prefix, tmp_path):
    made = tmp_path / "made"
    made.mkdir()
    before = _prepare(prefix, made, *BATCH)
    assert before.returncode == 0, before.stderr
    missing = tmp_path / "new" / "deeper" / "cache"
    out = _prepare(prefix, missing, *BATCH)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert missing.is_dir() and result["files_written"]
    assert sorted(p.name for p in missing.iterdir()) == sorted(p.name for p in made.iterdir())


def test_a_failing_command_creates_no_folder_and_a_file_in_the_way_is_one_line(prefix, tmp_path):
    missing = tmp_path / "never"
    out = _prepare(f"{prefix}-typo", missing, *BATCH)
    assert out.returncode == 2 and "cannot read the index" in out.stderr
    assert not missing.exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for cache, message in ((blocker, "is a file, not a folder"),
                           (blocker / "sub", "cannot write the cache folder")):
        out = _prepare(prefix, cache, *BATCH)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and message in lines[0], out.stderr
        assert "[HINT:" in lines[0] and "Traceback" not in out.stderr


RAMP = ["--micro-batch-size", "2", "--global-batch-size", "8", "--rampup-batch-size", "2", "2",
        "100", "--eval-interval", "10", "--eval-iters", "2"]


@pytest.mark.parametrize("length", [["--train-samples", "400"], ["--train-iters", "50"]])
def test_a_ramp_is_ignored_with_a_warning_as_in_megatron_core(prefix, tmp_path, length):
    out = _prepare(prefix, tmp_path / "c", *RAMP, *length)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["train_iters"] == 50  # megatron-core 0.19.2: 50 either way
    assert result["train_valid_test_num_samples"] == [400, 96, 16]
    assert result["step_batch_size_schedule"] is None
    assert "--rampup-batch-size 2 2 100 is ignored, as in megatron-core 0.19" in out.stderr


@pytest.mark.parametrize("length, world, iters, sizes", [
    (["--train-samples", "400"], "1", 52, [400, 24, 4]),
    (["--train-iters", "30"], "2", 30, [120, 32, 8]),  # train = iters x micro x dp, as Megatron
])
def test_a_step_schedule_gives_megatron_cores_counts(prefix, tmp_path, length, world, iters,
                                                      sizes):
    """'0:4 42:8' with --seq-length 4: 42 tokens are 10 samples."""
    out = _prepare(prefix, tmp_path / "c", "--micro-batch-size", "2", "--step-batch-size-schedule",
                   "0:4 42:8", "--eval-interval", "10", "--eval-iters", "2",
                   "--prepare-cache-world-size", world, *length)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["train_iters"] == iters and result["train_valid_test_num_samples"] == sizes
    assert result["step_batch_size_schedule"] == {"text": "0:4 42:8", "seq_length": 4,
                                                  "steps": [[0, 4], [10, 8]]}
    refused = _prepare(prefix, tmp_path / "d", "--micro-batch-size", "2", "--global-batch-size",
                       "8", "--step-batch-size-schedule", "0:4 42:8", *length)
    assert refused.returncode == 2 and "--global-batch-size are given together" in refused.stderr


def test_the_plan_shows_a_schedule_and_explicit_sizes_refuse_it(prefix, tmp_path):
    """The printed plan names each step's batch (not only micro x dp, which sizes the other
    splits); explicit sizes with a batch schedule or ramp give the sizes twice: refused."""
    shown = run_cli("prepare-cache", "--data-path", prefix, "--split", "90,5,5", "--seq-length",
                    "4", "--data-cache-path", tmp_path / "c", "--micro-batch-size", "2",
                    "--step-batch-size-schedule", "0:4 42:8", "--train-iters", "20",
                    "--eval-interval", "10", "--eval-iters", "2")
    assert shown.returncode == 0, shown.stderr
    assert "batch schedule      4 from sample 0, 8 from sample 10" in shown.stdout
    assert "global batch size   2 (valid and test: micro x dp)" in shown.stdout
    for flag in (["--step-batch-size-schedule", "0:4 42:8"], ["--rampup-batch-size", "2", "2", "8"]):
        refused = _prepare(prefix, tmp_path / "d", "--train-valid-test-num-samples", "80", "8",
                           "8", *flag)
        assert refused.returncode == 2
        assert f"--train-valid-test-num-samples and {flag[0]} both give" in refused.stderr
