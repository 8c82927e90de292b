"""GPT-NeoX's sample order: its ``GPT2Dataset`` and ``BlendableDataset`` indices, bit for bit.

GPT-NeoX (``megatron/data/`` of EleutherAI/gpt-neox) keeps the Megatron index maths of 2021,
which differs from megatron-core's in a few places that change the order:

* one ``RandomState(seed)`` per dataset, one shuffle of all ``E`` epochs of documents and one
  of all samples: there is no separated final epoch;
* the sample index is Megatron's with the extra token and drop-last always on, but its dtype is
  chosen from the sample count (int32 while ``2 * ((E*T - 1) / S + 1) < 2**31 - 1``, float
  division), not from the document-index length;
* a dataset serves ``len(shuffle_index) - 1`` samples, one fewer than it built; an index past
  the shuffle index falls back to ``index % len`` (an ``except IndexError`` in ``__getitem__``);
* splits cut cumulative ``int(round(w * N))`` boundaries and push the rounding error onto every
  boundary but the first; blends ask ``ceil(N * w * 1.005)`` samples of each dataset and blend
  ``sum(len(dataset))`` samples with a uint8 dataset index (fewer than 255 datasets).

The arrays come from the same vectorized builders as the megatron order (``document``,
``sample``, ``shuffle``, ``blending``); this module only feeds them NeoX's parameters, so no
Python loop runs per document or sample. Only ``pack_impl="packed"`` (NeoX's default) is
covered: the other packings are loops over documents with data-dependent skips.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from tokenload.errors import ConfigError
from tokenload.index.blending import build_blending_indices
from tokenload.index.document import as_sequence_ids, build_document_index, tokens_per_epoch
from tokenload.index.epochs import num_epochs as megatron_num_epochs
from tokenload.index.sample import build_sample_index
from tokenload.index.shuffle import build_shuffle_index
from tokenload.index.splits import SPLIT_NAMES, normalize

__all__ = [
    "BlendSamples",
    "NEOX_MAX_DATASETS",
    "NEOX_SURPLUS",
    "NeoXIndices",
    "build_neox_blending_indices",
    "build_neox_gpt_indices",
    "neox_blend_num_samples",
    "neox_index_file_names",
    "neox_item_position",
    "neox_num_epochs",
    "neox_sample_index_dtype",
    "neox_split_boundaries",
    "neox_split_ranges",
    "neox_weights_by_num_docs",
]

NEOX_SURPLUS = 1.005
"""Factor on each blended dataset's share of the requested samples (NeoX's fixed 0.5%)."""

NEOX_MAX_DATASETS = 254
"""Most datasets one NeoX blend holds: ``dataset_index`` is uint8 and NeoX asserts ``< 255``."""

_INT32_MAX = int(np.iinfo(np.int32).max)


@dataclass(frozen=True, kw_only=True, eq=False)
class NeoXIndices:
    """The three index arrays of one NeoX ``GPT2Dataset`` and the epoch facts behind them."""

    document_index: npt.NDArray[np.int32]
    """Sequence ids of all epochs, shuffled together (int32)."""

    sample_index: npt.NDArray[np.int32] | npt.NDArray[np.int64]
    """``(n + 1, 2)`` rows of (document-index position, token offset); dtype per
    ``neox_sample_index_dtype``."""

    shuffle_index: npt.NDArray[np.uint32] | npt.NDArray[np.int64]
    """A permutation of ``arange(n)`` (uint32, int64 from ``2**32 - 2`` samples)."""

    num_epochs: int
    """Passes over the documents (``E``)."""

    tokens_per_epoch: int
    """Tokens in one pass over the dataset's sequences (``T``)."""

    @property
    def num_built(self) -> int:
        """Samples in the sample index (``n``), one more than the dataset serves."""
        return int(self.sample_index.shape[0]) - 1

    def __len__(self) -> int:
        # NeoX: min(len(shuffle_idx) - 1, len(sample_idx) - 1) = n - 1. For n == 0 NeoX's
        # __len__ returns -1 (len() then raises); an empty dataset is the honest answer here.
        return max(0, self.num_built - 1)


def neox_num_epochs(*, tokens_per_epoch: int, num_samples: int, sequence_length: int) -> int:
    """NeoX's ``_num_epochs``: the smallest ``E >= 1`` with ``(E*T - 1) // S >= num_samples``.

    That is Megatron's criterion with the extra token (``E*T >= num_samples*S + 1``). NeoX
    loops forever on an empty dataset; here that is a ``ConfigError``.
    """
    return megatron_num_epochs(
        tokens_per_epoch=tokens_per_epoch,
        num_samples=num_samples,
        sequence_length=sequence_length,
        extra=1,
    )


