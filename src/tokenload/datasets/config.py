"""The configuration of a Megatron-style data pipeline: data, order, items and cache policies."""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeAlias

from ..contract import LoaderDataset
from ..errors import ConfigError
from ..fielddocs import FieldDocs, documented
from ..index import Blend, parse_blend
from ..index.interleave import DEFAULT_PERIOD
from ..index.schedule import Schedule, check_schedule
from ..storage import is_url
from .items import ItemConfig
from .sources import SourceOptions

__all__ = [
    "BUILD_POLICIES",
    "CACHE_POLICIES",
    "NEOX_DEFAULT_ALPHA",
    "ORDERS",
    "ComputedOptions",
    "DataConfig",
    "Epochs",
    "ImportedConfig",
    "MegatronDataConfig",
    "MegatronOptions",
    "NeoxOptions",
    "OrderOptions",
    "Splits",
    "SupportsTyped",
    "TypedConfig",
    "as_blend",
    "fields_for_order",
]

BUILD_POLICIES = ("auto", "rank0", "local-rank0", "every-rank", "none")
"""Values of ``build_policy`` (``datasets.megatron.policy`` gives each its roles)."""
CACHE_POLICIES = ("auto", "strict", "off")
ORDERS = ("megatron", "computed", "neox")
PACKINGS = ("concat", "best-fit")
MIXTURE_CHANGES = ("refuse", "continue")
NEOX_DEFAULT_ALPHA = 1.0
"""GPT-NeoX's default ``weighted_sampler_alpha``."""

Epochs: TypeAlias = int | Sequence[int | None] | None
"""NeoX's ``train_val_test_epochs``: one int for all splits, or one per split."""


_INT32_MAX = 2**31 - 1


# -- the typed configs: one shared data record and one record per order -----------------------
@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """What every order reads: the data (blend and split), the seed, the items, the sources and
    the packing. ``MegatronDataConfig.typed()`` makes it (its flat fields of the same names)."""

    sequence_length: int
    random_seed: int = 1234
    blend: Blend | None = None
    blend_per_split: tuple[Blend | None, ...] | None = None
    split: str | None = None
    item: ItemConfig
    """The item fields (``MegatronDataConfig.item_config()``)."""
    source: SourceOptions = field(default_factory=SourceOptions)
    """How a token file (or the mock source) opens (``MegatronDataConfig.source_options()``)."""
    sequences_path: str | None = None
    drop_last_partial_validation_sequence: bool = True
    mid_level_dataset_surplus: float = 0.005
    packing: str = "concat"
    max_documents_per_row: int | None = None

    @property
    def mock(self) -> bool:
        """No data at all: Megatron's ``--mock-data``."""
        return self.blend is None and self.blend_per_split is None

    @property
    def add_extra_token(self) -> bool:
        return self.item.add_extra_token


def _checked(schedule: Schedule | None, order: str) -> None:
    """A record's schedule must be ``check_schedule``'s own value (the façade checks it once)."""
    if schedule is not None and check_schedule(schedule) is not schedule:
        raise ConfigError(
            f"the {order} order's schedule is {schedule!r}, not a checked schedule",
            hint="give weights_schedule=... to MegatronDataConfig, or pass"
            " tokenload.index.schedule.check_schedule(...) here",
        )


@dataclass(frozen=True, kw_only=True)
class MegatronOptions:
    """Megatron's order: its index caches (``path_to_cache``, ``cache``), who builds them
    (``build_policy``), the tokenizer identity in the caches' names, what a blend does when its
    weights change at a resume (``mixture_change``) and the checked ``weights_schedule``."""

    path_to_cache: str | None = None
    cache: str = "auto"
    build_policy: str = "auto"
    tokenizer: Mapping[str, Any] | None = None
    mixture_change: str = "refuse"
    schedule: Schedule | None = None
    """``weights_schedule`` as ``check_schedule`` returned it (ints, float tuples)."""

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
        if self.mixture_change not in MIXTURE_CHANGES:
            raise ConfigError(
                f"mixture_change is {self.mixture_change!r}, expected one of {MIXTURE_CHANGES}",
                hint="use mixture_change='refuse' (Megatron's behaviour) or 'continue'",
            )
        _checked(self.schedule, "megatron")


@dataclass(frozen=True, kw_only=True)
class ComputedOptions:
    """The computed order: ``block_size`` (B windows per block, None for the flat order),
    ``period`` (the blend schedule's period; weights resolve to 1/period) and the checked
    ``weights_schedule``."""

    block_size: int | None = None
    period: int = DEFAULT_PERIOD
    schedule: Schedule | None = None
    """``weights_schedule`` as ``check_schedule`` returned it."""

    def __post_init__(self) -> None:
        b = self.block_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ConfigError(f"block_size is {b!r}; expected a positive int or None (flat order)")
        _checked(self.schedule, "computed")


