"""Pure index maths of Megatron's sample order, NumPy only.

Splits and blends (``splits``, ``blends``, ``plan``), the per-dataset document / sample /
shuffle indices (``epochs``, ``document``, ``sample``, ``shuffle``, tied together in ``gpt``),
and blending indices (``blending``). Functions take NumPy arrays and small frozen dataclasses and
return arrays bit-identical to megatron-core's; docs/ORDER.md holds the maths and the proofs of
the vectorized equivalences. The package imports only NumPy and ``tokenload.errors``; the caches
of these arrays on disk and in buckets are ``tokenload.caches``.
"""

from __future__ import annotations

from tokenload.index.blending import (
    MAX_DATASETS,
    build_blending_indices,
    build_exhaustive_blending_indices,
    check_oversampling,
)
from tokenload.index.blends import Blend, parse_blend, read_data_args_file, read_per_split_data_args
from tokenload.index.document import as_sequence_ids, build_document_index, tokens_per_epoch
from tokenload.index.epochs import EpochPlan, num_epochs, plan_epochs, separate_final_epoch
from tokenload.index.gpt import (
    GPTIndexConfig,
    GPTIndices,
    build_gpt_indices,
    drop_last_for,
    gpt_length,
    gpt_shapes,
)
from tokenload.index.plan import (
    DEFAULT_SURPLUS,
    MOCK_SPLIT,
    MidLevelPlan,
    SplitPlan,
    plan_splits,
    resolve_blend,
    samples_per_dataset,
)
from tokenload.index.sample import build_sample_index, num_samples_in_index, sample_index_dtype
from tokenload.index.shuffle import build_shuffle_index, shuffle_index_dtype
from tokenload.index.splits import (
    SPLIT_NAMES,
    normalize,
    parse_split,
    split_matrix,
    split_range,
    split_ranges,
    spoofed_split_matrix,
)

__all__ = [
    # splits and blends
    "SPLIT_NAMES",
    "normalize",
    "parse_split",
    "split_matrix",
    "split_range",
    "split_ranges",
    "spoofed_split_matrix",
    "Blend",
    "parse_blend",
    "read_data_args_file",
    "read_per_split_data_args",
    "DEFAULT_SURPLUS",
    "MOCK_SPLIT",
    "MidLevelPlan",
    "SplitPlan",
    "plan_splits",
    "resolve_blend",
    "samples_per_dataset",
    # one GPT dataset
    "EpochPlan",
    "num_epochs",
    "plan_epochs",
    "separate_final_epoch",
    "as_sequence_ids",
    "tokens_per_epoch",
    "build_document_index",
    "build_sample_index",
    "num_samples_in_index",
    "sample_index_dtype",
    "build_shuffle_index",
    "shuffle_index_dtype",
    "GPTIndexConfig",
    "GPTIndices",
    "build_gpt_indices",
    "drop_last_for",
    "gpt_length",
    "gpt_shapes",
    # blending
    "MAX_DATASETS",
    "build_blending_indices",
    "build_exhaustive_blending_indices",
    "check_oversampling",
]
