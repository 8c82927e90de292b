"""``--rampup-batch-size START INCREMENT SAMPLES`` imported with Megatron's arithmetic (issue 36,
point 14): the training iterations (``update_train_iters``), the valid split's size that follows
from them, and the samples consumed after each step, against a step-by-step port of Megatron-LM's
own code written here (megatron-core 0.19.2, the reference venv's, no longer ramps: its
calculator ignores the flag, so the port follows the last Megatron-LM that did:
``RampupBatchsizeNumMicroBatchesCalculator.update``, ``update_train_iters``, and the training
loop's ``consumed_train_samples += batch`` after ``update_num_microbatches``). Megatron refuses a
ramp with ``--train-iters``, and so does the importer. The ramp never changes the order: a loader
that takes each step's micro-batches from ``consumed_samples`` serves the unramped stream."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import build_datasets
from tokenload.datasets.megatron_flags import megatron_config_from_args
from tokenload.errors import ConfigError
from tokenload.loader import build_dataloader


class MegatronRamp:
    """Megatron-LM's ramp, one step at a time, as its code does it."""

    def __init__(self, start, increment, samples, global_batch_size):
        self.start, self.increment, self.samples = start, increment, samples
        self.gbs = global_batch_size
        num_increments = (global_batch_size - start) // increment
        self.rampup_samples_per_increment = samples / num_increments

    def current_global_batch_size(self, consumed):
        if consumed > self.samples:
            return self.gbs
        steps = int(consumed / self.rampup_samples_per_increment)
        return self.start + steps * self.increment

    def update_train_iters(self, train_samples):
        iterations = consumed = 0
        while consumed <= self.samples:
            consumed += self.current_global_batch_size(consumed)
            iterations += 1
        iterations += (train_samples - consumed) // self.gbs
        return iterations

    def ramp_steps(self):
        """The steps of update_train_iters' ramp phase."""
        return self.update_train_iters(0) - (0 - self.consumed_after_ramp()) // self.gbs

    def consumed_after_ramp(self):
        consumed = 0
        while consumed <= self.samples:
            consumed += self.current_global_batch_size(consumed)
        return consumed

    def consumed_after(self, iterations):
        consumed = 0
        for _ in range(iterations):
            consumed += self.current_global_batch_size(consumed)
        return consumed


def _flags(ramp, gbs, train, *, mbs=1, interval=50, eval_iters=3):
    return [
        "--data-path",
        "p",
        "--seq-length",
        "8",
        "--micro-batch-size",
        str(mbs),
        "--global-batch-size",
        str(gbs),
        "--rampup-batch-size",
        *map(str, ramp),
        "--train-samples",
        str(train),
        "--eval-interval",
        str(interval),
        "--eval-iters",
        str(eval_iters),
    ]


def _cases():
    """Ramps of every shape: per-increment sample counts whole and fractional (Megatron's float
    division decides each boundary), one increment or many, long and short ramps."""
    rng = np.random.default_rng(36)
    out = [
        ((16, 16, 5_859_375), 1536, 300_000_000, 16),  # GPT-3 175B's published ramp, dp 16
        ((2, 2, 10), 4, 100, 2),
        ((1, 1, 7), 8, 1000, 1),
        ((3, 3, 1), 6, 50, 3),
    ]
    for _ in range(40):
        group = int(rng.integers(1, 5))
        start = group * int(rng.integers(1, 6))
        increment = group * int(rng.integers(1, 4))
        gbs = start + increment * int(rng.integers(1, 12))
        samples = int(rng.integers(1, 20_000))
        train = samples + int(rng.integers(gbs, 50_000))
        out.append(((start, increment, samples), gbs, train, group))
    return out


