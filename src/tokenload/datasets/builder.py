"""Build the train/valid/test datasets of a Megatron configuration, with Megatron's caches.

This plays the part of Megatron's ``BlendedMegatronDatasetBuilder``: split and blend planning
(``index.plan``), the per-prefix GPT indices (``index.gpt``), blending (``index.blending``),
and the cache (``index.cache`` for names, ``index.cache_io`` for files). A cache that Megatron
wrote loads here and the reverse, under Megatron's own file names.

Unlike Megatron, a cache is checked before use: the description text, the arrays' dtypes and
shapes (against those the configuration implies) and, when tokenload wrote it, a sidecar with
what Megatron's hash forgets (extra token, validation drop-last, the token files' sizes, their
sidecar hashes when they have one, and an xxh3 of each ``.idx``'s sequence lengths and document
indices: what the indices depend on, so a file rewritten to the same sizes is noticed). A stale
cache is rebuilt (``cache="auto"``) or refused (``cache="strict"``), never silently reused. The
index values are range-checked as batches use them (``datasets.gpt``).

A dataset's ``fingerprint`` (what a loader's resume state must match) depends on the data's
content and the configuration, never on where the files are: the same token files copied to
another folder resume, other data under the same names does not.

Each process that misses builds in memory and writes atomically, so racing ranks leave
one valid cache and nobody waits at a barrier; rank-0-only, per-node and offline build policies
are layered on top of this by the distributed build policies.

Cached arrays are memory-mapped on first use in each process (Megatron's deferred mmap), and a
dataset pickles as paths plus configuration.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from ..errors import CacheError, ConfigError
from ..format import TokenFile, read_sidecar
from ..index import (
    MOCK_SPLIT,
    SPLIT_NAMES,
    Blend,
    CacheFiles,
    blended_identifiers,
    build_blending_indices,
    build_exhaustive_blending_indices,
    check_oversampling,
    default_cache_dir,
    describe,
    description_hash,
    gpt_identifiers,
    parse_blend,
    plan_splits,
    resolve_blend,
    split_matrix,
    split_range,
)
from ..index.cache_io import CacheState, check_cache, write_cache
from ..index.gpt import GPTIndexConfig, build_gpt_indices, drop_last_for, gpt_shapes
from .blended import BlendedDataset
from .gpt import GPTDataset, IndexArrays
from .items import ItemConfig
from .sources import MockSource

logger = logging.getLogger(__name__)

CACHE_POLICIES = ("auto", "strict", "off")


@dataclass(frozen=True, kw_only=True)
class MegatronDataConfig:
    """Everything that decides Megatron's datasets, their order and their items."""

    sequence_length: int
    """Tokens per sample (``--seq-length``)."""
    random_seed: int = 1234
    """Seed of every dataset's shuffles (``--seed``)."""
    blend: Sequence[str] | str | Blend | None = None
    """``--data-path`` list: prefixes, or alternating weights and prefixes (``30 p1 70 p2``)."""
    blend_per_split: Sequence[Sequence[str] | str | Blend | None] | None = None
    """Train/valid/test lists instead of ``blend`` (``--train-data-path`` ...)."""
    split: str | None = None
    """``--split`` (e.g. ``"969, 30, 1"``); required with ``blend``."""
    tokenizer: Mapping[str, Any] | None = None
    """Megatron's tokenizer identity (its ``unique_identifiers``), used only as part of the index
    cache's name (Megatron's md5 of the dataset description): it changes no sample and no token.
    Pass it to share index caches with Megatron: copy the ``"tokenizer"`` object verbatim from
    one of its ``...-description.txt`` files (e.g. ``{"class": "megatron.core.tokenizers.text.
    models.default_tokenizer.DefaultTokenizerText", "tokenizer_path": null, "vocab_size":
    "1000", "pad_id": "-1"}``); with another value Megatron computes other cache names and each
    side builds its own. None (the default) is fine when only tokenload reads the caches."""
    eod_id: int | None = None
    """End-of-document id (EOD options, mock data)."""
    pad_id: int = -1
    """Padding id for short samples; -1 when the tokenizer has none."""
    vocab_size: int | None = None
    """Vocabulary size for mock data."""
    add_extra_token: bool = True
    """Read S + 1 tokens per sample (Megatron's ``add_extra_token_to_sequence``)."""
    drop_last_partial_validation_sequence: bool = True
    """Drop the last partial sample of the validation split."""
    mid_level_dataset_surplus: float = 0.005
    """Extra fraction of samples built per blended dataset (``--mid-level-dataset-surplus``)."""
    path_to_cache: str | None = None
    """``--data-cache-path``; None uses Megatron's default folder next to each prefix."""
    cache: str = "auto"
    """"auto": use a valid cache, (re)build a missing or stale one; "strict": refuse a stale
    cache with CacheError; "off": build in memory, read and write no cache."""
    read_mode: str = "mmap"
    """How token files are read: mmap, pread or memory."""
    eod_mask_loss: bool = False
    """Zero the loss where the input token is EOD (``--eod-mask-loss``)."""
    reset_position_ids: bool = False
    """Restart position ids after every EOD (``--reset-position-ids``)."""
    reset_attention_mask: bool = False
    """Block attention across EODs in the attention mask (``--reset-attention-mask``)."""
    create_attention_mask: bool = False
    """Return the S x S attention mask; off by default (Megatron's is on unless
    ``--no-create-attention-mask-in-dataloader``): it costs S x S per sample."""
    inter_document_masking: bool = False
    """Return ``cu_seqlens``/``max_seqlen`` for document-aware attention
    (``--dataloader-inter-document-masking``)."""

    def __post_init__(self) -> None:
        if self.cache not in CACHE_POLICIES:
            raise ConfigError(f"cache is {self.cache!r}, expected one of {CACHE_POLICIES}", hint="use cache='auto'")
        if self.blend is not None and self.blend_per_split is not None:
            raise ConfigError("blend and blend_per_split are exclusive", hint="give one of them (as Megatron)")
        if self.blend is not None and self.split is None:
            raise ConfigError("a blend needs a split string", hint='pass split="969, 30, 1" or "99,1,0"')
        if self.mock and (self.vocab_size is None or self.eod_id is None):
            raise ConfigError("mock data needs vocab_size and eod_id", hint="pass the tokenizer's values")

    @property
    def mock(self) -> bool:
        """No data at all: Megatron's ``--mock-data``."""
        return self.blend is None and self.blend_per_split is None

    def item_config(self) -> ItemConfig:
        return ItemConfig(
            sequence_length=self.sequence_length,
            add_extra_token=self.add_extra_token,
            eod_id=self.eod_id,
            pad_id=self.pad_id,
            eod_mask_loss=self.eod_mask_loss,
            reset_position_ids=self.reset_position_ids,
            reset_attention_mask=self.reset_attention_mask,
            create_attention_mask=self.create_attention_mask,
            inter_document_masking=self.inter_document_masking,
        )