def neox_sample_index_dtype(
    num_epochs: int, tokens_per_epoch: int, sequence_length: int
) -> np.dtype:
    """int32 if ``2 * ((E*T - 1) / S + 1) < 2**31 - 1`` in float64 (NeoX's test), else int64."""
    samples = float(int(num_epochs) * int(tokens_per_epoch) - 1) / float(sequence_length)
    return np.dtype(np.int32 if 2 * (samples + 1) < _INT32_MAX else np.int64)


def _check_neox_inputs(tokens: int, sequence_length: int) -> None:
    # NeoX's helpers.cpp asserts both (compiled without NDEBUG: the process aborts).
    if isinstance(sequence_length, bool) or not isinstance(sequence_length, (int, np.integer)):
        raise ConfigError(f"sequence_length is {sequence_length!r}; expected an int")
    if not 2 <= sequence_length <= _INT32_MAX:
        raise ConfigError(
            f"sequence_length is {sequence_length}; expected 2..{_INT32_MAX} "
            "(GPT-NeoX's sample-index builder asserts seq_length > 1)"
        )
    if tokens <= 1:
        raise ConfigError(
            f"the dataset holds {tokens} tokens; expected at least 2 "
            "(GPT-NeoX asserts tokens_per_epoch > 1 and loops forever on an empty dataset)",
            hint="give the split more data or change the split string",
        )


def build_neox_gpt_indices(
    sequence_lengths: npt.ArrayLike,
    documents: npt.ArrayLike,
    *,
    num_samples: int | None,
    sequence_length: int,
    seed: int = 1234,
    num_epochs: int | None = None,
) -> NeoXIndices:
    """Build NeoX's ``doc_idx``, ``sample_idx`` and ``shuffle_idx`` (``pack_impl="packed"``).

    ``sequence_lengths``: every sequence length of the token file; ``documents``: the sequence
    ids of the dataset (``arange(begin, end)`` of a split, or all of a weighted path);
    ``num_samples``: the samples asked for (``None`` with ``num_epochs``, NeoX's
    ``train_epochs`` mode); ``num_epochs``: NeoX's epoch override (a falsy value means "compute
    it from ``num_samples``", as in NeoX). Bit-identical to ``_build_index_mappings``.
    """
    lengths = np.asarray(sequence_lengths)
    docs = as_sequence_ids(documents)
    if docs.size == 0:
        raise ConfigError("the dataset has no sequences; expected at least one")
    if int(docs.min()) < 0 or int(docs.max()) >= lengths.shape[0]:
        raise ConfigError(
            f"documents hold ids in [{int(docs.min())}, {int(docs.max())}]; expected "
            f"0..{lengths.shape[0] - 1} (the file's sequence count)"
        )
    tokens = tokens_per_epoch(lengths, docs)
    _check_neox_inputs(tokens, sequence_length)
    if not num_epochs:
        if num_samples is None:
            raise ConfigError(
                "num_samples and num_epochs are both unset; expected one of them "
                "(GPT-NeoX's train_iters or train_epochs)"
            )
        num_epochs = neox_num_epochs(
            tokens_per_epoch=tokens, num_samples=num_samples, sequence_length=sequence_length
        )
    elif not 1 <= num_epochs <= _INT32_MAX:
        raise ConfigError(f"num_epochs is {num_epochs}; expected 1..{_INT32_MAX}")
    rng = np.random.RandomState(seed)
    document_index = build_document_index(docs, num_epochs, rng, False)
    sample_index = build_sample_index(
        lengths,
        document_index,
        sequence_length=sequence_length,
        num_epochs=num_epochs,
        tokens_per_epoch=tokens,
        drop_last=True,
        extra=1,
    )
    # Same values as Megatron's; only the dtype rule differs (a copy only when they disagree).
    sample_index = sample_index.astype(
        neox_sample_index_dtype(num_epochs, tokens, sequence_length), copy=False
    )
    total = sample_index.shape[0] - 1
    shuffle_index = build_shuffle_index(total, total, rng)
    return NeoXIndices(
        document_index=document_index,
        sample_index=sample_index,
        shuffle_index=shuffle_index,
        num_epochs=int(num_epochs),
        tokens_per_epoch=tokens,
    )


