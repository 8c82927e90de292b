"""The batch flags that change or used to change the global batch during training, imported as
megatron-core 0.19.2 reads them (its ``parse_args`` + ``validate_args`` +
``init_num_microbatches_calculator`` + ``update_train_iters`` +
``get_train_valid_test_num_samples``):

* ``--step-batch-size-schedule "THRESHOLD:BS ..."``: the iterations, the sizes, the global batch
  at a consumed count and the samples consumed after N steps, against megatron-core's own values
  recorded in tests/fixtures/megatron/batch_schedule/expected.json (random schedules of 1-5
  entries with K suffixes, thresholds in tokens that are no multiple of the sequence length or of
  a batch, GPT-3's published token schedules, ``--train-iters`` jobs, every malformed string
  megatron-core raises on: a ConfigError here);
* ``--rampup-batch-size START INC SAMPLES``: deprecated in megatron-core 0.19, accepted with any
  integers, warned about and ignored by every count (with ``--train-samples`` and with
  ``--train-iters``).

The schedule changes how many micro-batches a step takes, never which sample comes next: a
loader that takes each step's micro-batches from ``consumed_samples`` serves the constant-batch
stream."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import build_datasets
from tokenload.datasets.megatron_flags import megatron_config_from_args
from tokenload.errors import ConfigError
from tokenload.loader import build_dataloader
from tokenload.megatron_args import StepBatchSchedule

FIXTURE = Path(__file__).parents[2] / "fixtures" / "megatron" / "batch_schedule" / "expected.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def _import(argv, world=1):
    return megatron_config_from_args(["--data-path", "p", *argv], world_size=world)


def _label(case):
    return " ".join(case["argv"])[:120]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_counts_and_steps_equal_megatron_cores(case, caplog):
    if "megatron_error" in case:
        with pytest.raises(ConfigError):
            _import(case["argv"], case["world"])
        return
    with caplog.at_level(logging.WARNING, logger="tokenload"):
        got = _import(case["argv"], case["world"])
    assert got.extras["train_iters"] == case["train_iters"], _label(case)
    assert got.sizes == case["sizes"], _label(case)
    assert got.extras["global_batch_size"] == case["global_batch_size"]
    warned = any("--rampup-batch-size" in r.getMessage() for r in caplog.records)
    assert warned == case["warned_rampup"]
    schedule = got.extras["step_batch_size_schedule"]
    if "schedule" not in case:
        assert schedule is None
        return
    assert [list(step) for step in schedule.steps] == case["schedule"]
    for consumed, batch in case["batch_at"]:
        assert schedule.batch_at(consumed) == batch, consumed
    for iterations, consumed in case["consumed_after"]:
        assert schedule.consumed_samples(iterations) == consumed, iterations


def test_the_fixture_covers_what_it_claims():
    """Errors, schedules with token thresholds, --train-iters jobs and ignored ramps are there."""
    errors = [c for c in CASES if "megatron_error" in c]
    schedules = [c for c in CASES if "schedule" in c]
    assert len(errors) >= 25 and len(schedules) >= 80
    assert any("--train-iters" in c["argv"] for c in schedules)
    assert sum(c.get("warned_rampup", False) for c in CASES) >= 4
    assert any(c["schedule"][-1][0] > 10**8 for c in schedules)  # GPT-3's 250B tokens


BRIEF = ["--micro-batch-size", "2", "--global-batch-size", "8", "--rampup-batch-size", "4", "4",
         "1000", "--eval-iters", "2", "--eval-interval", "50", "--seq-length", "8"]


@pytest.mark.parametrize("length, iters, sizes", [
    (["--train-samples", "5000"], 625, [5000, 208, 16]),  # the old ramp arithmetic gave 750
    (["--train-iters", "100"], 100, [800, 48, 16]),  # refused before
])
def test_a_ramp_is_ignored_with_a_warning_as_megatron_core_019_does(caplog, length, iters, sizes):
    with caplog.at_level(logging.WARNING, logger="tokenload"):
        got = _import([*BRIEF, *length])
    assert got.extras["train_iters"] == iters and got.sizes == sizes
    assert got.extras["rampup_batch_size"] == [4, 4, 1000]  # as given
    assert got.extras["step_batch_size_schedule"] is None
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert "--rampup-batch-size 4 4 1000 is ignored" in message
    assert "megatron-core 0.19" in message and "--step-batch-size-schedule" in message
    assert record.name == "tokenload.megatron_args"


def test_ramp_values_are_any_integers_as_megatron_parses_them():
    flags = [*BRIEF, "--train-samples", "5000"]
    at = flags.index("--rampup-batch-size") + 1
    flags[at : at + 3] = ["0", "-4", "7"]
    assert _import(flags).sizes == [5000, 208, 16]
    flags[at + 1] = "x"
    with pytest.raises(ConfigError, match="--rampup-batch-size: invalid int value: 'x'"):
        _import(flags)


SCHEDULE = ["--micro-batch-size", "2", "--seq-length", "8", "--eval-iters", "2",
            "--eval-interval", "50", "--train-samples", "5000"]


def test_a_schedule_in_tokens_gives_megatrons_steps():
    """'0:4 100:8' with --seq-length 8: 100 tokens are 12 samples (megatron-core's ``//``); the
    batch is 4 while fewer than 12 samples are consumed: 3 steps of 4, then 8 (value checked with
    megatron-core 0.19.2: 627 iterations, sizes [5000, 52, 4], valid/test by micro x dp = 2)."""
    got = _import([*SCHEDULE, "--step-batch-size-schedule", "0:4 100:8"])
    schedule = got.extras["step_batch_size_schedule"]
    assert schedule.steps == ((0, 4), (12, 8)) and schedule.seq_length == 8
    assert [schedule.batch_of_step(k) for k in range(5)] == [4, 4, 4, 8, 8]
    assert [schedule.consumed_samples(k) for k in range(5)] == [0, 4, 8, 12, 20]
    assert got.extras["train_iters"] == 3 + (5000 - 12 + 7) // 8 == 627
    assert got.sizes == [5000, 52, 4] and got.extras["global_batch_size"] == 2
    assert schedule.global_batch_size == 8


def test_entries_may_come_in_any_order_and_take_suffixes():
    schedule = StepBatchSchedule.parse("2.5k:16, 0:4 1K:8", None)
    assert schedule.steps == ((0, 4), (1000, 8), (2500, 16))
    assert StepBatchSchedule.parse("0:4 1.5M:8 2b:16 3T:32", 10).steps == (
        (0, 4), (150_000, 8), (200_000_000, 16), (300_000_000_000, 32))


def test_walking_by_entries_equals_megatrons_step_by_step_loop():
    """update_train_iters' loop (one step at a time) on schedules whose thresholds fall inside a
    batch, on them and past the train samples."""
    rng = np.random.default_rng(19)
    for _ in range(200):
        n = int(rng.integers(1, 5))
        thresholds = [0, *sorted(rng.choice(np.arange(1, 300), n - 1, replace=False).tolist())]
        batches = rng.integers(1, 17, n).tolist()
        schedule = StepBatchSchedule(
            "", None, tuple(zip(thresholds, batches, strict=True)))
        for train in (0, 1, int(rng.integers(1, 600))):
            consumed = iterations = 0
            while consumed < train:
                consumed += schedule.batch_at(consumed)
                iterations += 1
            assert schedule.train_iters(train) == iterations
            assert schedule.consumed_samples(iterations) == consumed


@pytest.mark.parametrize("text, match", [
    ("", "has no entry"),
    ("0:4 8", "entry '8' has no ':'"),
    ("0:4 1x:8", "the threshold '1x' of entry '1x:8' is not a finite number"),
    ("0:4 16:inf", "the batch 'inf'"),
    ("16:4", r"the smallest threshold is 2 \(samples: tokens // --seq-length 8\); expected 0"),
    ("0:4 7:8", r"two thresholds are both 0 \(samples: tokens // --seq-length 8\)"),
    ("0:4 16:0.5", "is 0; expected a positive batch"),
])
def test_schedules_megatron_core_refuses_are_config_errors(text, match):
    with pytest.raises(ConfigError, match=match) as caught:
        _import([*SCHEDULE, "--step-batch-size-schedule", text])
    assert caught.value.hint


def test_a_schedule_with_a_global_batch_size_or_without_a_micro_batch_is_refused():
    with pytest.raises(ConfigError, match="--global-batch-size are given together") as caught:
        _import([*SCHEDULE, "--step-batch-size-schedule", "0:4", "--global-batch-size", "4"])
    assert "drop --global-batch-size" in caught.value.hint
    no_micro = SCHEDULE[2:]
    assert "--micro-batch-size" not in no_micro
    with pytest.raises(ConfigError, match="needs --micro-batch-size"):
        _import([*no_micro, "--step-batch-size-schedule", "0:4"])


def test_the_schedule_changes_the_micro_batches_per_step_never_the_order(tmp_path):
    """Steps take batch_of_step(k) / micro batch micro-batches from the loader; their samples,
    concatenated, are the constant-batch run's; a resume at step k from consumed_samples(k)
    continues it."""
    docs = [np.arange(i, i + 20 + i % 13) % 997 for i in range(300)]
    prefix = write_documents(tmp_path / "d", docs)
    flags = ["--data-path", prefix, "--split", "100,0,0", "--seq-length", "8",
             "--micro-batch-size", "2", "--step-batch-size-schedule", "0:2 80:4 200:8",
             "--train-samples", "200", "--eval-iters", "0", "--eval-interval", "50"]
    got = megatron_config_from_args(flags, world_size=1)
    schedule = got.extras["step_batch_size_schedule"]
    train = build_datasets(got.config(), got.sizes)[0]

    def samples(loader, count):
        return [row.tolist() for b in itertools.islice(loader, count) for row in b["tokens"]]

    plain = samples(build_dataloader(train, micro_batch_size=2, num_workers=0), 100)
    loader = iter(build_dataloader(train, micro_batch_size=2, num_workers=0))
    stepped, consumed, steps = [], 0, 0
    while consumed < 150:
        batch = schedule.batch_of_step(steps)
        stepped += samples(loader, batch // 2)
        consumed, steps = consumed + batch, steps + 1
        assert consumed == schedule.consumed_samples(steps)
    assert stepped == plain[:consumed] and {schedule.batch_at(c) for c in (0, 10, 25)} == {2, 4, 8}
    k = steps // 2  # a resume: Megatron's checkpoint at step k
    at = schedule.consumed_samples(k)
    resumed = build_dataloader(train, micro_batch_size=2, num_workers=0, consumed_samples=at)
    assert samples(resumed, 10) == plain[at : at + 20]


def test_the_step_a_count_of_samples_ends_is_consumed_samples_inverse():
    """``step_ending_at(consumed_samples(k)) == k`` for every step, and None inside a step, on
    random schedules (thresholds that are and are not multiples of the batches)."""
    rng = np.random.default_rng(12)
    for _ in range(200):
        entries = int(rng.integers(1, 5))
        thresholds = np.sort(rng.choice(np.arange(1, 400), size=entries - 1, replace=False))
        batches = rng.integers(1, 40, size=entries)
        text = " ".join(f"{t}:{b}" for t, b in zip([0, *thresholds.tolist()], batches.tolist()))
        schedule = StepBatchSchedule.parse(text)
        ends = {schedule.consumed_samples(k): k for k in range(80)}
        for consumed in range(max(ends) + 1):
            assert schedule.step_ending_at(consumed) == ends.get(consumed), (text, consumed)


def test_a_split_with_per_split_data_is_refused_as_megatron_core_asserts(tmp_path):
    """megatron-core asserts "split and blend_per_split are incompatible"; a --split given with
    --train/valid/test-data-path was dropped here, unread. Both the flags and the Python config
    refuse it now, naming it; without --split the per-split data imports."""
    from tokenload.datasets import MegatronDataConfig

    flags = ["--train-data-path", "a", "--valid-data-path", "b", "--seq-length", "8",
             "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "4",
             "--eval-interval", "2", "--eval-iters", "1"]  # fmt: skip
    for split in ("99,1,0", "1.2.3"):
        with pytest.raises(ConfigError, match=r"--split .* is given with --train-data-path"):
            megatron_config_from_args([*flags, "--split", split])
    assert megatron_config_from_args(flags).fields["blend_per_split"] is not None
    with pytest.raises(ConfigError, match="blend_per_split") as info:
        MegatronDataConfig(sequence_length=8, blend_per_split=[["a"], ["b"], None], split="50,50,0")
    assert info.value.field == "split"
    MegatronDataConfig(sequence_length=8, blend_per_split=[["a"], ["b"], None])


@pytest.mark.parametrize(
    "flags, sizes",
    [  # megatron-core 0.19.2's validate_args + counts, world size 2 (run side by side)
        (["--eval-micro-batch-size", "3", "--eval-global-batch-size", "12"], [120, 72, 24]),
        (["--eval-micro-batch-size", "3", "--eval-global-batch-size", "8"], None),
        (["--eval-micro-batch-size", "4"], None),
        (["--eval-global-batch-size", "6"], None),
    ],
)
def test_the_evaluation_batches_are_checked_as_megatron_core_checks_them(flags, sizes):
    """--eval-micro-batch-size is accepted (it sizes no split); the evaluation batch must be a
    multiple of the evaluation micro-batch x data-parallel size, as megatron-core asserts."""
    argv = ["--micro-batch-size", "2", "--global-batch-size", "12", "--train-iters", "10",
            "--eval-iters", "2", "--eval-interval", "5", "--seq-length", "8", *flags]  # fmt: skip
    if sizes is None:
        with pytest.raises(ConfigError, match=r"evaluation batch .* not a multiple"):
            _import(argv, 2)
    else:
        assert _import(argv, 2).sizes == sizes


@pytest.mark.parametrize(
    "flags, want",
    [  # megatron-core 0.19.2's (train_iters, sizes), or None where it fails (run side by side)
        (["--train-iters", "10", "--train-samples", "100", "--skip-train"], (10, [100, 8, 8])),
        (["--train-iters", "10", "--train-samples", "100"], None),
        (["--train-iters", "0", "--train-samples", "100", "--skip-train"], (25, [100, 8, 8])),
        (["--train-iters", "0"], None),
        (["--train-iters", "0", "--skip-train"], None),
        (["--train-iters", "0", "--train-samples", "0"], (0, [0, 8, 8])),
        (["--train-samples", "0"], (0, [0, 8, 8])),
        (["--train-iters", "7"], (7, [28, 16, 8])),
        (["--train-samples", "30", "--skip-train"], (7, [30, 8, 8])),
    ],
)
def test_train_lengths_are_taken_as_megatron_core_takes_them(flags, want):
    """Both --train-iters and --train-samples only with --skip-train (the samples size the
    split; a count of 0 iterations reads the samples), a ConfigError where megatron-core fails
    (an assert, or a TypeError on --train-iters 0 alone)."""
    argv = ["--micro-batch-size", "2", "--global-batch-size", "4", "--eval-iters", "2",
            "--eval-interval", "5", "--seq-length", "8", *flags]  # fmt: skip
    if want is None:
        with pytest.raises(ConfigError, match="train"):
            _import(argv)
    else:
        got = _import(argv)
        assert (got.extras["train_iters"], got.sizes) == want
