"""``build_datasets``: the one entry that builds a configuration's datasets, in its order.

``MegatronDataConfig`` is the flat façade; ``build_datasets`` converts it once (``typed()``)
into the shared ``DataConfig`` and the order's record, and the record's type picks the package
that builds: ``MegatronOptions`` -> ``datasets.megatron`` (Megatron-LM's indices and caches),
``ComputedOptions`` -> ``datasets.computed`` (windows in a keyed permutation, no index build),
``NeoxOptions`` -> ``datasets.neox`` (GPT-NeoX's order). Each package reads only those two
records.
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import (
    ComputedOptions,
    DataConfig,
    MegatronDataConfig,
    MegatronOptions,
    NeoxOptions,
    OrderOptions,
    Splits,
)
from .megatron.builder import build_megatron

__all__ = ["Splits", "build_datasets", "build_typed"]


def build_datasets(config: MegatronDataConfig, sizes: Sequence[int | None]) -> Splits:
    """The (train, valid, test) datasets of ``config``, as Megatron's builder makes them.

    ``sizes`` are the numbers of samples wanted from each split, as Megatron computes them
    (train: ``train_iters * global_batch_size``; valid and test: the evaluation iterations times
    the global batch size). A number larger than one epoch of the split repeats its data, each
    epoch shuffled anew. ``None`` asks for one epoch of that split (a weighted blend needs a
    number, as in Megatron). A split whose fraction in ``config.split`` is zero is ``None`` in
    the result.

    ``len(train)`` is the number of samples the dataset holds, each ``sequence_length`` tokens
    (+1 with ``add_extra_token``); a loader draws indices ``0 .. len(train) - 1``. For one prefix
    it is every whole sample of the epochs the request needs, so it can exceed the request by up
    to an epoch; for a weighted blend, the request rounded up per prefix; for a blend without
    weights, the request or all the prefixes' samples if fewer; for ``None``, one epoch.

    Call it on every rank: ``config.build_policy`` decides who builds, writes, waits and loads.
    Every dataset returned carries ``startup_phases`` (seconds per phase of this call). The
    result is a ``Splits`` (a NamedTuple: ``train, valid, test = build_datasets(...)``).
    """
    data, order = config.typed()
    return build_typed(data, order, sizes)


def build_typed(data: DataConfig, order: OrderOptions, sizes: Sequence[int | None]) -> Splits:
    """``build_datasets`` of the typed configs: the order's record picks its package."""
    if isinstance(order, ComputedOptions):
        from .computed.computed_dataset import build_computed

        return build_computed(data, order, sizes)
    if isinstance(order, NeoxOptions):
        from .neox.neox_dataset import build_neox

        return build_neox(data, order, sizes)
    assert isinstance(order, MegatronOptions)
    return build_megatron(data, order, sizes)