def neox_item_position(index: npt.ArrayLike, num_built: int) -> npt.NDArray[np.int64]:
    """Shuffle-index position NeoX's ``GPT2Dataset.__getitem__`` reads for dataset ``index``.

    ``shuffle_idx[index]`` exists for ``index < n`` (``n = num_built``), so ``n - 1`` is served
    although ``len == n - 1``; a larger index raises ``IndexError`` inside ``__getitem__``,
    which retries with ``index % (n - 1)``. Blends reach such indices when the greedy draws
    more samples from a dataset than it holds. With ``n = 1`` (a blend member asked for one
    sample) NumPy's ``index % 0`` is 0: every index reads position 0, as NeoX serves it.
    """
    idx = np.asarray(index, dtype=np.int64)
    if num_built < 1:
        raise ConfigError(
            f"the dataset built {num_built} samples; expected at least 1",
            hint="NeoX fails on it too: give the split more data, or fewer samples",
        )
    if idx.size and int(idx.min()) < 0:
        raise ConfigError(f"index {int(idx.min())}; expected non-negative indices")
    if num_built == 1:
        return np.zeros_like(idx)
    return np.where(idx < num_built, idx, idx % (num_built - 1))


def neox_split_boundaries(split: str, num_sequences: int) -> list[int]:
    """NeoX's ``get_train_valid_test_split_``: four sequence ids bounding train/valid/test.

    Weights are split on ``,`` (else ``/``), at most three are used, normalized by their Python
    sum; ``b[k+1] = b[k] + int(round(w_k * N))``; then ``b[-1] - N`` is subtracted from every
    boundary but the first, so the last is ``N`` (and one may end below its predecessor).
    """
    if not isinstance(split, str):
        raise ConfigError(f"split is {split!r}; expected a string such as '969, 30, 1'")
    if num_sequences < 0:
        raise ConfigError(f"num_sequences is {num_sequences}; expected >= 0")
    sep = "," if "," in split else "/" if "/" in split else None
    parts = split.split(sep) if sep else [split]
    try:
        weights = [float(p) for p in parts]
    except ValueError:
        raise ConfigError(
            f"split {split!r} has a malformed number; expected numbers like '969, 30, 1'"
        ) from None
    weights = (weights + [0.0] * len(SPLIT_NAMES))[: len(SPLIT_NAMES)]
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0.0:
        raise ConfigError(
            f"split {split!r} gives weights {weights}; expected non-negative numbers with a "
            "positive sum",
            hint="write the split as three non-negative numbers, e.g. '969, 30, 1'",
        )
    total = sum(weights)
    bounds = [0]
    for w in [w / total for w in weights]:
        bounds.append(bounds[-1] + int(round(w * float(num_sequences))))  # noqa: RUF046 (NumPy floats)
    diff = bounds[-1] - num_sequences
    return [bounds[0]] + [b - diff for b in bounds[1:]]


def neox_split_ranges(split: str, num_sequences: int) -> list[tuple[int, int] | None]:
    """``[begin, end)`` per split from ``neox_split_boundaries``; ``None`` where NeoX builds no
    dataset (``end <= begin``). A built range starting below 0 is a ``ConfigError`` (NeoX fails
    an assertion there)."""
    b = neox_split_boundaries(split, num_sequences)
    ranges: list[tuple[int, int] | None] = []
    for name, begin, end in zip(SPLIT_NAMES, b[:-1], b[1:]):
        if end <= begin:
            ranges.append(None)
            continue
        if begin < 0:
            raise ConfigError(
                f"split {split!r} on {num_sequences} sequences gives the {name} split the range "
                f"[{begin}, {end}); expected ids >= 0 (GPT-NeoX fails an assertion here)",
                hint="give the split more sequences or a split string without a zero weight "
                "before a non-zero one",
            )
        ranges.append((begin, end))
    return ranges


def _check_blend_weights(weights: Sequence[float]) -> list[float]:
    w = [float(x) for x in weights]
    if not w:
        raise ConfigError("blend weights are empty; expected one weight per data path")
    if len(w) > NEOX_MAX_DATASETS:
        raise ConfigError(
            f"the blend has {len(w)} datasets; expected at most {NEOX_MAX_DATASETS} "
            "(GPT-NeoX's dataset index is uint8)",
            hint="merge data paths into fewer token files (tokenload merge)",
        )
    if any(not math.isfinite(x) or x <= 0 for x in w):
        # NeoX accepts a zero weight, but its greedy blend still draws from such a dataset on
        # ties (ties go to the lowest index): refused rather than reproduced.
        raise ConfigError(
            f"blend weights {w}; expected positive finite numbers",
            hint="drop a data path instead of giving it weight 0",
        )
    return w


