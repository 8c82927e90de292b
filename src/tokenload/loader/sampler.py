"""Batch samplers with Megatron-LM's semantics over one global order.

``PretrainingSampler`` (Megatron's ``MegatronPretrainingSampler``, ``--dataloader-type single``):
the global order is the dataset's own index order; it is cut into micro-batch groups of
``micro_batch_size * dp_size`` consecutive indices starting at ``consumed_samples``, and rank r
takes ``[r * mbs, (r + 1) * mbs)`` of each group. So global sample k is the same whatever the
data-parallel size: the topology only decides who reads it, and resuming at ``consumed_samples``
on another data-parallel size neither repeats nor skips a sample.

``CyclicSampler`` (``MegatronPretrainingRandomSampler``, ``--dataloader-type cyclic``): a new
``torch.randperm`` per epoch seeded by the epoch number, bucketed per rank (data sharding) or
strided; reproduced exactly, including its dependence on the data-parallel size.

Samplers yield lists of dataset indices, one micro-batch per step, with O(1) work per batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class MicroBatchPlan:
    """How one rank cuts the global order."""

    total_samples: int
    """Length of the global order (the dataset length)."""
    micro_batch_size: int
    """Samples per micro-batch per rank."""
    dp_rank: int = 0
    """This rank's data-parallel index."""
    dp_size: int = 1
    """Number of data-parallel ranks."""
    drop_last: bool = True
    """Drop a last incomplete group of ``micro_batch_size * dp_size`` samples; if False every rank
    takes one more (short, possibly empty) micro-batch."""

    def __post_init__(self) -> None:
        if self.total_samples <= 0:
            raise ConfigError(
                f"the dataset has {self.total_samples} samples; a loader needs at least one",
                hint="check the data and split (a split built for 0 samples, such as a Megatron"
                " job's valid split under `--eval-iters 0`, needs no loader)",
            )
        if self.micro_batch_size < 1 or self.dp_size < 1:
            raise ConfigError(
                f"micro_batch_size={self.micro_batch_size}, dp_size={self.dp_size}; both must be"
                " >= 1",
                hint="pass positive sizes",
            )
        if not 0 <= self.dp_rank < self.dp_size:
            raise ConfigError(
                f"dp_rank {self.dp_rank} outside [0, {self.dp_size})", hint="check the rank"
            )

    @property
    def group(self) -> int:
        """Samples consumed globally per micro-batch step (``micro_batch_size * dp_size``)."""
        return self.micro_batch_size * self.dp_size


class PretrainingSampler:
    """Megatron's default pretraining sampler; iterating starts at ``consumed_samples``."""

    def __init__(self, plan: MicroBatchPlan, consumed_samples: int = 0) -> None:
        if not 0 <= consumed_samples <= plan.total_samples:
            raise ConfigError(
                f"consumed_samples is {consumed_samples}, expected within"
                f" [0, {plan.total_samples}]",
                hint="the run needs more samples than the dataset holds; build it with more"
                " samples",
            )
        self.plan = plan
        self.consumed_samples = consumed_samples

    def __len__(self) -> int:
        full, rest = divmod(self.plan.total_samples - self.consumed_samples, self.plan.group)
        return full + (0 if self.plan.drop_last or rest == 0 else 1)

    def __iter__(self) -> Iterator[list[int]]:
        p = self.plan
        start = self.consumed_samples
        full = (p.total_samples - start) // p.group
        offset = start + p.dp_rank * p.micro_batch_size
        for step in range(full):
            base = offset + step * p.group
            yield list(range(base, base + p.micro_batch_size))
        if not p.drop_last and start + full * p.group < p.total_samples:
            # Like Megatron, every rank takes a last step, possibly short or empty, so all ranks
            # run the same number of steps and none waits in a collective for the others.
            base = offset + full * p.group
            yield list(range(base, min(base + p.micro_batch_size, p.total_samples)))


class CyclicSampler:
    """Megatron's random (cyclic) sampler: one ``torch.randperm`` per epoch, seeded by the epoch."""

    def __init__(
        self, plan: MicroBatchPlan, consumed_samples: int = 0, *, data_sharding: bool = True
    ) -> None:
        self.plan = plan
        self.consumed_samples = consumed_samples
        self.data_sharding = data_sharding
        self.active = plan.total_samples - plan.total_samples % plan.group
        if self.active == 0:
            raise ConfigError(
                f"{plan.total_samples} samples hold no full group of {plan.group}",
                hint="use a smaller micro batch or data-parallel size",
            )
        if (consumed_samples % self.active) % plan.group:
            raise ConfigError(
                f"consumed_samples {consumed_samples} is not a multiple of micro_batch_size"
                f" * dp_size = {plan.group} within the epoch",
                hint="resume at a step boundary of the new topology",
            )

    def __len__(self) -> int:
        return (self.active - self.consumed_samples % self.active) // self.plan.group

    def __iter__(self) -> Iterator[list[int]]:
        import torch

        p = self.plan
        epoch, in_epoch = divmod(self.consumed_samples, self.active)
        g = torch.Generator()
        g.manual_seed(epoch)
        if self.data_sharding:
            bucket = (p.total_samples // p.group) * p.micro_batch_size
            order = torch.randperm(bucket, generator=g)[in_epoch // p.dp_size :]
            indices = order + p.dp_rank * bucket
        else:
            full = (p.total_samples // p.micro_batch_size) * p.micro_batch_size
            indices = torch.randperm(full, generator=g)[in_epoch:][p.dp_rank :: p.dp_size]
        mbs = p.micro_batch_size
        for i in range(0, len(indices) - mbs + 1, mbs):  # lists per step, not one for the epoch
            yield indices[i : i + mbs].tolist()


BatchSampler = PretrainingSampler | CyclicSampler
"""A loader's batch sampler: lists of dataset indices, one micro-batch per step."""
