"""The configuration of a Megatron-style data pipeline: data, order, items and cache policies."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from ..errors import ConfigError
from ..index import Blend, parse_blend
from ..storage import is_url
from .items import ItemConfig
from .sources import SourceOptions

__all__ = [
    "BUILD_POLICIES",
    "CACHE_POLICIES",
    "ORDERS",
    "ImportedConfig",
    "MegatronDataConfig",
    "as_blend",
]

BUILD_POLICIES = ("auto", "rank0", "local-rank0", "every-rank", "none")
"""Values of ``build_policy`` (``datasets.megatron.policy`` gives each its roles)."""
CACHE_POLICIES = ("auto", "strict", "off")
ORDERS = ("megatron", "computed", "neox")
PACKINGS = ("concat", "best-fit")
MIXTURE_CHANGES = ("refuse", "continue")


@dataclass(frozen=True, kw_only=True)
class MegatronDataConfig:
    """Everything that decides Megatron's datasets, their order and their items.

    The fields are flat, as users and importers give them. Most are shared by every order; a
    few belong to one order only and are read once, by ``build_datasets``, into that order's
    options record: ``path_to_cache``, ``cache``, ``build_policy``, ``tokenizer`` and
    ``mixture_change`` (``datasets.megatron.MegatronOptions``), ``block_size``
    (``datasets.computed.ComputedOptions``), ``weight_by_num_documents``,
    ``weighted_sampler_alpha`` and ``num_epochs`` (``datasets.neox.NeoxOptions``)."""

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
    """``--data-cache-path``; None uses Megatron's default folder next to each prefix (a local
    folder for an ``s3://`` prefix). A URL (``s3://bucket/cache``) keeps the caches in object
    storage: the writer makes them locally and uploads them, each cache's description last, so a
    partial upload never loads; readers copy each file once per node (keyed by its ETag) and
    check it as a local cache. Not with ``build_policy="local-rank0"`` (a bucket is not
    node-local)."""
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
    build_policy: str = "auto"
    """Which processes of a job build, write, wait for or only load the index caches
    (``build_datasets`` runs on every rank; see docs/SCALE.md). Whatever the value, no cache
    file is written by more than one process (one per node for node-local folders), and only
    ``rank0`` and ``local-rank0`` call a collective (one barrier per ``build_datasets``).

    * ``"auto"`` (default): every rank checks the cache and loads a valid one, with no barrier.
      On a miss, global rank 0 builds and writes it (behind its first batches, from a
      background thread, when there are several ranks) while every other rank builds in memory
      and writes nothing (no waiting, no collective). Choose it when unsure, for a few nodes, and
      the first run of a new configuration; the next runs are cache hits.
    * ``"rank0"``: global rank 0 checks, builds and writes everything into the shared cache
      folder; the other ranks wait at one barrier and then load (a cache still missing then is
      a ``CacheError``). Megatron's default; needs ``torch.distributed`` initialised and a cache
      folder every rank sees. Choose it when building costs more than waiting (huge blends on
      many ranks of one node).
    * ``"local-rank0"``: local rank 0 of each node builds into the node's cache folder (a
      node-local disk: no shared filesystem needed); the node's other ranks wait at the barrier
      and load from it. GPT-NeoX's ``use_shared_fs=False``. Choose it when ``path_to_cache`` is
      node-local.
    * ``"every-rank"``: each rank builds in memory; no cache file is read or written, no
      barrier. Choose it for small data, or a filesystem that cannot take writes.
    * ``"none"``: fast load of a prepared cache (``tokenload prepare-cache``): no barrier, no
      existence probe, no build; with ``path_to_cache`` one manifest read gives every dataset
      and the arrays map on first use. A missing or stale cache is one ``CacheError``, on every
      rank, listing what is missing and the ``tokenload prepare-cache`` command that makes it.
      Choose it for large jobs (hundreds of nodes), after preparing the cache.

    ``cache="off"`` turns every policy into an in-memory build with no barrier."""
    order: str = "megatron"
    """Which sample order (docs/ORDER.md):

    * ``"megatron"`` (default): Megatron-LM's document/sample/shuffle and blending indices, bit
      for bit, cached under Megatron's file names (``build_policy`` decides who builds them).
    * ``"computed"``: windows of ``sequence_length`` tokens in a keyed permutation computed on
      demand: no index build, no cache, no barrier, startup independent of the data's size; a
      blend's weights may change between a save and a resume without repeating any sample.
    * ``"neox"``: GPT-NeoX's ``GPT2Dataset``/``BlendableDataset`` order, so that a NeoX run can
      continue in tokenload on the same samples (built in memory on every rank)."""
    block_size: int | None = None
    """``order="computed"`` only: permute blocks of this many consecutive windows, then the
    windows inside each block, so that a micro-batch reads a few places of the files (object
    storage); None shuffles windows one by one."""
    weight_by_num_documents: bool = False
    """``order="neox"`` only: NeoX's ``weight_by_num_documents`` (blend weights from the files'
    document counts, raised to ``weighted_sampler_alpha``)."""
    weighted_sampler_alpha: float = 1.0
    """``order="neox"`` only: NeoX's ``weighted_sampler_alpha``."""
    num_epochs: int | None = None
    """``order="neox"`` only: NeoX's epoch mode (``train_epochs``); None sizes by samples."""
    warmup: bool = False
    """Read each token file once, sequentially, when a process first opens it (GPT-NeoX's
    ``mmap_warmup``): slower start, no page faults on first reads afterwards."""
    weights_schedule: Sequence[tuple[int, Sequence[float]]] | None = None
    """Train-split weights that change at given global samples, declared up front:
    ``[(0, [0.5, 0.3, 0.2]), (40_000, [0.2, 0.5, 0.3])]``, one weight per source of the blend
    (0: inactive), starts strictly increasing from 0. The mixture changes at each start with no
    restart and no sample of a source repeated or skipped (docs/ORDER.md, "Schedules"). The
    blend's own weights are then ignored: the Megatron order builds Megatron's blend of the first
    entry (its sources of positive weight) for every split cut from ``blend`` (with
    ``blend_per_split``: for the train split's blend, the other splits keep theirs), and
    continues from it by the rule of ``mixture_change="continue"``."""
    mixture_change: str = "refuse"
    """What a Megatron-order blend does when a resume state was saved under other weights or
    sources: "refuse" (default) raises ``StateError``, reproducing Megatron exactly; "continue"
    continues each source's own Megatron order at its cursor under a new blending from the resume
    point (docs/ORDER.md, "Changing a Megatron-order mixture"). The computed order always
    continues every source at its cursor."""
    packing: str = "concat"
    """How a sample is made of documents (docs/ORDER.md, "Packing"):

    * ``"concat"`` (default): documents back to back, cut every ``sequence_length`` tokens
      (Megatron's samples and exact order).
    * ``"best-fit"``: rows of whole documents of one source, best-fit decreasing, then padding
      (``loss_mask`` 0): a document of at most ``sequence_length`` (+ the extra token) tokens is
      never cut; a longer one is cut into full windows and a rest packed like a short document.
      Position ids restart at every document, and ``cu_seqlens`` follow the documents with
      ``inter_document_masking``. Orders ``"computed"`` and ``"megatron"``."""
    max_documents_per_row: int | None = None
    """``packing="best-fit"`` only: at most this many documents (pieces) in one row."""
    sequences_path: str | None = None
    """A sequences JSON (``tokenload sequences``; Megatron's ``--per-dataset-sequences-path``
    with each file's dtype): the token files open with the counts and dtype it gives and read
    no ``.idx`` header. A URL is read through the node's local copy cache."""

    def __post_init__(self) -> None:
        if self.cache not in CACHE_POLICIES:
            raise ConfigError(
                f"cache is {self.cache!r}, expected one of {CACHE_POLICIES}",
                hint="use cache='auto'",
            )
        if self.build_policy not in BUILD_POLICIES:
            raise ConfigError(
                f"build_policy is {self.build_policy!r}, expected one of {BUILD_POLICIES}",
                hint="use build_policy='auto' (see docs/SCALE.md for the others)",
            )
        if self.build_policy == "none" and self.cache == "off":
            raise ConfigError(
                "build_policy='none' loads caches only, but cache='off' reads none",
                hint="use cache='auto' or 'strict' with build_policy='none', or"
                " build_policy='every-rank'",
            )
        if (
            self.build_policy == "local-rank0"
            and self.path_to_cache is not None
            and is_url(self.path_to_cache)
        ):
            raise ConfigError(
                "build_policy='local-rank0' builds into a node-local cache folder, but"
                f" path_to_cache is {self.path_to_cache!r}, a bucket every node shares (each node's"
                " writer would upload"
                " the same files)",
                hint="use build_policy='rank0' or 'auto' with a cache in object storage (one"
                " writer, global rank 0), or 'none' after tokenload prepare-cache; or give"
                " local-rank0 a local folder",
            )
        if self.order not in ORDERS:
            raise ConfigError(
                f"order is {self.order!r}, expected one of {ORDERS}",
                hint="use order='megatron' (the default), 'computed' or 'neox'",
            )
        if self.block_size is not None and self.order != "computed":
            raise ConfigError(
                f"block_size applies to order='computed' only, not {self.order!r}",
                hint="drop block_size or set order='computed'",
            )
        self._check_packing()
        self._check_mixture_fields()
        if self.blend is not None and self.blend_per_split is not None:
            raise ConfigError(
                "blend and blend_per_split are exclusive", hint="give one of them (as Megatron)"
            )
        if self.blend is not None and self.split is None:
            raise ConfigError(
                "a blend needs a split string", hint='pass split="969, 30, 1" or "99,1,0"'
            )
        if self.mock and (self.vocab_size is None or self.eod_id is None):
            raise ConfigError(
                "mock data needs vocab_size and eod_id", hint="pass the tokenizer's values"
            )

    def _check_packing(self) -> None:
        if self.packing not in PACKINGS:
            raise ConfigError(
                f"packing is {self.packing!r}, expected one of {PACKINGS}",
                hint="use packing='concat' (Megatron's samples) or 'best-fit' (whole documents)",
            )
        if self.packing != "concat" and self.order == "neox":
            raise ConfigError(
                f"packing={self.packing!r} applies to order='computed' or 'megatron', not 'neox'",
                hint="drop packing or choose another order",
            )
        cap = self.max_documents_per_row
        if cap is not None:
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise ConfigError(
                    f"max_documents_per_row is {cap!r}; expected a positive int or None",
                    hint="give the most documents a packed row may hold, or None for no cap",
                )
            if self.packing == "concat":
                raise ConfigError(
                    "max_documents_per_row applies to packing='best-fit' only",
                    hint="set packing='best-fit' or drop max_documents_per_row",
                )

    def _check_mixture_fields(self) -> None:
        if self.mixture_change not in MIXTURE_CHANGES:
            raise ConfigError(
                f"mixture_change is {self.mixture_change!r}, expected one of {MIXTURE_CHANGES}",
                hint="use mixture_change='refuse' (Megatron's behaviour) or 'continue'",
            )
        if self.weights_schedule is None:
            return
        from ..index.schedule import check_schedule

        # kept as checked (ints, float tuples) for the builders, outside the fields: equality,
        # repr and replace() see the schedule as given
        object.__setattr__(self, "_checked_schedule", check_schedule(self.weights_schedule))
        if self.order == "neox":
            raise ConfigError(
                "weights_schedule applies to order='computed' or 'megatron', not 'neox'",
                hint="set order='computed' or 'megatron', or change the weights at a resume",
            )
        if self.mock:
            raise ConfigError(
                "weights_schedule needs a blend", hint="pass blend or blend_per_split"
            )

    def checked_schedule(self) -> Sequence[tuple[int, tuple[float, ...]]] | None:
        """``weights_schedule`` as checked when the config was made (None without one)."""
        if self.weights_schedule is None:
            return None
        return cast("Sequence[tuple[int, tuple[float, ...]]]", self.__dict__["_checked_schedule"])

    @classmethod
    def from_megatron_args(cls, argv: Sequence[str], **options: Any) -> ImportedConfig:
        """The configuration in Megatron-LM's training flags (``--data-path``, ``--split``,
        ``--seq-length``, ``--data-cache-path``, ``--dataloader-fast-cache-load``, ...), as an
        ``ImportedConfig``: ``.config()`` is the ``MegatronDataConfig``, ``.sizes`` the samples
        per split by Megatron's arithmetic. Unknown flags are a ConfigError naming them
        (``datasets.megatron_flags``)."""
        return _importer("megatron_args")(argv, **options)

    @classmethod
    def from_neox_config(
        cls,
        config: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Any],
        **options: Any,
    ) -> ImportedConfig:
        """The configuration in a GPT-NeoX YAML file (or a list of files merged as NeoX merges
        them, or a dict), as an ``ImportedConfig`` (see ``from_megatron_args``); ``order`` is
        ``"neox"``. Unsupported data keys are a ConfigError naming them
        (``datasets.neox.neox_yaml``)."""
        return _importer("neox_config")(config, **options)

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

    def source_options(self) -> SourceOptions:
        """What opening a token file (or the mock source) takes of this config."""
        return SourceOptions(
            read_mode=self.read_mode,
            warmup=self.warmup,
            vocab_size=self.vocab_size,
            eod_id=self.eod_id,
        )