class BlendSamples(NamedTuple):
    """A NeoX blend's normalized weights and the samples built per member."""

    weights: list[float]
    num_samples: list[int | None]
    """``ceil(N x w x 1.005)`` per member; None for NeoX's epoch mode."""


def neox_blend_num_samples(weights: Sequence[float], num_samples: int | None) -> BlendSamples:
    """NeoX's ``get_normalized_weights_and_num_samples``: weights over their Python sum, and
    ``int(ceil(num_samples * w * 1.005))`` samples asked of each dataset (``None`` if no count)."""
    w = _check_blend_weights(weights)
    total = sum(w)
    w = [x / total for x in w]
    if num_samples is None:
        return BlendSamples(w, [None for _ in w])
    return BlendSamples(w, [int(math.ceil(num_samples * x * NEOX_SURPLUS)) for x in w])  # noqa: RUF046


def neox_weights_by_num_docs(num_docs: Sequence[int], alpha: float = 0.3) -> list[float]:
    """NeoX's ``weights_by_num_docs`` (``weight_by_num_documents``): ``p ∝ (n/N) ** alpha``
    times ``1 - n/N``, normalized, all in Python floats in NeoX's order of operations.

    ``num_docs`` are the sequence counts of the weighted token files (NeoX's
    ``indexed_dataset.sizes.shape[0]``); NeoX's config default for ``alpha`` is 1.0.
    """
    counts = [int(n) for n in num_docs]
    if not counts or any(n < 0 for n in counts) or sum(counts) <= 0:
        raise ConfigError(
            f"document counts {counts}; expected non-negative counts with a positive sum"
        )
    if len(counts) == 1:
        return [1.0]
    total_docs = sum(counts)
    unbiased = [n / total_docs for n in counts]
    probs = [p**alpha for p in unbiased]
    total = sum(probs)
    probs = [p / total for p in probs]
    weights = [p * (1 - u) for p, u in zip(probs, unbiased)]
    total = sum(weights)
    if not total > 0:
        raise ConfigError(
            f"document counts {counts} give no positive weight; expected two non-empty files"
        )
    return [x / total for x in weights]


def build_neox_blending_indices(
    weights: Sequence[float], lengths: Sequence[int]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """NeoX's ``BlendableDataset`` indices: ``(dataset_index uint8, dataset_sample_index int64)``.

    ``weights``: as NeoX passes them (the output of ``neox_blend_num_samples``); they are
    normalized once more by a NumPy float64 sum, as ``BlendableDataset`` does. ``lengths``: the
    datasets' ``len`` (``len(NeoXIndices)``); the blend holds ``sum(lengths)`` samples. The
    greedy may draw more samples from a dataset than it holds; ``neox_item_position`` maps them.
    """
    w = _check_blend_weights(weights)
    sizes = [int(n) for n in lengths]
    if len(sizes) != len(w) or any(n < 0 for n in sizes):
        raise ConfigError(
            f"{len(sizes)} lengths {sizes} for {len(w)} weights; expected one length >= 0 each"
        )
    dataset_index, dataset_sample_index = build_blending_indices(normalize(w), sum(sizes))
    return dataset_index.astype(np.uint8), dataset_sample_index


def neox_index_file_names(
    prefix: str,
    name: str,
    *,
    num_samples: int | None,
    sequence_length: int,
    seed: int,
    pack_impl: str = "packed",
    allow_chopped: bool = True,
) -> dict[str, str]:
    """NeoX's cache files next to the data: ``{"doc_idx", "sample_idx", "shuffle_idx"}`` paths.

    ``name`` is ``train``/``valid``/``test`` for a split ``data_path`` and ``train_0``,
    ``valid_1``, ... for weighted paths; ``num_samples`` prints as ``None`` in epoch mode.
    """
    stem = f"{prefix}_{name}_indexmap_{num_samples}ns_{sequence_length}sl_{seed}s_{pack_impl}pi" + (
        "_ac" if allow_chopped else ""
    )
    return {kind: f"{stem}_{kind}.npy" for kind in ("doc_idx", "sample_idx", "shuffle_idx")}
