"""The dataset plan: which prefix and split gets which number of samples, and how splits blend.

This is Megatron's ``BlendedMegatronDatasetBuilder`` with the building taken out. For each of
the three splits it says which mid-level ``GPTDataset`` s exist (prefix, the bookend selecting
its sequences, the requested ``num_samples``) and whether a ``BlendedDataset`` wraps them, with
which weights and size. Five cases (spec §3.3):

1. one prefix, no weights: a plain dataset with ``num_samples = sizes[k]``;
2. weights and a size: mid-level datasets asking for ``buffer`` samples, blended to ``sum(target)``;
3. weights without a size: an error (Megatron asserts this for every split, used or not);
4. no weights, a size: one epoch per dataset, blended by length to ``min(size, sum(lengths))``;
5. no weights, no size: one epoch per dataset, blended exhaustively (``sum(lengths)`` samples).

Cases 4 and 5 need the mid-level lengths, known only after the indices are built, so the plan
leaves them open and ``resolve_blend`` finishes them. The arithmetic (two normalizations,
``ceil(ceil(size * w) * (1 + surplus))``) is kept exactly as Megatron's because its results reach
the cache hashes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from tokenload.errors import ConfigError
from tokenload.index.blends import Blend
from tokenload.index.splits import (
    SPLIT_NAMES,
    Bookend,
    SplitMatrix,
    normalize,
    split_matrix,
    spoofed_split_matrix,
)

__all__ = [
    "DEFAULT_SURPLUS",
    "MOCK_SPLIT",
    "MidLevelPlan",
    "SplitPlan",
    "plan_splits",
    "resolve_blend",
    "samples_per_dataset",
]

DEFAULT_SURPLUS = 0.005
"""Megatron's default ``--mid-level-dataset-surplus``."""

MOCK_SPLIT = "1,1,1"
"""The split mock mode forces, whatever was asked."""


@dataclass(frozen=True, kw_only=True)
class MidLevelPlan:
    """One mid-level (per-prefix, per-split) dataset to build."""

    prefix: str | None
    """Token-file prefix as given in the blend; ``None`` for the mock dataset."""

    split: str
    """``"train"``, ``"valid"`` or ``"test"``."""

    bookend: Bookend
    """Fractions of the file's sequences this dataset takes (see ``split_range``)."""

    num_samples: int | None
    """Samples requested (at least this many are built), or ``None`` for exactly one epoch."""


@dataclass(frozen=True, kw_only=True)
class SplitPlan:
    """What one split is made of."""

    split: str
    """``"train"``, ``"valid"`` or ``"test"``."""

    datasets: tuple[MidLevelPlan, ...]
    """The mid-level datasets, in blend order."""

    blended: bool
    """Whether a ``BlendedDataset`` wraps ``datasets`` (False: the split is ``datasets[0]``)."""

    weights: tuple[float, ...] | None
    """Weighted blend: the final normalized weights (as in the blend's cache description).
    ``None`` when the blend is weighted by the mid-level lengths (cases 4 and 5)."""

    size: int | None
    """Weighted blend: the blend size ``sum(target)``. Length-weighted: the requested size (to be
    capped by ``sum(lengths)``) or ``None`` for the exhaustive blend. Unblended: ``None``."""


def samples_per_dataset(
    weights: Sequence[float], sizes: Sequence[int], surplus: float = 0.0
) -> list[list[int]]:
    """Per dataset and split: ``int(ceil(ceil(size * w) * (1 + surplus)))`` (Megatron's formula).

    With ``surplus=0`` these are the *targets* (what the blend draws), with the configured
    surplus the *buffers* (what each mid-level dataset is asked to hold). ``weights`` must be
    normalized.
    """
    if not np.isclose(sum(weights), 1.0):
        raise ConfigError(f"weights {list(weights)} sum to {sum(weights)}; expected normalized")
    return [
        # int(): surplus may be a NumPy scalar, whose __ceil__ need not return an int
        [int(math.ceil(math.ceil(size * w) * (1 + surplus))) for size in sizes]  # noqa: RUF046
        for w in weights
    ]


def _check_sizes(sizes: Sequence[int | None]) -> list[int | None]:
    sizes = list(sizes)
    if len(sizes) != len(SPLIT_NAMES):
        raise ConfigError(f"sizes has {len(sizes)} entries; expected 3 (train, valid, test)")
    for name, s in zip(SPLIT_NAMES, sizes):
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0):
            raise ConfigError(f"{name} size is {s!r}; expected a non-negative int or None")
    return [None if s is None else int(s) for s in sizes]


def _check_weighted_sizes(blend: Blend | None, sizes: list[int | None], name: str) -> None:
    if blend is not None and blend.weights is not None and sizes[SPLIT_NAMES.index(name)] is None:
        raise ConfigError(
            f"the {name} blend has weights but the {name} size is None; expected a size",
            hint=f"pass an int size for {name} (0 if the split is unused), or drop the weights",
        )


