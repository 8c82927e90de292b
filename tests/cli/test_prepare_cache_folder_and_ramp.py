"""`tokenload prepare-cache`, run as a real command (issue 36, points 14 and 15): a missing
``--data-cache-path`` is created, with its parents, as Megatron's prepare_cache.py and a build
with ``path_to_cache`` create it (the same files as into a folder made beforehand; nothing made
when the command fails on its inputs; a file in the way is a one-line error), and
``--rampup-batch-size`` gives Megatron's sample counts (a step-by-step port of Megatron-LM's
``update_train_iters`` here)."""

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


def _megatron_train_iters(start, increment, samples, gbs, train_samples):
    """Megatron-LM's update_train_iters with its ramp calculator, step by step."""
    per_increment = samples / ((gbs - start) // increment)
    iterations = consumed = 0
    while consumed <= samples:
        consumed += start + int(consumed / per_increment) * increment
        iterations += 1
    return iterations + (train_samples - consumed) // gbs


@pytest.mark.parametrize("ramp, gbs, train", [((2, 2, 100), 8, 400), ((4, 4, 37), 16, 900)])
def test_a_ramp_gives_megatrons_counts(prefix, tmp_path, ramp, gbs, train):
    out = _prepare(prefix, tmp_path / "c", "--global-batch-size", str(gbs),
                   "--rampup-batch-size", *map(str, ramp), "--train-samples", str(train),
                   "--eval-interval", "10", "--eval-iters", "2", "--micro-batch-size", "2")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    iters = _megatron_train_iters(*ramp, gbs, train)
    assert result["train_iters"] == iters
    assert result["train_valid_test_num_samples"] == [train, (iters // 10 + 1) * 2 * gbs, 2 * gbs]
    assert result["rampup_batch_size"]["start"] == ramp[0]
    refused = _prepare(prefix, tmp_path / "d", "--global-batch-size", str(gbs),
                       "--rampup-batch-size", *map(str, ramp), "--train-iters", "50",
                       "--eval-interval", "10")
    assert refused.returncode == 2 and "iteration-based" in refused.stderr
