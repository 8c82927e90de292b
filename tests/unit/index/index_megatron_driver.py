"""A test-side driver: run a megatron-core builder configuration through tokenload.index.

It plays the role of Megatron's ``BlendedMegatronDatasetBuilder`` using only the pure functions
of ``tokenload.index`` and the sequence lengths of each prefix, so the cross-check and golden
tests can compare every array, hash, file name and length with what megatron-core produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenload.caches import (
    CacheFiles,
    blended_identifiers,
    describe,
    description_hash,
    gpt_identifiers,
)
from tokenload.index import (
    Blend,
    GPTIndexConfig,
    build_blending_indices,
    build_exhaustive_blending_indices,
    build_gpt_indices,
    check_oversampling,
    drop_last_for,
    plan_splits,
    resolve_blend,
    split_matrix,
    split_range,
)

NULL_TOKENIZER = {
    "class": "megatron.core.tokenizers.text.models.default_tokenizer.DefaultTokenizerText",
    "tokenizer_path": None,
    "vocab_size": "1000",
    "pad_id": "-1",
}


@dataclass
class Built:
    """One built dataset: its identifiers, arrays and (for blends) members."""

    identifiers: Any
    arrays: dict[str, np.ndarray]
    length: int
    members: list[Built] = field(default_factory=list)

    @property
    def description(self) -> str:
        return describe(self.identifiers)

    @property
    def hash(self) -> str:
        return description_hash(self.description)

    def files(self) -> list[str]:
        """Every cache file name Megatron writes for this dataset and its members."""
        names = {
            f.split("/")[-1]
            for f in CacheFiles.of("", self.identifiers).megatron_files
        }
        for m in self.members:
            names |= set(m.files())
        return sorted(names)


def _blend(raw) -> Blend | None:
    if raw is None:
        return None
    prefixes, weights = raw
    return Blend(prefixes=tuple(prefixes), weights=None if weights is None else tuple(weights))


def build_config(config: dict, lengths: dict[str | None, np.ndarray], tokenizer=NULL_TOKENIZER,
                 class_name: str = "GPTDataset") -> dict[str, Built | None]:
    """Build every split of a fixture ``config``; raises ConfigError where Megatron fails."""
    blend = _blend(config["blend"])
    per_split = config["blend_per_split"]
    per_split = None if per_split is None else [_blend(b) for b in per_split]
    split = config["split"]
    plans = plan_splits(
        blend=blend,
        blend_per_split=per_split,
        split=split,
        sizes=config["sizes"],
        surplus=config["mid_level_dataset_surplus"],
    )
    matrix = None if split is None else split_matrix(split)
    out: dict[str, Built | None] = {}
    for name, plan in zip(("train", "valid", "test"), plans):
        if plan is None:
            out[name] = None
            continue
        gpt = GPTIndexConfig(
            sequence_length=config["sequence_length"],
            random_seed=config["random_seed"],
            add_extra_token=config["add_extra_token_to_sequence"],
            drop_last=drop_last_for(name, config["drop_last_partial_validation_sequence"]),
        )
        mids = []
        for mid in plan.datasets:
            seq = lengths[mid.prefix]
            beg, end = split_range(mid.bookend, seq.shape[0])
            idx = build_gpt_indices(seq, np.arange(beg, end, dtype=np.int32),
                                    num_samples=mid.num_samples, config=gpt)
            uid = gpt_identifiers(
                class_name=class_name, dataset_path=mid.prefix, num_samples=mid.num_samples,
                index_split=name, random_seed=gpt.random_seed,
                sequence_length=gpt.sequence_length, split=split, split_matrix=matrix,
                tokenizer=tokenizer,
            )
            arrays = {"document_index": idx.document_index, "sample_index": idx.sample_index,
                      "shuffle_index": idx.shuffle_index}
            mids.append(Built(uid, arrays, len(idx)))
        if not plan.blended:
            out[name] = mids[0]
            continue
        weights, size = resolve_blend(plan, [m.length for m in mids])
        if size is None:
            di, dsi = build_exhaustive_blending_indices(weights)
        else:
            di, dsi = build_blending_indices(weights, size)
        check_oversampling(di, [m.length for m in mids], name)
        uid = blended_identifiers(datasets=[m.identifiers for m in mids], split=name,
                                  weights=weights, size=size)
        out[name] = Built(uid, {"dataset_index": di, "dataset_sample_index": dsi},
                          int(di.shape[0]), mids)
    return out
