"""``build_datasets``: the one entry that builds a configuration's datasets, in its order.

The order (``MegatronDataConfig.order``) picks the package that builds: ``datasets.megatron``
(Megatron-LM's indices and caches), ``datasets.computed`` (windows in a keyed permutation, no
index build) or ``datasets.neox`` (GPT-NeoX's order). ``MegatronDataConfig`` holds every field
flat; the fields of one order only are read here, once, into that order's options record
(``MegatronOptions``, ``ComputedOptions``, ``NeoxOptions``), which its package takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .config import MegatronDataConfig
from .megatron.builder import MegatronOptions, build_megatron_datasets

__all__ = ["build_datasets"]


def build_datasets(
    config: MegatronDataConfig, sizes: Sequence[int | None]
) -> tuple[Any | None, Any | None, Any | None]:
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
    Every dataset returned carries ``startup_phases`` (seconds per phase of this call).
    """
    if config.order == "computed":
        from .computed.computed_dataset import ComputedOptions, build_computed_datasets

        return build_computed_datasets(config, sizes, ComputedOptions.from_config(config))
    if config.order == "neox":
        from .neox.neox_dataset import NeoxOptions, build_neox_datasets

        return build_neox_datasets(config, sizes, NeoxOptions.from_config(config))
    return build_megatron_datasets(config, sizes, MegatronOptions.from_config(config))