class ImportedConfig(NamedTuple):
    """What an importer found: dataset fields, the samples per split, and the rest."""

    fields: dict[str, Any]
    """Keyword arguments of ``MegatronDataConfig`` (only what the config sets)."""
    sizes: list[int | None]
    """Samples of train, valid and test, as the source system computes them (``None``: one
    epoch, NeoX's ``train_epochs`` mode)."""
    extras: dict[str, Any]
    """Batch sizes, loader settings and tokenizer files: not dataset fields."""

    def config(self) -> MegatronDataConfig:
        """``MegatronDataConfig(**fields)``, every field passed as found."""
        return MegatronDataConfig(**self.fields)


def as_blend(value: Sequence[str] | str | Blend | None) -> Blend | None:
    """A ``blend`` (or one entry of ``blend_per_split``) as a ``Blend``, as given or parsed."""
    if value is None or isinstance(value, Blend):
        return value
    return parse_blend(value)


Importer = Callable[..., ImportedConfig]
"""A config importer: a config as another system writes it -> ``ImportedConfig``."""

_IMPORTERS: dict[str, Importer] = {}


def register_importer(name: str, importer: Importer) -> None:
    """Make ``importer`` what ``MegatronDataConfig.from_<name>`` calls. The importers depend on
    this module and register themselves as ``tokenload.datasets`` is imported; this module imports
    none of them (no import circle)."""
    _IMPORTERS[name] = importer


def _importer(name: str) -> Importer:
    try:
        return _IMPORTERS[name]
    except KeyError:  # only when tokenload.datasets' own __init__ did not run to the end
        raise RuntimeError(
            f"the {name} importer is not registered; import tokenload.datasets"
        ) from None