def _as_blend(value) -> Blend | None:
    if value is None or isinstance(value, Blend):
        return value
    return parse_blend(value)


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
    """
    return _Builder(config).build(sizes)


class _Builder:
    def __init__(self, config: MegatronDataConfig) -> None:
        self.config = config
        self.item = config.item_config()
        self._sources: dict[str | None, Any] = {}
        self._length_copies: dict[str | None, np.ndarray] = {}
        self._facts: dict[str | None, dict[str, Any] | None] = {}

    def source(self, prefix: str | None):
        if prefix not in self._sources:
            c = self.config
            self._sources[prefix] = (
                MockSource(c.vocab_size, c.eod_id) if prefix is None else TokenFile(prefix, mode=c.read_mode)
            )
        return self._sources[prefix]

    def build(self, sizes):
        c = self.config
        # Per-split blends describe themselves with a null split (Megatron spoofs it internally).
        split = MOCK_SPLIT if c.mock else (None if c.blend_per_split is not None else c.split)
        per_split = None if c.blend_per_split is None else [_as_blend(b) for b in c.blend_per_split]
        plans = plan_splits(
            blend=None if c.mock else _as_blend(c.blend),
            blend_per_split=per_split,
            split=split,
            sizes=list(sizes),
            surplus=c.mid_level_dataset_surplus,
        )
        matrix = None if split is None else split_matrix(split)
        return tuple(
            None if plan is None else self._split(name, plan, split, matrix) for name, plan in zip(SPLIT_NAMES, plans)
        )

    def _split(self, name, plan, split, matrix):
        self._check_dtypes(name, [mid.prefix for mid in plan.datasets])
        mids = [self._mid(name, mid, split, matrix) for mid in plan.datasets]
        if not plan.blended:
            return mids[0][0]
        lengths = [len(ds) for ds, _ in mids]
        weights, size = resolve_blend(plan, lengths)
        uid = blended_identifiers(datasets=[u for _, u in mids], split=name, weights=weights, size=size)
        description = describe(uid)

        def build():
            if size is None:
                di, dsi = build_exhaustive_blending_indices(weights)
            else:
                di, dsi = build_blending_indices(weights, size)
            check_oversampling(di, lengths, name)
            return {"dataset_index": di, "dataset_sample_index": dsi}

        # Megatron caches a blend only under an explicit path_to_cache.
        folder = self.config.path_to_cache
        fields = {"members": [ds.fingerprint for ds, _ in mids]}
        n = sum(lengths) if size is None else size  # the exhaustive blend takes every sample once
        expected = {"dataset_index": (n,), "dataset_sample_index": (n,)}
        indices = self._indices(folder, uid, description, build, fields, expected)
        placeless = blended_identifiers(
            datasets=[_placeless(u) for _, u in mids], split=name, weights=weights, size=size
        )
        identity = description_hash(describe(placeless))
        return BlendedDataset([ds for ds, _ in mids], indices, identity=identity)

    def _lengths(self, prefix: str | None) -> np.ndarray:
        """Sequence lengths in RAM: the index build gathers from them at random, which is about
        twice as fast from an anonymous copy as from the mapped .idx (Megatron copies too)."""
        if prefix not in self._length_copies:
            self._length_copies[prefix] = np.array(self.source(prefix).sequence_lengths)
        return self._length_copies[prefix]

    def _file_facts(self, prefix: str | None) -> dict[str, Any] | None:
        """``_file_facts`` once per prefix (a prefix serves up to three splits)."""
        if prefix not in self._facts:
            self._facts[prefix] = None if prefix is None else _file_facts(self.source(prefix))
        return self._facts[prefix]

    def _check_dtypes(self, name: str, prefixes: list[str | None]) -> None:
        """A blend mixes token files of one dtype only: another dtype means another tokenizer."""
        dtypes = {p: self.source(p).dtype for p in prefixes if p is not None}
        if len(set(dtypes.values())) > 1:
            listing = ", ".join(f"{p} ({d})" for p, d in dtypes.items())
            raise ConfigError(
                f"the {name} blend mixes token dtypes: {listing}",
                hint="blend only token files made with the same tokenizer (re-tokenize the odd ones out)",
            )

    def _mid(self, name, mid, split, matrix):
        c = self.config
        source = self.source(mid.prefix)
        lengths = self._lengths(mid.prefix)
        beg, end = split_range(mid.bookend, len(lengths))
        gpt = GPTIndexConfig(
            sequence_length=c.sequence_length,
            random_seed=c.random_seed,
            add_extra_token=c.add_extra_token,
            drop_last=drop_last_for(name, c.drop_last_partial_validation_sequence),
        )
        uid = gpt_identifiers(
            class_name="MockGPTDataset" if mid.prefix is None else "GPTDataset",
            dataset_path=mid.prefix,
            num_samples=mid.num_samples,
            index_split=name,
            random_seed=c.random_seed,
            sequence_length=c.sequence_length,
            split=split,
            split_matrix=matrix,
            tokenizer=c.tokenizer,
        )
        documents = np.arange(beg, end, dtype=np.int32)
        tokens = int(np.sum(lengths[beg:end], dtype=np.int64))
        asked = None if mid.num_samples is None else mid.num_samples * c.sequence_length + gpt.extra
        if tokens == 0 and asked:
            raise _empty_split(name, mid, beg, end, len(lengths), split)

        def build():
            idx = build_gpt_indices(lengths, documents, num_samples=mid.num_samples, config=gpt)
            return {"document_index": idx.document_index, "sample_index": idx.sample_index,
                    "shuffle_index": idx.shuffle_index}

        expected = gpt_shapes(
            num_documents=end - beg, tokens_per_epoch=tokens, num_samples=mid.num_samples,
            config=gpt,
        )
        folder = c.path_to_cache
        if folder is None and mid.prefix is not None:
            folder = default_cache_dir(mid.prefix)
        fields = {"add_extra_token": c.add_extra_token, "drop_last": gpt.drop_last,
                  "token_file": self._file_facts(mid.prefix)}
        indices = self._indices(folder, uid, describe(uid), build, fields, expected)
        identity = description_hash(describe(_placeless(uid))) + repr(sorted(fields.items()))
        return GPTDataset(source, indices, self.item, identity=identity), uid

    def _indices(self, folder, uid, description, build, fields, expected) -> IndexArrays:
        if folder is None or self.config.cache == "off":
            return IndexArrays(arrays=build())
        files = CacheFiles.of(folder, uid)
        check = check_cache(files, description=description, fields=fields, expected_shapes=expected)
        if check.state is CacheState.STALE:
            if self.config.cache == "strict":
                raise CacheError(
                    f"the index cache is stale: {'; '.join(check.reasons)}",
                    path=files.description,
                    hint="delete these cache files or use cache='auto' to rebuild them",
                )
            logger.warning("rebuilding stale index cache %s: %s", files.description, "; ".join(check.reasons))
        if check.state is CacheState.HIT:
            if not check.has_sidecar:
                logger.info("using index cache without a tokenload sidecar (written by Megatron): %s", files.description)
        else:
            arrays = build()
            write_cache(files, description=description, arrays=arrays, fields=fields)
        return IndexArrays(paths={name: files.array(name) for name in files.arrays})


def _placeless(uid: Mapping[str, Any]) -> OrderedDict[str, Any]:
    """Megatron's identifiers without the token file's path: with the files' content facts,
    the identity of a dataset that still holds after the files move."""
    out = OrderedDict(uid)
    if "dataset_path" in out:
        out["dataset_path"] = None
    return out


def _empty_split(name: str, mid, beg: int, end: int, count: int, split: str | None) -> ConfigError:
    """A split without tokens asked for samples (Megatron loops forever there)."""
    share = "the whole file" if split is None else f"its share of split {split!r}"
    return ConfigError(
        f"the {name} split of {mid.prefix} holds no tokens ({share}: sequences {beg}..{end} of "
        f"{count}) but {mid.num_samples} samples were requested; expected a split with at least "
        "one non-empty sequence",
        path=mid.prefix + ".bin",
        hint="change the split string (e.g. '98,2,0' on a small file leaves the valid split "
        f"empty), ask for no {name} samples, or give the {name} split more data",
    )


_INDEX_DIGESTS: dict[tuple[int, ...], str] = {}
"""``_index_digest`` by the ``.idx`` file's identity: each file is hashed once per process."""