@pytest.mark.parametrize("ramp, gbs, train, group", _cases())
def test_iterations_sizes_and_consumed_samples_follow_megatron(ramp, gbs, train, group):
    got = megatron_config_from_args(_flags(ramp, gbs, train, mbs=group), world_size=1)
    reference = MegatronRamp(*ramp, gbs)
    iters = reference.update_train_iters(train)
    assert got.extras["train_iters"] == iters
    assert got.sizes == [train, (iters // 50 + 1) * 3 * gbs, 3 * gbs]  # valid from the ramp's iters
    imported = got.extras["rampup_batch_size"]
    assert (imported.start, imported.increment, imported.samples) == ramp
    ramp_steps = reference.ramp_steps()
    checked = sorted({0, 1, 2, ramp_steps // 2, ramp_steps - 1, ramp_steps, ramp_steps + 5, iters})
    for k in checked:
        consumed = reference.consumed_after(k)
        assert imported.consumed_samples(k) == consumed, k
        assert imported.batch_at(consumed) == reference.current_global_batch_size(consumed)


def test_every_step_of_a_ramp_matches_megatron():
    reference = MegatronRamp(8, 8, 10_001, 64)
    ramp = megatron_config_from_args(_flags((8, 8, 10_001), 64, 50_000, mbs=8), world_size=1)
    imported = ramp.extras["rampup_batch_size"]
    consumed = 0
    for k in range(400):
        assert imported.consumed_samples(k) == consumed, k
        consumed += reference.current_global_batch_size(consumed)


def test_a_ramp_without_train_samples_is_refused_as_megatron_refuses_it():
    flags = _flags((16, 16, 5000), 64, 100_000)
    iters = [f if f != "--train-samples" else "--train-iters" for f in flags]
    with pytest.raises(ConfigError, match="--rampup-batch-size 16 16 5000") as caught:
        megatron_config_from_args(iters, world_size=1)
    assert "--train-samples" in caught.value.hint and "iteration-based" in caught.value.message


@pytest.mark.parametrize(
    "ramp, gbs, mbs, world, match",
    [
        ((16, 16, 100), 40, 1, 1, "whole number of increments"),
        ((64, 16, 100), 64, 1, 1, "whole number of increments"),  # no increment at all
        ((12, 6, 100), 36, 4, 1, "not a multiple of micro batch size 4"),
        ((16, 16, 100), 64, 1, 12, "x data-parallel size 12"),
        ((4, 4, 10_000), 8, 1, 1, "more than --train-samples"),
    ],
)
def test_ramps_megatron_cannot_run_are_config_errors(ramp, gbs, mbs, world, match):
    with pytest.raises(ConfigError, match=match):
        megatron_config_from_args(_flags(ramp, gbs, 1000, mbs=mbs), world_size=world)


@pytest.mark.parametrize("bad", ["0", "-4", "x"])
def test_ramp_values_must_be_positive_integers(bad):
    flags = _flags((4, 4, 100), 8, 1000)
    at = flags.index("--rampup-batch-size") + 2
    with pytest.raises(ConfigError, match="rampup-batch-size"):
        megatron_config_from_args([*flags[:at], bad, *flags[at + 1 :]], world_size=1)


def test_the_ramp_changes_the_micro_batches_per_step_never_the_order(tmp_path):
    """Steps of a ramp take batch_at(consumed) / micro batch micro-batches from the loader; their
    samples, concatenated, are the constant-batch run's; a resume at step k from
    consumed_samples(k) continues it."""
    docs = [np.arange(i, i + 20 + i % 13) % 997 for i in range(300)]
    prefix = write_documents(tmp_path / "d", docs)
    flags = _flags((2, 2, 30), 8, 200, mbs=2)
    flags[flags.index("p")] = prefix
    got = megatron_config_from_args([*flags, "--split", "100,0,0"], world_size=1)
    ramp = got.extras["rampup_batch_size"]
    train = build_datasets(got.config(), got.sizes)[0]

    def samples(loader, count):
        return [row.tolist() for b in itertools.islice(loader, count) for row in b["tokens"]]

    plain = samples(build_dataloader(train, micro_batch_size=2, num_workers=0), 100)
    loader = iter(build_dataloader(train, micro_batch_size=2, num_workers=0))
    ramped, consumed, steps = [], 0, 0
    while consumed < 150:
        batch = ramp.batch_at(consumed)
        ramped += samples(loader, batch // 2)
        consumed, steps = consumed + batch, steps + 1
        assert consumed == ramp.consumed_samples(steps)
    assert ramped == plain[:consumed] and steps > 5
    k = steps // 2  # a resume in the ramp: Megatron's checkpoint at step k
    at = ramp.consumed_samples(k)
    resumed = build_dataloader(train, micro_batch_size=2, num_workers=0, consumed_samples=at)
    assert samples(resumed, 10) == plain[at : at + 20]