@dataclass(frozen=True, kw_only=True)
class NeoxOptions:
    """GPT-NeoX's order: the epoch mode and the per-split blends' weights (NeoX's options of
    the same names)."""

    weight_by_num_documents: bool = False
    """Blend weights from the files' document counts, raised to ``weighted_sampler_alpha``."""
    weighted_sampler_alpha: float = NEOX_DEFAULT_ALPHA
    num_epochs: Epochs = None
    """NeoX's ``train_val_test_epochs``: one int for all splits, or one per split; a falsy entry
    means "from the sample count", and 1 where the size is ``None``."""


OrderOptions: TypeAlias = MegatronOptions | ComputedOptions | NeoxOptions
"""One order's record; ``build_datasets`` dispatches on its type."""


class Splits(NamedTuple):
    """What ``build_datasets`` returns: the train, valid and test datasets, each one the loader
    reads (``contract.LoaderDataset``), None for a split with no data. A tuple: ``train, valid,
    test = build_datasets(...)`` unpacks it."""

    train: LoaderDataset | None
    valid: LoaderDataset | None
    test: LoaderDataset | None


class TypedConfig(NamedTuple):
    """A ``MegatronDataConfig`` as the library reads it: the shared data and the order's record."""

    data: DataConfig
    order: OrderOptions

    def typed(self) -> TypedConfig:
        """Itself (``SupportsTyped``)."""
        return self


class SupportsTyped(Protocol):
    """What the per-order entries and the helpers that callers reach directly take: anything
    that gives the typed configs (a ``TypedConfig``, or the flat ``MegatronDataConfig`` through
    its one conversion); they read the typed records only."""

    def typed(self) -> TypedConfig: ...


_ORDER_ONLY: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {
    "path_to_cache": (("megatron",), (None,)),
    "cache": (("megatron",), ("auto", "off")),
    "tokenizer": (("megatron",), (None,)),
    "build_policy": (("megatron",), ("auto", "every-rank")),
    "mixture_change": (("megatron",), ("refuse",)),
    "block_size": (("computed",), (None,)),
    "weights_schedule": (("megatron", "computed"), (None,)),
    "weight_by_num_documents": (("neox",), (False,)),
    "weighted_sampler_alpha": (("neox",), (NEOX_DEFAULT_ALPHA,)),
    "num_epochs": (("neox",), (None,)),
    "packing": (("megatron", "computed"), ("concat",)),
}
"""The fields that some orders only read: (those orders, the values every other order takes).
The others take the default, and the two values that say what they do anyway: no index cache
read or written (``cache="off"``) and each rank building in memory (``build_policy="every-rank"``).
Anything else given to an order that does not read it is a ``ConfigError`` naming the field and
the order: the index caches' folder (``path_to_cache``), ``cache="strict"`` and the tokenizer
identity in the caches' names are the Megatron order's; so is ``mixture_change``, which chooses
how a Megatron-order blend meets a resume under other weights (the computed order always
continues, and reads no such option)."""