def _index_digest(source: TokenFile) -> str:
    """xxh3-64 of what a file's indices depend on, the raw bytes of its sequence lengths and
    document indices (not the pointers: they follow from the lengths). About 15 ms per 10 M
    sequences from the page cache; keyed by device, inode, size and times, so a rewrite is seen."""
    st = os.stat(source.idx_path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    digest = _INDEX_DIGESTS.get(key)
    if digest is None:
        h = xxhash.xxh3_64(source.sequence_lengths)
        if getattr(source, "documents_from_sequences", False):
            h.update(b"each sequence is a document")  # no boundaries recorded: nothing to read
        else:
            h.update(source.document_indices)
        digest = _INDEX_DIGESTS[key] = h.hexdigest()
    return digest


def _file_facts(source: TokenFile) -> dict[str, Any]:
    """What identifies a token file's content: its sizes, the digest of its index arrays, and
    its sidecar's hashes when it has one."""
    facts: dict[str, Any] = {
        "bin_bytes": os.path.getsize(source.bin_path),
        "idx_bytes": os.path.getsize(source.idx_path),
        "index_xxh3_64": _index_digest(source),
    }
    sidecar = read_sidecar(source.prefix)
    if sidecar is not None:
        facts["xxh3_64"] = {k: v.get("xxh3_64") for k, v in sidecar.hashes.items()}
    return facts
