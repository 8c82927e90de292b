"""The Megatron order: Megatron-LM's GPT and blended datasets, bit for bit, with its index caches.

``builder`` builds a configuration's splits (Megatron's ``BlendedMegatronDatasetBuilder``);
``gpt_dataset`` and ``blended`` are the datasets it returns; ``cache_rules`` checks, loads and
writes their index caches under the build policy (``policy``); ``cache_match`` checks a cache
without a sidecar against the token file; ``manifest`` is the build manifest a loading rank
reads instead of probing every cache; ``continuable`` is a blend whose weights change
(schedules, ``mixture_change="continue"``). The index maths is ``tokenload.index``.
"""

from __future__ import annotations

from .blended import BlendedDataset
from .builder import MegatronOptions, build_megatron, build_megatron_datasets
from .cache_rules import wait_for_cache_writes
from .gpt_dataset import GPTDataset

__all__ = [
    "BlendedDataset",
    "GPTDataset",
    "MegatronOptions",
    "build_megatron",
    "build_megatron_datasets",
    "wait_for_cache_writes",
]