def fields_for_order(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``MegatronDataConfig`` keywords without the order-only values that their ``order``
    (default ``"megatron"``) does not take. For importers and adapters that fill fields for every
    order from another system's settings (a Megatron job's ``--data-cache-path``, tokenizer
    identity and ``--dataloader-fast-cache-load``, i.e. ``build_policy="none"``, under
    ``order="computed"``; GPT-NeoX's ``use_shared_fs=False``): a user's own keywords are not
    filtered, and one that the order does not take is a ``ConfigError``."""
    order = fields.get("order", "megatron")
    return {
        k: v
        for k, v in fields.items()
        if k not in _ORDER_ONLY
        or order in _ORDER_ONLY[k][0]
        or order not in ORDERS
        or v in _ORDER_ONLY[k][1]
    }


@documented
@dataclass(frozen=True, kw_only=True)
class MegatronDataConfig(metaclass=FieldDocs):
    """Everything that decides Megatron's datasets, their order and their items.

    The fields are flat, as users, importers and the CLI give them: the façade of the typed
    configs, into which ``typed()`` converts it once (``build_datasets`` calls it). Most fields
    are shared by every order (``DataConfig``); the others are its order's record:
    ``path_to_cache``, ``cache``, ``build_policy``, ``tokenizer`` and ``mixture_change``
    (``MegatronOptions``), ``block_size`` (``ComputedOptions``), ``weight_by_num_documents``,
    ``weighted_sampler_alpha`` and ``num_epochs`` (``NeoxOptions``); ``weights_schedule``
    (Megatron and computed records) and ``packing``. An option given to an order that does not
    read it (``_ORDER_ONLY``: ``path_to_cache``, ``cache="strict"``, ``tokenizer``,
    ``mixture_change`` or a ``build_policy`` that builds, waits for or loads caches without the
    Megatron order; ``block_size`` without the computed order; a NeoX option elsewhere; a
    schedule or packing with NeoX) is a ``ConfigError`` naming both and what to do. The orders
    without index caches take ``cache="off"`` and ``build_policy="every-rank"``: what they do
    anyway. A keyword that is no field (``seed=``) is a ``ConfigError`` naming the nearest
    fields."""

    def __new__(cls, *args: Any, **fields: Any) -> MegatronDataConfig:
        unknown = sorted(set(fields) - set(cls.__dataclass_fields__))
        if unknown:
            import difflib

            known = sorted(cls.__dataclass_fields__)
            near = [difflib.get_close_matches(k, known, n=2, cutoff=0.5) for k in unknown]
            if unknown == ["seed"]:
                near = [["random_seed"]]
            said = "; ".join(
                f"{k!r}: did you mean {' or '.join(n)}?" if n else f"{k!r}: no such field"
                for k, n in zip(unknown, near, strict=True)
            )
            raise ConfigError(
                f"MegatronDataConfig has no field {', '.join(map(repr, unknown))} ({said})",
                hint="help(tokenload.datasets.MegatronDataConfig) lists its fields",
            )
        return super().__new__(cls)

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
    """The tokenizer's padding id (-1: none). As in megatron-core's ``GPTDataset``, a token or
    label equal to it (0 or more) has no loss and is served as 0; so are a packed row's padding
    slots, whatever this id is: a loss that skips padding reads ``loss_mask``."""
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
        for name in ("sequence_length", "random_seed"):  # (each order checks the seed's range)
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ConfigError(f"{name} is {value!r}; expected an int", field=name)
            object.__setattr__(self, name, int(value))  # a NumPy integer as a plain int
        if not 1 <= self.sequence_length <= _INT32_MAX:  # Megatron's int32, for every order
            raise ConfigError(
                f"sequence_length is {self.sequence_length}; expected 1..{_INT32_MAX}",
                field="sequence_length",
            )
        if self.order not in ORDERS:
            raise ConfigError(
                f"order is {self.order!r}, expected one of {ORDERS}",
                hint="use order='megatron' (the default), 'computed' or 'neox'",
            )
        if self.order != "computed" and not 0 <= self.random_seed <= 2**32 - 1:
            raise ConfigError(  # here, before anything is built or any folder made
                f"random_seed is {self.random_seed}; expected 0..2**32-1 (the seeds of NumPy's"
                f" RandomState, which the {self.order} order shuffles with)",
                field="random_seed",
                hint="use the job's seed (Megatron's and GPT-NeoX's default is 1234)",
            )
        self._check_order_fields()
        self._check_packing()
        if self.blend is not None and self.blend_per_split is not None:
            raise ConfigError(
                "blend and blend_per_split are exclusive", hint="give one of them (as Megatron)"
            )
        if (
            self.blend_per_split is not None
            and any(b is not None for b in self.blend_per_split)
            and self.split is not None
        ):
            raise ConfigError(
                f"split {self.split!r} is given with blend_per_split; a split string divides one"
                " blend, and per-split blends have none to divide (megatron-core asserts that"
                " split and blend_per_split are incompatible)",
                hint="drop split, or give one blend and keep split",
                field="split",
            )
        if self.blend is not None and self.split is None:
            raise ConfigError(
                "a blend needs a split string", hint='pass split="969, 30, 1" or "99,1,0"'
            )
        if self.mock and (self.vocab_size is None or self.eod_id is None):
            raise ConfigError(
                "mock data needs vocab_size and eod_id", hint="pass the tokenizer's values"
            )
        if self.weights_schedule is not None and self.mock:
            raise ConfigError(
                "weights_schedule needs a blend", hint="pass blend or blend_per_split"
            )

    def _check_order_fields(self) -> None:
        """An order-only field set away from its default under another order is a ConfigError
        naming both; then the order's record checks the values (``order_options``)."""
        if self.cache not in CACHE_POLICIES:
            raise ConfigError(
                f"cache is {self.cache!r}, expected one of {CACHE_POLICIES}",
                hint="use cache='auto'",
            )
        MegatronOptions(build_policy=self.build_policy, mixture_change=self.mixture_change)
        if self.weights_schedule is not None:
            check_schedule(self.weights_schedule)  # a bad schedule is named first, for any order
        for name, (orders, elsewhere) in _ORDER_ONLY.items():
            value = getattr(self, name)
            if self.order not in orders and value not in elsewhere:
                named = " or ".join(repr(o) for o in orders)
                raise ConfigError(
                    f"{name} applies to order={named} only, not {self.order!r}"
                    f" ({name}={value!r} given; the {self.order!r} order does not read it)",
                    hint=f"drop {name} for order={self.order!r}, or set order={named}",
                    field=name,
                )
        self.order_options()

    def _check_packing(self) -> None:
        if self.packing not in PACKINGS:
            raise ConfigError(
                f"packing is {self.packing!r}, expected one of {PACKINGS}",
                hint="use packing='concat' (Megatron's samples) or 'best-fit' (whole documents)",
            )
        cap = self.max_documents_per_row
        if cap is not None:
            if isinstance(cap, bool) or not isinstance(cap, numbers.Integral) or cap < 1:
                raise ConfigError(
                    f"max_documents_per_row is {cap!r}; expected a positive int or None",
                    hint="give the most documents a packed row may hold, or None for no cap",
                )
            object.__setattr__(self, "max_documents_per_row", int(cap))
            if self.packing == "concat":
                raise ConfigError(
                    "max_documents_per_row applies to packing='best-fit' only",
                    hint="set packing='best-fit' or drop max_documents_per_row",
                )
        if self.packing == "best-fit" and self.block_size is not None:
            raise ConfigError(
                f"block_size applies to packing='concat' only (block_size={self.block_size!r}"
                " given): it groups the computed order's windows, and packed rows are planned"
                " in blocks of documents of their own",
                hint="drop block_size, or set packing='concat'",
                field="block_size",
            )

    # -- the one conversion into the typed configs ----------------------------------------------
    def typed(self) -> TypedConfig:
        """This config as the library reads it: the shared ``DataConfig`` and its order's
        record (``build_datasets`` converts once per call and dispatches on the record's type)."""
        return TypedConfig(self.data_config(), self.order_options())

    def data_config(self) -> DataConfig:
        """The fields every order reads, as one ``DataConfig`` (blends parsed)."""
        per_split = self.blend_per_split
        return DataConfig(
            sequence_length=self.sequence_length,
            random_seed=self.random_seed,
            blend=as_blend(self.blend),
            blend_per_split=None if per_split is None else tuple(as_blend(b) for b in per_split),
            split=self.split,
            item=self.item_config(),
            source=self.source_options(),
            sequences_path=self.sequences_path,
            drop_last_partial_validation_sequence=self.drop_last_partial_validation_sequence,
            mid_level_dataset_surplus=self.mid_level_dataset_surplus,
            packing=self.packing,
            max_documents_per_row=self.max_documents_per_row,
        )

    def order_options(self, order: str | None = None) -> OrderOptions:
        """The record of ``order`` (default: this config's own), made of its fields, the
        ``weights_schedule`` checked. Another order than the config's serves the per-order
        builders called directly (``build_computed_datasets(config, sizes)``)."""
        order = self.order if order is None else order
        schedule = None if self.weights_schedule is None else check_schedule(self.weights_schedule)
        if order == "computed":
            return ComputedOptions(block_size=self.block_size, schedule=schedule)
        if order == "neox":
            return NeoxOptions(
                weight_by_num_documents=self.weight_by_num_documents,
                weighted_sampler_alpha=self.weighted_sampler_alpha,
                num_epochs=self.num_epochs,
            )
        return MegatronOptions(
            path_to_cache=self.path_to_cache,
            cache=self.cache,
            build_policy=self.build_policy,
            tokenizer=self.tokenizer,
            mixture_change=self.mixture_change,
            schedule=schedule,
        )

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
    to_order: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """The importer's own conversion of its fields for another order than its own (GPT-NeoX's
    blend weighted by document counts, which only the NeoX order reads, becomes those weights),
    applied by ``config(order=...)`` unless the overrides give the blend; None: none needed."""

    def config(self, **overrides: Any) -> MegatronDataConfig:
        """``MegatronDataConfig(**fields)``, without the fields the imported order does not read
        (``fields_for_order``: e.g. GPT-NeoX's ``use_shared_fs=False`` is
        ``build_policy="local-rank0"``, which the Megatron order reads and the NeoX order, built
        in memory on every rank, does not). ``overrides``: fields set on top of the imported
        ones (``tokenizer=`` a Megatron description's tokenizer object, ``build_policy="none"``,
        ``packing="best-fit"``, ...); a field the order does not read is a ``ConfigError``."""
        imported = dict(self.fields)
        if "order" in overrides:  # the imported fields the chosen order reads
            own = imported.get("order", "megatron")
            imported["order"] = overrides["order"]
            blend_given = "blend" in overrides or "blend_per_split" in overrides
            if self.to_order is not None and overrides["order"] != own and not blend_given:
                imported = self.to_order(imported)
        return MegatronDataConfig(**{**fields_for_order(imported), **overrides})


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
