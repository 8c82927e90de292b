"""GPT-NeoX's datasets: its ``GPT2Dataset`` and ``BlendableDataset`` over token files, in its order.

``build_neox_datasets`` wires the index maths of ``neox_indices`` the way GPT-NeoX's
``build_train_valid_test_data_loaders`` does (``megatron/data/data_utils.py``):

* one ``data_path`` (``config.blend``, a single prefix) is cut by NeoX's split rounding into
  three ``GPT2Dataset``s over contiguous sequence ranges, none where a range is empty;
* ``train/valid/test_data_paths`` (``config.blend_per_split``) become one ``BlendableDataset``
  per split, even for a single path: each path's dataset covers all of its file, is asked
  ``ceil(N * w * 1.005)`` samples, and the blend holds the sum of the members' lengths with a
  uint8 dataset index. Unweighted paths weigh 1.0 each (NeoX's default weights);
  ``weight_by_num_documents`` replaces the weights by NeoX's ``weights_by_num_docs``;
* a size of ``None`` is NeoX's ``train_epochs`` mode: no sample count, ``num_epochs`` passes
  (1 unless given).

Items are what NeoX's ``__getitem__`` returns as ``text`` (``S + 1`` tokens), read and turned
into tokenload's fields by the same code as the Megatron datasets (``megatron.gpt_dataset``,
``datasets.items``): ``tokens = text[:-1]`` and ``labels = text[1:]`` as in NeoX's
``_get_batch``, ``loss_mask`` zero on EOD inputs with ``eod_mask_loss`` (NeoX's rule) and on
negative labels (its ``label_mask``: a signed token file may hold ids such as -100), position
ids ``arange(S)``. A dataset accepts NeoX's indices past its length: they are mapped as NeoX's
``except IndexError`` does (``neox_item_position``), which a blend needs where its greedy draws
more samples from a member than the member holds.

What differs from NeoX, by design:

* a short sample would be padded with 0 in ``tokens``/``labels`` like NeoX's ``text``, but with
  no loss there (NeoX trains on the pad zeros). With NeoX's ``pack_impl="packed"``, the only
  packing reproduced, every sample spans ``S + 1`` tokens, so no sample is ever padded;
* the reset/attention-mask/``cu_seqlens`` options are tokenload's item options (NeoX has none);
  with ``inter_document_masking`` the boundaries are the samples' document pieces, by the
  Megatron order's rule (megatron-core's: the documents' lengths, not EOD tokens), which
  ``GPTDataset.read_batch`` applies;
* the index arrays are built in memory in every process, so no index cache is read or written:
  NeoX's ``*_indexmap_*.npy`` files, ``path_to_cache``, ``cache`` and ``build_policy`` play no
  part, and no collective is called. Measured on a shared 2-core machine (2 M documents,
  sequence length 2048): 2.0 s for 1 M samples (3 epochs), 11.6 s for 4 M (9 epochs), in every
  process; a NeoX-sized run (hundreds of millions of samples) needs a cache, not built yet.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ...arrays import sample_indices
from ...contract import Allocator
from ...errors import ConfigError
from ...format import TokenFile, read_sequences
from ...index import SPLIT_NAMES, Blend
from ..config import NEOX_DEFAULT_ALPHA, DataConfig, Epochs, NeoxOptions, Splits, SupportsTyped
from ..megatron.blended import BlendedDataset
from ..megatron.gpt_dataset import GPTDataset, IndexArrays
from ..sources import SourceOptions, file_facts, open_token_file
from .neox_indices import (
    NeoXIndices,
    build_neox_blending_indices,
    build_neox_gpt_indices,
    neox_blend_num_samples,
    neox_item_position,
    neox_split_ranges,
    neox_weights_by_num_docs,
)

__all__ = [
    "NEOX_DEFAULT_ALPHA",
    "NeoXGPTDataset",
    "NeoxOptions",
    "build_neox",
    "build_neox_datasets",
]


class OpenedFile(NamedTuple):
    """A token file opened once for the build: the file, its sequence lengths in memory, and its
    content facts (``sources.file_facts``)."""

    source: TokenFile
    lengths: np.ndarray
    facts: dict[str, Any]


class NeoXGPTDataset(GPTDataset):
    """One NeoX ``GPT2Dataset``: a ``GPTDataset`` whose length is one sample short of what it
    built and whose indices past that length wrap as NeoX's ``IndexError`` fallback does."""

    def __init__(self, *args: Any, num_built: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_built = num_built
        """Samples in the sample index (``len(self) + 1``)."""

    def read_batch(self, indices: npt.ArrayLike) -> dict[str, Any]:
        idx = sample_indices(indices)
        if idx.size and int(idx.min()) < 0:
            raise IndexError(f"sample indices must be >= 0 (found {int(idx.min())})")
        return super().read_batch(neox_item_position(idx, self.num_built))

    def finish_batch(
        self, batch: dict[str, Any], alloc: Allocator | None = None
    ) -> dict[str, np.ndarray]:
        """``GPTDataset.finish_batch``, and NeoX's ``_get_batch`` label mask: a label whose token
        is negative (a signed token file may hold ids such as -100) has no loss."""
        out = super().finish_batch(batch, alloc)
        text = batch["windows"]
        if text.dtype.kind == "i" and text.size and int(np.min(text)) < 0:
            out["loss_mask"][text[:, 1:] < 0] = 0.0
        return out


def build_neox(data: DataConfig, options: NeoxOptions, sizes: Sequence[int | None]) -> Splits:
    """The (train, valid, test) datasets of ``data`` in GPT-NeoX's order (``build_datasets``
    dispatches here on ``NeoxOptions``).

    ``sizes``: samples per split as NeoX computes them (``train_iters * train_batch_size``,
    ``(train_iters // eval_interval + 1) * eval_iters * train_batch_size``,
    ``eval_iters * train_batch_size``); ``None`` for NeoX's epoch mode. ``options.num_epochs``:
    NeoX's ``train_val_test_epochs`` (one int for all splits, or one per split; a falsy entry
    means "from the sample count", and 1 where the size is ``None``).
    ``weight_by_num_documents`` and ``weighted_sampler_alpha``: NeoX's options of the same
    names for per-split paths.
    """
    start = time.perf_counter()
    _check_config(data)
    sizes = _three("sizes", sizes)
    epochs = _epochs(options.num_epochs, sizes)
    opener = _Opener(data.source, data.sequences_path)
    built: Sequence[NeoXGPTDataset | BlendedDataset | None]
    if data.blend_per_split is not None:
        built = [
            _weighted(opener, data, name, blend, sizes[k], epochs[k], options)
            for k, (name, blend) in enumerate(zip(SPLIT_NAMES, _per_split(data.blend_per_split)))
        ]
    else:
        built = _split(opener, data, sizes, epochs)
    phases = {"index_build": time.perf_counter() - start}
    for ds in built:
        if ds is not None:
            ds.startup_phases = phases
    train, valid, test = built
    return Splits(train, valid, test)


def build_neox_datasets(
    config: SupportsTyped,
    sizes: Sequence[int | None],
    options: NeoxOptions | None = None,
    **fields: Any,
) -> Splits:
    """``build_neox`` of ``config``'s typed records (a ``MegatronDataConfig`` converts, of any
    order). ``options``: the order's record (default: the config's own, or ``NeoxOptions()``);
    keywords replace single fields (``num_epochs=2``)."""
    data, order = config.typed()
    if options is None:
        options = order if isinstance(order, NeoxOptions) else NeoxOptions()
    return build_neox(data, replace(options, **fields), sizes)


class _Opener:
    """Each prefix opened once (a file may serve several splits or blend members)."""

    def __init__(self, options: SourceOptions, sequences_path: str | None) -> None:
        self.options = options
        self._sequences = None if sequences_path is None else read_sequences(sequences_path)
        self._open: dict[str, OpenedFile] = {}

    def __call__(self, prefix: str) -> OpenedFile:
        if prefix not in self._open:
            source = open_token_file(
                prefix, self.options.read_mode, self._sequences, warmup=self.options.warmup
            )
            self._open[prefix] = OpenedFile(
                source, np.array(source.sequence_lengths), file_facts(source)
            )
        return self._open[prefix]


def _check_config(config: DataConfig) -> None:
    """Refuse what NeoX's order cannot express, rather than give another order silently."""
    if config.mock:
        raise ConfigError(
            "order='neox' has no mock data; expected a data path (blend) or per-split paths",
            hint="give GPT-NeoX's data_path or train/valid/test_data_paths",
        )
    fixed = {
        "add_extra_token": (config.add_extra_token, True),
        "drop_last_partial_validation_sequence": (
            config.drop_last_partial_validation_sequence,
            True,
        ),
        "mid_level_dataset_surplus": (config.mid_level_dataset_surplus, 0.005),
    }
    for name, (value, neox) in fixed.items():
        if value != neox:
            raise ConfigError(
                f"{name} is {value!r} with order='neox'; expected {neox!r} (GPT-NeoX's fixed "
                "behaviour: S + 1 tokens per sample, drop-last everywhere, a 1.005 blend surplus)",
                hint=f"leave {name} at its default, or use order='megatron'",
            )


def _three(what: str, values: Sequence[Any]) -> list[Any]:
    values = list(values)
    if len(values) != len(SPLIT_NAMES):
        raise ConfigError(f"{what} has {len(values)} entries; expected 3 (train, valid, test)")
    for v in values:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
            raise ConfigError(f"{what} holds {v!r}; expected counts >= 0 or None")
    return values


def _epochs(num_epochs: Epochs, sizes: list[int | None]) -> list[int | None]:
    given = num_epochs if isinstance(num_epochs, Sequence) else [num_epochs] * 3
    per_split = _three("num_epochs", given)
    return [e if e or s is not None else 1 for e, s in zip(per_split, sizes)]


def _gpt(
    opener: _Opener,
    config: DataConfig,
    prefix: str,
    documents: np.ndarray,
    num_samples: int | None,
    num_epochs: int | None,
) -> NeoXGPTDataset:
    opened = opener(prefix)
    source, lengths, facts = opened.source, opened.lengths, opened.facts
    ix: NeoXIndices = build_neox_gpt_indices(
        lengths,
        documents,
        num_samples=num_samples,
        sequence_length=config.sequence_length,
        seed=config.random_seed,
        num_epochs=num_epochs,
    )
    # Content, not place: the same files elsewhere resume, other data under the same names not.
    identity = json.dumps(
        {
            "order": "neox",
            "token_file": facts,
            "documents": [int(documents[0]), int(documents[-1]) + 1],
            "num_samples": num_samples,
            "num_epochs": ix.num_epochs,
            "seq_length": config.sequence_length,
            "seed": config.random_seed,
        },
        sort_keys=True,
    )
    arrays = {
        "document_index": ix.document_index,
        "sample_index": ix.sample_index,
        "shuffle_index": ix.shuffle_index,
    }
    return NeoXGPTDataset(
        source,
        IndexArrays(arrays=arrays),
        config.item,
        identity=identity,
        length=len(ix),
        samples_per_epoch=(ix.tokens_per_epoch - 1) // config.sequence_length,
        num_built=ix.num_built,
    )


def _single_prefix(config: DataConfig) -> str:
    blend = config.blend
    assert blend is not None  # _check_config: no mock data, and no per-split blends here
    if len(blend.prefixes) != 1:
        raise ConfigError(
            f"order='neox' splits one data path; found {len(blend.prefixes)} prefixes "
            f"{list(blend.prefixes)}",
            hint="blend several files with train/valid/test_data_paths (blend_per_split) and "
            "their weights, as GPT-NeoX does",
        )
    return blend.prefixes[0]


def _split(
    opener: _Opener,
    config: DataConfig,
    sizes: list[int | None],
    epochs: list[int | None],
) -> list[NeoXGPTDataset | None]:
    prefix = _single_prefix(config)
    assert config.split is not None  # MegatronDataConfig: a blend needs a split string
    ranges = neox_split_ranges(config.split, int(opener(prefix).lengths.shape[0]))
    return [
        None
        if r is None
        else _gpt(opener, config, prefix, np.arange(*r, dtype=np.int32), sizes[k], epochs[k])
        for k, r in enumerate(ranges)
    ]


def _per_split(blends: Sequence[Blend | None]) -> list[Blend | None]:
    if len(blends) != len(SPLIT_NAMES):
        raise ConfigError(
            f"blend_per_split has {len(blends)} entries; expected 3 "
            "(train, valid, test; None for a split without data)"
        )
    return list(blends)


def _weighted(
    opener: _Opener,
    config: DataConfig,
    name: str,
    blend: Blend | None,
    size: int | None,
    epochs: int | None,
    options: NeoxOptions,
) -> BlendedDataset | None:
    if blend is None:
        return None
    prefixes = list(blend.prefixes)
    weights = [1.0] * len(prefixes) if blend.weights is None else list(blend.weights)
    if options.weight_by_num_documents:
        weights = neox_weights_by_num_docs(
            [int(opener(p).lengths.shape[0]) for p in prefixes],
            alpha=options.weighted_sampler_alpha,
        )
    planned = neox_blend_num_samples(weights, size)
    weights, counts = planned.weights, planned.num_samples
    members = [
        _gpt(
            opener,
            config,
            p,
            np.arange(opener(p).lengths.shape[0], dtype=np.int32),
            n,
            epochs,
        )
        for p, n in zip(prefixes, counts)
    ]
    dataset_index, sample_index = build_neox_blending_indices(weights, [len(m) for m in members])
    identity = hashlib.sha256(
        json.dumps({"order": "neox", "split": name, "weights": weights}).encode()
    ).hexdigest()
    return BlendedDataset(
        members,
        IndexArrays(arrays={"dataset_index": dataset_index, "dataset_sample_index": sample_index}),
        identity=identity,
        length=int(dataset_index.shape[0]),
    )
