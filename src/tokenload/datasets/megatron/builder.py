"""Build the train/valid/test datasets of a Megatron configuration, with Megatron's caches.

This plays the part of Megatron's ``BlendedMegatronDatasetBuilder``: split and blend planning
(``index.plan``), the per-prefix GPT indices (``index.gpt``), blending (``index.blending``),
and the cache (``caches.names`` for names, ``caches.files`` for files). A cache that Megatron
wrote loads here and the reverse, under Megatron's own file names.

Unlike Megatron, a cache is checked before use, and a stale one is rebuilt or refused, never
silently reused (``cache_rules``). The index values are range-checked as batches use
them (``gpt_dataset``).

Who builds, writes, waits and loads is the build policy (``policy``): each process
takes one role from ``build_policy`` and its ``World``; ``rank0`` and ``local-rank0`` call one
barrier per call, the others none. The writer of a complete build also writes a build manifest
(``manifest``) with which a loading rank gets every dataset from one open.

A dataset's ``fingerprint`` (what a loader's resume state must match) depends on the data's
content and the configuration, never on where the files are: the same token files copied to
another folder resume, other data under the same names does not.

Cached arrays are memory-mapped on first use in each process (Megatron's deferred mmap), a
dataset's length is known without them, and a dataset pickles as paths plus configuration.
Missing prefixes of a blend build in threads (NumPy's sorts and shuffles release the GIL).
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import numpy.random  # with the builder, as Megatron's imports do; not lazily in a build (10-25 ms)

from ...caches import (
    blended_identifiers,
    describe,
    description_hash,
    gpt_identifiers,
    segment_identifiers,
)
from ...distributed import World, barrier, process_group
from ...errors import ConfigError
from ...format import TokenFile, read_sequences
from ...format.sequences import SequencesFile
from ...index import (
    MOCK_SPLIT,
    SPLIT_NAMES,
    build_blending_indices,
    build_exhaustive_blending_indices,
    check_oversampling,
    plan_splits,
    resolve_blend,
    split_matrix,
    split_range,
)
from ...index.gpt import GPTIndexConfig, build_gpt_indices, drop_last_for, gpt_shapes
from ...index.plan import MidLevelPlan, SplitPlan
from ...index.schedule import check_schedule_fits
from ...index.splits import SplitMatrix
from ...metrics import Phases
from ..config import DataConfig, MegatronOptions, Splits, SupportsTyped, TypedConfig
from ..sources import MockSource, file_facts, open_source
from .blended import BlendedDataset
from .built import BuiltDataset, BuiltMember, built_member, default_folder
from .built import placeless as _placeless
from .cache_match import gpt_cache_mismatches
from .cache_rules import IndexCache, wait_for_cache_writes, write_behind
from .continuable import (
    continuable,
    entry_parts,
    first_entry_blend,
    first_segment,
    mixture_mode,
    scheduled_plan,
)
from .gpt_dataset import GPTDataset, IndexArrays
from .manifest import ManifestFile, manifest_key, manifest_path, read_manifest
from .near_miss import near_misses
from .packed import packed_from_entry, packed_member
from .policy import Role, missing_cache, prepare_command, resolve

__all__ = [
    "BUILD_THREADS",
    "BuiltDataset",
    "BuiltMember",
    "MegatronBuilder",
    "MegatronOptions",
    "build_megatron",
    "build_megatron_datasets",
]

BUILD_THREADS = 4
"""Threads that build the missing prefixes of a blend. Measured on 2 cores, 100 prefixes of 3,000
documents: in memory 0.35 s with 1 thread, 0.16-0.24 s with 2, 0.15 s with 4; building and
writing the caches (fsync-bound) 5.5-5.8 s, 1.5-1.7 s, 0.95 s (8 threads: no better)."""


def build_megatron(
    data: DataConfig, options: MegatronOptions, sizes: Sequence[int | None]
) -> Splits:
    """The (train, valid, test) datasets of ``data`` in the Megatron order (``build_datasets``
    dispatches here on ``MegatronOptions``)."""
    wait_for_cache_writes()
    return MegatronBuilder(data, options, World.detect()).build(list(sizes))


def build_megatron_datasets(
    config: SupportsTyped, sizes: Sequence[int | None], options: MegatronOptions | None = None
) -> Splits:
    """``build_megatron`` of ``config``'s typed records (a ``MegatronDataConfig`` converts);
    ``options`` replaces its order's record (the default: its own, or ``MegatronOptions()``
    with its schedule for a config of another order)."""
    data, order = config.typed()
    if options is None:
        own = order if isinstance(order, MegatronOptions) else None
        options = own or MegatronOptions(schedule=getattr(order, "schedule", None))
    return build_megatron(data, options, sizes)


class MegatronBuilder:
    """One ``build_megatron_datasets`` call: the splits' plans, the per-prefix GPT datasets, the
    blends, and the caches and manifest as this process's role says."""

    def __init__(self, data: DataConfig, options: MegatronOptions, world: World) -> None:
        self.data = data
        self.options = options
        self.world = world
        self.item = data.item
        self.sizes: list[int | None] = []
        # mock data has no caches to prepare (prepare-cache refuses it, as Megatron's tool does):
        # under "none" its indices are made in memory, in a moment, rather than looked for
        mock_none = data.mock and options.build_policy == "none"
        policy = resolve(options.build_policy, world, "off" if mock_none else options.cache)
        self.role, self.sync = policy.role, policy.barrier
        self._sources: dict[str | None, MockSource | TokenFile] = {}
        self._length_copies: dict[str | None, np.ndarray] = {}
        self._facts: dict[str | None, dict[str, Any] | None] = {}
        self._sequences: SequencesFile | None = None
        self._phases = Phases()
        self._lock = threading.Lock()
        # auto on many ranks: the writer serves from memory and writes the caches behind its
        # first batches, so its start is no longer than any other rank's (the barrier-free
        # policies' critical path); one process, prepare-cache and the barrier policies write first.
        behind = self.role is Role.WRITE and not self.sync and world.world_size > 1
        self._cache = IndexCache(self.role, options.cache, behind=behind, phase=self._phase)

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:  # builder threads add up into one dict
                self._phases.add(name, time.perf_counter() - start)

    def source(self, prefix: str | None) -> MockSource | TokenFile:
        if prefix not in self._sources:
            c = self.data
            if prefix is not None and c.sequences_path is not None and self._sequences is None:
                self._sequences = read_sequences(c.sequences_path)
            self._sources[prefix] = open_source(prefix, c.source, self._sequences)
        return self._sources[prefix]

    # -- the policy around one build ------------------------------------------------------------
    def build(self, sizes: list[int | None]) -> Splits:
        self.sizes = list(sizes)  # a Megatron-order schedule plans each entry (megatron_mixture)
        why = f"build_policy={self.options.build_policy!r}"
        if self.sync and process_group() is None:
            barrier(self.world, why)  # the ConfigError, on every rank, before any work
        if self.sync and self.role is Role.READ:
            with self._phase("barrier"):
                barrier(self.world, why)
        try:
            with self._cache.grouped():  # every cache and the manifest: one durable group
                splits = self._build(sizes)
        finally:
            if self.sync and self.role is Role.WRITE:  # also after a failed build: nobody hangs
                with self._phase("barrier"):
                    barrier(self.world, why)
        phases = self._phases.as_dict()
        for ds in splits:
            if ds is not None:
                ds.startup_phases = phases
        train, valid, test = splits
        return Splits(train, valid, test)

    def _manifest_file(self, sizes: list[int | None]) -> ManifestFile | None:
        folder = self.options.path_to_cache
        if folder is None or self.role is Role.MEMORY:
            return None
        key = manifest_key(TypedConfig(self.data, self.options), sizes)
        return ManifestFile(manifest_path(folder, key), key)

    def _mixture_mode(self) -> bool:
        return mixture_mode(self.options.mixture_change, self.options.schedule)

    def _build(self, sizes: list[int | None]) -> list[Any]:
        c, schedule = self.data, self.options.schedule
        # a blend whose mixture changes wraps its datasets (continuable): no manifest
        manifest = None if self._mixture_mode() else self._manifest_file(sizes)
        if manifest is not None and self.role is Role.READ:
            with self._phase("index_load"):
                found = read_manifest(manifest.path, manifest.key)
            if found is not None:
                # the hint's command, made only if an array turns out damaged (it stats a folder)
                remedy = functools.partial(prepare_command, TypedConfig(c, self.options), sizes)
                return [None if e is None else self._from_entry(e, remedy) for e in found["splits"]]
        # Per-split blends describe themselves with a null split (Megatron spoofs it internally).
        split = MOCK_SPLIT if c.mock else (None if c.blend_per_split is not None else c.split)
        per_split = None if c.blend_per_split is None else list(c.blend_per_split)
        if per_split is not None:  # a weights_schedule's train blend starts as its first entry
            per_split[0] = first_entry_blend(schedule, per_split[0])
        plans = plan_splits(
            blend=None if c.mock else first_entry_blend(schedule, c.blend),
            blend_per_split=per_split,
            split=split,
            sizes=sizes,
            surplus=c.mid_level_dataset_surplus,
        )
        if per_split is not None and schedule is not None and plans[0] is not None:
            plans[0] = scheduled_plan(plans[0], c.mid_level_dataset_surplus)  # even one source
        if schedule is not None and plans[0] is not None and plans[0].size is not None:
            check_schedule_fits(schedule, plans[0].size)  # before any index is built or written
        matrix = None if split is None else split_matrix(split)
        for name, plan in zip(
            SPLIT_NAMES, plans
        ):  # every split checked before any is built or written
            for mid in [] if plan is None else plan.datasets:
                self._check_not_empty(name, mid, split)
        built = [
            None if plan is None else self._split(name, plan, split, matrix)
            for name, plan in zip(SPLIT_NAMES, plans)
        ]
        if self._cache.missing:
            raise missing_cache(
                self.options.build_policy,
                self._cache.missing,
                self._cache.folders,
                prepare_command(TypedConfig(c, self.options), sizes),
                near_misses(self._cache.wanted),
            )
        entries = [None if b is None else b.entry for b in built]
        if not (
            manifest is not None
            and self.role is Role.WRITE
            and all(e is not None for b, e in zip(built, entries) if b)
        ):
            manifest = None
        if self._cache.deferred:
            write_behind(self._cache.deferred, manifest, entries)
        elif manifest is not None:
            with self._phase("cache_write"):
                self._cache.write_manifest(manifest, entries)
        return [None if b is None else b.dataset for b in built]

    # -- datasets from a manifest ---------------------------------------------------------------
    def _from_entry(
        self, entry: Mapping[str, Any], remedy: Callable[[], str]
    ) -> GPTDataset | BlendedDataset:
        """A dataset of a build manifest's entry; ``remedy``: the prepare-cache command of the
        build, for the hint of a damaged array."""
        folder = self.options.path_to_cache
        assert folder is not None  # a manifest is read only from path_to_cache
        indices = IndexArrays(
            paths={k: os.path.join(folder, v) for k, v in entry["arrays"].items()},
            shapes={k: tuple(v) for k, v in entry["shapes"].items()},
            digests=dict(entry["digests"]),
            remedy=remedy,
        )
        if entry["kind"] == "packed":
            return packed_from_entry(self, entry, indices)  # type: ignore[return-value]
        if entry["kind"] == "blended":
            members = [self._from_entry(m, remedy) for m in entry["members"]]
            return BlendedDataset(
                members, indices, identity=entry["identity"], length=entry["length"]
            )
        return GPTDataset(
            self.source(entry["prefix"]),
            indices,
            self.item,
            identity=entry["identity"],
            length=entry["length"],
            samples_per_epoch=entry["samples_per_epoch"],
            file_facts=entry["token_file"] or None,
        )

    # -- datasets from the plan -----------------------------------------------------------------
    def _split(
        self, name: str, plan: SplitPlan, split: str | None, matrix: SplitMatrix | None
    ) -> BuiltDataset:
        with self._phase("header_reads"):
            self._open_members([mid.prefix for mid in plan.datasets])
        mids = self._mids(name, plan, split, matrix)
        if not plan.blended:
            return BuiltDataset(mids[0].dataset, mids[0].entry)
        lengths = [len(m.dataset) for m in mids]
        weights, size = resolve_blend(plan, lengths)
        uid = blended_identifiers(
            datasets=[m.identifiers for m in mids], split=name, weights=weights, size=size
        )
        description = describe(uid)

        # Megatron caches a blend only under an explicit path_to_cache.
        folder = self.options.path_to_cache
        fields: dict[str, Any] = {"members": [_index_identity(m.dataset) for m in mids]}
        span = size
        in_memory = folder is None or self.role is Role.MEMORY
        schedule = self.options.schedule if name == "train" else None
        parts = None  # a schedule's entries, cached as one: (weights, samples) each
        if size is not None and self._mixture_mode() and in_memory:
            # built in memory for a chain of segments, Megatron's arrays serve only the first
            # (its greedy is prefix-stable: the first samples are the same at any size)
            span = first_segment(schedule, size)
        elif size is not None and self._mixture_mode() and schedule is not None:
            # one cache holds every entry's blending, one after another, the first entry's
            # being Megatron's arrays of its blend's first samples: as many caches to check and
            # as many samples to hash as the fixed blend's
            parts = entry_parts(schedule, size)
            assert list(parts[0][0]) == list(weights)  # the first entry's blend is the plan's
            uid = segment_identifiers(split=name, entries=parts)
            description, fields = describe(uid), {}

        def build() -> dict[str, np.ndarray]:
            if parts is not None:
                built = [build_blending_indices(list(w), k) for w, k in parts]
                check_oversampling(built[0][0], lengths, name)
                return {
                    "dataset_index": np.concatenate([di for di, _ in built]),
                    "dataset_sample_index": np.concatenate([dsi for _, dsi in built]),
                }
            if span is None:
                di, dsi = build_exhaustive_blending_indices(weights)
            else:
                di, dsi = build_blending_indices(weights, span)
            check_oversampling(di, lengths, name)
            return {"dataset_index": di, "dataset_sample_index": dsi}

        n = sum(lengths) if size is None else size  # the exhaustive blend takes every sample once
        expected = {"dataset_index": (n,), "dataset_sample_index": (n,)}
        cached = self._cache.indices(folder, uid, description, build, fields, expected)
        placeless = blended_identifiers(
            datasets=[_placeless(m.identifiers) for m in mids],
            split=name,
            weights=weights,
            size=size,
        )
        identity = description_hash(describe(placeless))
        dataset = BlendedDataset(
            [m.dataset for m in mids], cached.indices, identity=identity, length=n
        )
        if self._mixture_mode() and plan.weights is not None:
            self._cache.publish()  # the wrapper may read the arrays: in place first

            def member(mid: MidLevelPlan) -> Any:  # a source built anew for another phase
                return self._mid(name, mid, split, matrix).dataset

            dataset = continuable(
                data=self.data,
                schedule=self.options.schedule,
                sizes=self.sizes,
                name=name,
                plan=plan,
                blend=dataset,
                members=[m.dataset for m in mids],
                build_member=member,
                allow_change=self.options.mixture_change == "continue",
                entries_in_blend=parts is not None,
            )
        members = [m.entry for m in mids]
        entry = cached.entry
        if entry is not None and all(e is not None for e in members):
            entry.update(kind="blended", length=n, identity=identity, members=members)
        else:
            entry = None
        return BuiltDataset(dataset, entry)

    def _mids(
        self, name: str, plan: SplitPlan, split: str | None, matrix: SplitMatrix | None
    ) -> list[BuiltMember]:
        """The split's mid-level datasets, the missing ones built in threads when there are many."""
        threads = self._threads()
        if len(plan.datasets) == 1 or threads < 2 or self.role is Role.READ:
            return [self._mid(name, mid, split, matrix) for mid in plan.datasets]
        with ThreadPoolExecutor(threads, thread_name_prefix="tokenload-build") as pool:
            return list(pool.map(lambda mid: self._mid(name, mid, split, matrix), plan.datasets))

    def _threads(self) -> int:
        """Build threads: ``BUILD_THREADS`` where the build writes as it goes (fsync-bound), else
        this rank's share of the cores it may run on. In memory the build is CPU-bound and threads
        beyond a rank's cores only queue on the GIL: 2 ranks on 2 cores, auto on an empty cache,
        4 threads each 0.87-1.07 CPU s and 1.2-1.7 s to the first item, 1 thread 0.68-0.77 CPU s
        and 0.69-1.2 s (benchmarks/startup.py, 3 runs each)."""
        if self.role is Role.WRITE and not self._cache.behind:
            return BUILD_THREADS
        cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
        return max(1, min(BUILD_THREADS, cores // max(self.world.local_world_size, 1)))

    def _token_file(self, prefix: str) -> TokenFile:
        """The source of a prefix (not the mock data's None): a token file."""
        return cast(TokenFile, self.source(prefix))

    def _lengths(self, prefix: str | None) -> np.ndarray:
        """Sequence lengths in RAM: the index build gathers from them at random, which is about
        twice as fast from an anonymous copy as from the mapped .idx (Megatron copies too)."""
        if prefix not in self._length_copies:
            self._length_copies[prefix] = np.array(self.source(prefix).sequence_lengths)
        return self._length_copies[prefix]

    def _file_facts(self, prefix: str | None) -> dict[str, Any] | None:
        """``file_facts`` once per prefix (a prefix serves up to three splits)."""
        if prefix not in self._facts:
            self._facts[prefix] = None if prefix is None else file_facts(self._token_file(prefix))
        return self._facts[prefix]

    def _open_members(self, prefixes: list[str | None]) -> None:
        """Open the token file of each member of a split. A blend may mix token dtypes (uint16
        and int32 files), as megatron-core's: each of its IndexedDatasets reads its own dtype,
        and every sample comes out as int64 tokens (the same tokenizer can give both: Megatron's
        reader picks uint16 up to a vocabulary of 65,536, its writer int32 from 65,500)."""
        for prefix in prefixes:
            if prefix is not None:
                self._token_file(prefix)

    def _check_not_empty(self, name: str, mid: MidLevelPlan, split: str | None) -> None:
        """ConfigError when the split of ``mid`` holds no tokens but samples are asked of it, or
        0 samples with the extra token (megatron-core asks 0 x S + 1 tokens of it and loops)."""
        if mid.num_samples is None:
            return
        concat_extra = self.data.add_extra_token and self.data.packing == "concat"
        if not (mid.num_samples or concat_extra):  # (packed rows are not megatron-core's)
            return
        with self._phase("header_reads"):
            lengths = self._lengths(mid.prefix)
        beg, end = split_range(mid.bookend, len(lengths))
        if int(np.sum(lengths[beg:end], dtype=np.int64)) == 0:
            raise _empty_split(name, mid, beg, end, len(lengths), split)

    def _mid(
        self, name: str, mid: MidLevelPlan, split: str | None, matrix: SplitMatrix | None
    ) -> BuiltMember:
        c, options = self.data, self.options
        if c.packing != "concat":
            packed: BuiltMember = packed_member(self, name, mid, split, matrix)
            return packed
        source = self.source(mid.prefix)
        with self._phase("header_reads"):
            lengths = self._lengths(mid.prefix)
            facts = self._file_facts(mid.prefix)
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
            tokenizer=options.tokenizer,
        )
        documents = np.arange(beg, end, dtype=np.int32)
        tokens = int(np.sum(lengths[beg:end], dtype=np.int64))

        def build() -> dict[str, np.ndarray]:
            idx = build_gpt_indices(lengths, documents, num_samples=mid.num_samples, config=gpt)
            return {
                "document_index": idx.document_index,
                "sample_index": idx.sample_index,
                "shuffle_index": idx.shuffle_index,
            }

        expected = gpt_shapes(
            num_documents=end - beg,
            tokens_per_epoch=tokens,
            num_samples=mid.num_samples,
            config=gpt,
        )
        folder = default_folder(options.path_to_cache, mid.prefix)
        fields = {
            "add_extra_token": c.add_extra_token,
            "drop_last": gpt.drop_last,
            "token_file": facts,
        }

        def consistent(arrays: dict[str, np.ndarray]) -> list[str]:  # a sidecar-less cache
            return gpt_cache_mismatches(
                arrays, lengths, beg, end, sequence_length=c.sequence_length, extra=gpt.extra
            )

        cached = self._cache.indices(
            folder, uid, describe(uid), build, fields, expected, consistent
        )
        identity = description_hash(describe(_placeless(uid))) + repr(sorted(fields.items()))
        length = expected["sample_index"][0] - 1
        per_epoch = (tokens - gpt.extra) // c.sequence_length
        dataset = GPTDataset(
            source,
            cached.indices,
            self.item,
            identity=identity,
            length=length,
            samples_per_epoch=per_epoch,
        )
        return built_member(
            dataset,
            cached.entry,
            uid,
            kind="gpt",
            prefix=mid.prefix,
            length=length,
            samples_per_epoch=per_epoch,
            identity=identity,
            token_file=facts,
        )


def _empty_split(
    name: str, mid: MidLevelPlan, beg: int, end: int, count: int, split: str | None
) -> ConfigError:
    """A split without tokens asked for samples (Megatron loops forever there)."""
    share = "the whole file" if split is None else f"its share of split {split!r}"
    asked = f"{mid.num_samples} samples were requested"
    if not mid.num_samples:  # megatron-core's _get_num_epochs asks 0 x S + 1 tokens: it loops
        asked = "even 0 samples need 1 token with add_extra_token (megatron-core loops forever)"
    # (asking for 0 samples is no way out: see above; a split of weight 0 is not built at all)
    hint = f"give the {name} split a weight of 0 in the split string (not built), "
    return ConfigError(
        f"the {name} split of {mid.prefix} holds no tokens ({share}: sequences {beg}..{end} of "
        f"{count}) but {asked}; expected a split with at least one non-empty sequence",
        path=None if mid.prefix is None else mid.prefix + ".bin",
        hint="change the split string (e.g. '98,2,0' on a small file leaves the valid split "
        f"empty), {hint}or give the {name} split more data",
    )


def _index_identity(dataset: Any) -> str:
    """What a blend's cache records of a member: the identity of its indices (its own cache's
    description and token file), not of its item fields (``inter_document_masking``,
    ``eod_mask_loss``, ...), which change no index: a blend cached under one item layout serves
    them all, as each member's own cache does."""
    identity = getattr(dataset, "identity", None)
    if not isinstance(identity, str):
        return str(dataset.fingerprint)
    return hashlib.sha256(identity.encode()).hexdigest()[:16]