def plan_splits(
    *,
    blend: Blend | None = None,
    blend_per_split: Sequence[Blend | None] | None = None,
    split: str | None = None,
    sizes: Sequence[int | None],
    surplus: float = DEFAULT_SURPLUS,
) -> list[SplitPlan | None]:
    """Plan the three splits like Megatron's builder; ``None`` for a split that is not built.

    Exactly one of ``blend`` (with ``split``) and ``blend_per_split`` may be given; neither means
    mock mode (one ``MockGPTDataset`` per split, split forced to ``"1,1,1"``). ``sizes`` are the
    requested train/valid/test sample counts (``None`` = one epoch / exhaustive).
    """
    sizes = _check_sizes(sizes)
    if surplus < 0 or not math.isfinite(surplus):
        raise ConfigError(f"mid_level_dataset_surplus is {surplus}; expected a finite value >= 0")
    if blend is not None and blend_per_split is not None:
        raise ConfigError("both blend and blend_per_split are given; expected at most one")
    if blend_per_split is not None:
        blends = list(blend_per_split)
        if len(blends) != len(SPLIT_NAMES):
            raise ConfigError(f"blend_per_split has {len(blends)} entries; expected 3")
        for name, b in zip(SPLIT_NAMES, blends):
            _check_weighted_sizes(b, sizes, name)
        return [
            None if b is None else _plan_per_split(b, k, sizes, surplus)
            for k, b in enumerate(blends)
        ]
    if blend is None:
        matrix = split_matrix(MOCK_SPLIT)
        return [_single(None, SPLIT_NAMES[k], matrix[k], sizes[k]) for k in range(3)]
    if split is None:
        raise ConfigError("a blend needs a split string; expected e.g. split='969,30,1'")
    for name in SPLIT_NAMES:
        _check_weighted_sizes(blend, sizes, name)
    return _plan_blend(blend, split_matrix(split), sizes, surplus)


def _single(
    prefix: str | None, name: str, bookend: Bookend | None, size: int | None
) -> SplitPlan | None:
    if bookend is None:
        return None
    mid = MidLevelPlan(prefix=prefix, split=name, bookend=bookend, num_samples=size)
    return SplitPlan(split=name, datasets=(mid,), blended=False, weights=None, size=None)


def _plan_blend(
    blend: Blend, matrix: SplitMatrix, sizes: Sequence[int | None], surplus: float
) -> list[SplitPlan | None]:
    if len(blend.prefixes) == 1 and blend.weights is None:
        return [_single(blend.prefixes[0], SPLIT_NAMES[k], matrix[k], sizes[k]) for k in range(3)]
    buffer: Sequence[Sequence[int | None]]
    if blend.weights is None:
        final = None
        buffer = [[None] * len(SPLIT_NAMES) for _ in blend.prefixes]
    else:
        weights = normalize(blend.weights)
        final = tuple(normalize(weights))  # Megatron normalizes twice; the result enters the hash
        # a weighted blend has every size (_check_weighted_sizes)
        counts = cast("Sequence[int]", sizes)
        target = samples_per_dataset(weights, counts)
        buffer = samples_per_dataset(weights, counts, surplus)
    plans: list[SplitPlan | None] = []
    for k, name in enumerate(SPLIT_NAMES):
        bookend = matrix[k]
        if bookend is None:
            plans.append(None)
            continue
        mids = tuple(
            MidLevelPlan(prefix=p, split=name, bookend=bookend, num_samples=b[k])
            for p, b in zip(blend.prefixes, buffer)
        )
        size = sizes[k] if final is None else sum(t[k] for t in target)
        plans.append(SplitPlan(split=name, datasets=mids, blended=True, weights=final, size=size))
    return plans


def _plan_per_split(blend: Blend, k: int, sizes: Sequence[int | None], surplus: float) -> SplitPlan:
    """Megatron's per-split mode: the blend code on a matrix where only split ``k`` exists, with
    no samples asked of the others."""
    matrix = spoofed_split_matrix(k)
    if len(blend.prefixes) == 1:  # used directly, even when weighted
        plan = _single(blend.prefixes[0], SPLIT_NAMES[k], matrix[k], sizes[k])
    else:
        plan = _plan_blend(
            blend, matrix, [sizes[k] if i == k else 0 for i in range(len(SPLIT_NAMES))], surplus
        )[k]
    assert plan is not None
    return plan


def resolve_blend(
    plan: SplitPlan, lengths: Sequence[int]
) -> tuple[list[float] | list[int], int | None]:
    """Return the ``(weights, size)`` the split's ``BlendedDataset`` is built with.

    ``lengths`` are the built mid-level datasets' lengths. Weighted blends return the planned
    values. Length-weighted blends return normalized lengths and ``min(size, sum(lengths))``
    (case 4) or the integer lengths and ``None`` (case 5, exhaustive). These are also the
    ``weights``/``size`` of the blend's cache description.
    """
    if not plan.blended:
        raise ConfigError(f"the {plan.split} split is not blended; expected a blended plan")
    lengths = [int(n) for n in lengths]
    if len(lengths) != len(plan.datasets):
        raise ConfigError(
            f"{len(lengths)} lengths for {len(plan.datasets)} datasets; expected one per dataset"
        )
    if plan.weights is not None:
        return list(plan.weights), plan.size
    for mid, n in zip(plan.datasets, lengths):
        if n <= 0:
            raise ConfigError(
                f"{mid.split} dataset of {mid.prefix!r} has {n} samples; expected > 0 "
                "(an unweighted blend weights datasets by their length)",
                hint="give the split more data (or a different split string), or drop the prefix",
            )
    if plan.size is None:
        return lengths, None
    return normalize(lengths), min(plan.size, sum(lengths))
