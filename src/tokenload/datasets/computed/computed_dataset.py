"""The computed order (issue 12): Megatron's datasets and items with no index build at all.

``build_computed_datasets(config, sizes)`` takes the same ``MegatronDataConfig`` and sizes as
``build_datasets`` and returns (train, valid, test) datasets with the same items (tokens, labels,
loss_mask, position_ids, the attention-mask options, cu_seqlens, dataset_id for blends), the same
``read_batch``/``finish_batch`` protocol for the loader's workers, and a resumable order. What
differs is how sample k is found:

* **Windows.** A split of a token file is the sequences ``[begin, end)`` of Megatron's split
  semantics (``split_range``), stored back to back: one stream of T tokens. Window w is stream
  tokens ``[w*S, w*S + S + x)`` (x = 1 with the extra token): ``(T - x) // S`` windows per epoch,
  read as one span of ``.bin`` each (``index.windows``).
* **Order.** Epoch e of a source is a keyed permutation of its windows computed on demand from
  (seed, source identity, e) (``index.window_order``): O(1) per sample, vectorized over a batch, no
  array of size n anywhere. ``block_size=B`` permutes blocks of B consecutive windows, then the
  windows inside each block, so that a micro-batch reads a few contiguous ranges.
* **Blends.** A periodic earliest-deadline-first schedule (``index.interleave``) says which
  source serves global sample k; the source serves its next cursor (``index.mixture``). Every
  prefix of the order is within one sample of the weights (per-sample weights; the sources share
  S, so per-token weights are the same). Memory: two int32 arrays of the period (2^16) per blend.
* **Mixture changes.** Each source has its own permutation and cursor, so a blend can change its
  weights or sources mid-run: the loader's state records the cursors (``mixture_state``), and a
  blend built with other weights continues every source where it stopped (``resume_mixture``):
  no sample of a source repeated within its epoch, none skipped. A source that runs out starts
  its next epoch, with a key of its own.

Document boundaries are not needed to read a window. ``documents(indices)`` gives the pieces
``(sequence, offset, length)`` of each sample by a binary search over the pointers of the file it
touches (no copy of the pointers); with ``inter_document_masking`` the read makes each window's
boundaries from them (``cu_seqlens``, per-document position ids), by the Megatron order's rule
(the documents' lengths, not EOD tokens: ``items.document_bounds``). Without it, the EOD options
read the tokens, as in the Megatron order.

**Startup and memory.** Per source, building reads a few ``.idx`` entries (``extents``)
and keeps O(1) numbers, whatever the number of documents. No file stays open: a rank maps only
the token files its samples touch, on their first read, in the process that reads them.

**Trade-off against the Megatron order.** No index files, no cache folder, no barrier, no
O(N) build on any rank, and a mixture that can change mid-run; but another order than
Megatron's (not bit-identical to a Megatron run), documents are not shuffled inside a split
(the sample is a window of the file's document order: neighbouring documents share samples as
in the file), and the fewer than S tokens after an epoch's last window are not read in that
epoch (Megatron joins them to the next epoch). docs/ORDER.md compares both.

**Fingerprint** (what a resume state must match): the source identities (``Extent.identity``:
content facts read at build, never the path), seed, block size and item layout; for a blend not
the weights, so a state resumes into a blend of other weights.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ...arrays import from_end, sample_indices
from ...contract import Allocator, RowPieces
from ...errors import ConfigError
from ...format import TokenFile, read_sequences
from ...index import MOCK_SPLIT, plan_splits
from ...index.plan import MidLevelPlan, SplitPlan
from ...index.window_order import WindowOrder, source_seed
from ...index.windows import window_pieces
from ..config import ComputedOptions, DataConfig, Splits, SupportsTyped
from ..contract_parts import OneSourceContract
from ..items import ItemConfig, document_bounds, finish_windows
from ..pieces import input_pieces, token_windows
from ..sources import MockSource, open_source
from .computed_blend import ComputedBlendedDataset, _Items
from .extents import Extent, OnExtent, file_extent, mock_extent

if TYPE_CHECKING:
    from .packed import ComputedPackedDataset

__all__ = [
    "ComputedBlendedDataset",
    "ComputedGPTDataset",
    "ComputedOptions",
    "build_computed",
    "build_computed_datasets",
]

_MIN, _MAX = np.minimum.reduce, np.maximum.reduce  # the ufuncs: less dispatch than .min()/.max()


class ComputedGPTDataset(OnExtent, _Items, OneSourceContract):
    """Items of one split of one token file (or of the mock source) in the computed order."""

    def __init__(
        self,
        source: Any,
        extent: Extent,
        item: ItemConfig,
        *,
        seed: int,
        length: int,
        block_size: int | None = None,
        startup_phases: dict[str, float] | None = None,
    ) -> None:
        self.source = source
        self.extent = extent
        self.item = item
        self.seed = int(seed)
        self.block_size = block_size
        self._length = int(length)
        self.startup_phases = startup_phases or {}
        self._order: WindowOrder | None = None
        self._pointers: np.ndarray | None = None

    @property
    def samples_per_epoch(self) -> int:
        """Windows per epoch: every sample of the split once."""
        return self.grid.num_windows

    @property
    def order(self) -> WindowOrder:
        """The window order (a ConfigError for a split without a whole window)."""
        if self._order is None:
            self._order = WindowOrder(
                self.grid.num_windows,
                source_seed(self.seed, self.identity),
                block_size=self.block_size,
            )
        return self._order

    def __len__(self) -> int:
        return self._length

    @property
    def fingerprint(self) -> str:
        """Identity of data, order and item layout: what a resume state must match."""
        text = f"computed|{self.identity}|{self.seed}|{self.block_size}|{self.item!r}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def windows_of(self, indices: npt.ArrayLike) -> np.ndarray:
        """int64 window number of each dataset index (the order, no read)."""
        idx, bounds = from_end(sample_indices(indices), len(self))
        if bounds is None:
            return idx
        return self.order.global_windows(idx, bounds)

    def read_windows(self, windows: np.ndarray) -> np.ndarray:
        """``(B, S + extra)`` tokens of windows, in the file's dtype: one span each."""
        width = self.grid.window
        if not isinstance(self.source, TokenFile):  # the mock source reads pieces
            seqs, first, lengths, offsets = self.documents_of(windows)
            starts = np.zeros_like(lengths)
            starts[first] = offsets
            return self.source.read_pieces(seqs, starts, lengths).reshape(len(windows), width)
        starts = self.grid.starts(windows)
        return self.source.read_spans(starts, np.full(starts.size, width, dtype=np.int64)).reshape(
            starts.size, width
        )

    def read_batch(self, indices: npt.ArrayLike) -> dict[str, Any]:
        windows = self.windows_of(indices)
        batch = {"windows": self.read_windows(windows), "padded": False}
        if self.item.inter_document_masking:
            batch["doc_bounds"] = self.bounds_of(windows)
        return batch

    def bounds_of(self, windows: np.ndarray) -> np.ndarray:
        """int32 ``(B, S + 1)`` document boundaries of windows, from their pieces, by the rule of
        the Megatron order (``items.document_bounds``)."""
        _, first, lengths, _ = self.documents_of(windows)
        return document_bounds(lengths, first, self.item.sequence_length, self.item.extra)

    def finish_batch(
        self, batch: dict[str, Any], alloc: Allocator | None = None
    ) -> dict[str, np.ndarray]:
        return finish_windows(batch, self.item, alloc)

    def _pointer_array(self) -> tuple[np.ndarray, np.ndarray, int]:
        lengths = self.source.sequence_lengths
        if isinstance(self.source, TokenFile):
            return self.source.sequence_pointers, lengths, self.source.dtype.itemsize
        if self._pointers is None:  # the mock source: sequences back to back, 1 "byte" per token
            self._pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)])
        return self._pointers, lengths, 1

    def documents_of(
        self, windows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The document pieces of windows (``index.windows.window_pieces``)."""
        pointers, lengths, itemsize = self._pointer_array()
        e = self.extent
        return window_pieces(
            self.grid, np.asarray(windows), pointers, lengths, itemsize, e.begin, e.end
        )

    def documents(
        self, indices: npt.ArrayLike
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each sample's document pieces ``(sequences, first, lengths, first_offsets)``, as
        ``GPTDataset._pieces`` gives them: which sequences the sample spans, where."""
        return self.documents_of(self.windows_of(indices))

    # -- provenance (contract.PieceSource) ------------------------------------------------------
    def sample_pieces(self, indices: npt.ArrayLike) -> RowPieces:
        """The document pieces of each sample's ``tokens``."""
        return self.window_pieces(self.windows_of(indices))

    def window_pieces(self, windows: np.ndarray) -> RowPieces:
        """The document pieces of windows' input tokens (``pieces.input_pieces``)."""
        seqs, first, lengths, offsets = self.documents_of(windows)
        return input_pieces(seqs, first, lengths, offsets, self.item.sequence_length)

    def document_windows(self, document: int) -> np.ndarray:
        """The windows whose input tokens hold a token of ``document`` (a sequence of the file):
        its tokens' place in the split's stream, cut by the grid. None outside the split."""
        e = self.extent
        if not e.begin <= document < e.end:
            return np.zeros(0, dtype=np.int64)
        pointers, lengths, itemsize = self._pointer_array()
        start = int(pointers[document]) // itemsize - self.grid.first_token
        stop = start + int(lengths[document])
        return token_windows(start, stop, self.grid.sequence_length, self.grid.num_windows)

    def cursors_of(self, windows: np.ndarray, cursors: int) -> np.ndarray:
        """Sorted int64 cursors below ``cursors`` (this source's samples, all epochs) that read
        ``windows``: each epoch's position of them, by the window order's inverse."""
        n = self.grid.num_windows
        if not windows.size or cursors <= 0 or n <= 0:
            return np.zeros(0, dtype=np.int64)
        epochs = np.arange(-(-cursors // n), dtype=np.int64)
        w = np.tile(windows, epochs.size)
        e = np.repeat(epochs, windows.size)
        c = e * n + self.order.epoch_positions(w, e)
        return np.sort(c[c < cursors])

    def samples_of(self, source: int, document: int) -> np.ndarray:
        """The dataset indices whose ``tokens`` hold a token of ``document`` (``source`` 0)."""
        if source != 0:
            return np.zeros(0, dtype=np.int64)
        return self.cursors_of(self.document_windows(document), len(self))

    # -- the loader's contract (contract.LoaderDataset) ------------------------------------------
    # reads_in_groups, describe_sources, sample_bytes, blend_index, mixture_cursors: from
    # OneSourceContract
    def epoch_sizes(self) -> list[int]:
        """Windows per epoch (the length for a split without a whole window)."""
        windows = self.samples_per_epoch
        return [windows if isinstance(windows, int) and windows > 0 else len(self)]


def _whole_epochs(asked: int | None, per_epoch: int) -> int:
    """Every sample of the epochs a request needs (one epoch for None), as Megatron's length."""
    if per_epoch <= 0:
        return 0
    epochs = 1 if not asked else -(-asked // per_epoch)
    return epochs * per_epoch


def build_computed(
    data: DataConfig, options: ComputedOptions, sizes: Sequence[int | None]
) -> Splits:
    """The (train, valid, test) datasets of ``data`` in the computed order (module docstring;
    ``build_datasets`` dispatches here on ``ComputedOptions``).

    ``sizes`` as in ``build_datasets``: samples wanted per split, ``None`` for one epoch. A
    single file's split holds every sample of the epochs the request needs; a weighted blend
    holds the requested size (Megatron's sum of per-prefix targets), an unweighted blend weighs
    its sources by their windows and holds the request (one epoch of every source for None). No
    file is written or kept open; the call needs no other rank.
    """
    started = time.perf_counter()
    c = data
    split = MOCK_SPLIT if c.mock else (None if c.blend_per_split is not None else c.split)
    plans = plan_splits(
        blend=None if c.mock else c.blend,
        blend_per_split=None if c.blend_per_split is None else list(c.blend_per_split),
        split=split,
        sizes=list(sizes),
        surplus=c.mid_level_dataset_surplus,
    )
    builder = ComputedBuilder(c, options.block_size)
    out: list[Any] = [
        None
        if plan is None
        else builder.split(plan, options.period, options.schedule if k == 0 else None)
        for k, plan in enumerate(plans)
    ]
    phases = {"header_reads": time.perf_counter() - started}
    for ds in out:
        if ds is not None:
            ds.startup_phases = phases
    return Splits(out[0], out[1], out[2])


def build_computed_datasets(
    config: SupportsTyped,
    sizes: Sequence[int | None],
    options: ComputedOptions | None = None,
    **fields: Any,
) -> Splits:
    """``build_computed`` of ``config``'s typed records (a ``MegatronDataConfig`` converts, of
    any order). ``options``: the order's record (default: the config's own, or
    ``ComputedOptions`` with the config's schedule); keywords replace single fields
    (``block_size=4``).
    """
    data, order = config.typed()
    if options is None:
        own = order if isinstance(order, ComputedOptions) else None
        options = own or ComputedOptions(schedule=getattr(order, "schedule", None))
    return build_computed(data, replace(options, **fields), sizes)


class ComputedBuilder:
    """One ``build_computed_datasets`` call: each source opened once, its splits' extents and
    blends."""

    def __init__(self, data: DataConfig, block_size: int | None) -> None:
        self.data = data
        self.item = data.item
        self.layout = {
            "sequence_length": data.sequence_length,
            "extra": int(data.add_extra_token),
        }
        self.block_size = None if block_size is None else int(block_size)
        self.sequences = (
            None if data.sequences_path is None else read_sequences(data.sequences_path)
        )
        self._sources: dict[str | None, MockSource | TokenFile] = {}

    def source(self, prefix: str | None) -> MockSource | TokenFile:
        """A lazy source per prefix (a ``TokenFile`` opens on its first read)."""
        if prefix not in self._sources:
            self._sources[prefix] = open_source(prefix, self.data.source, self.sequences)
        return self._sources[prefix]

    def member(self, mid: MidLevelPlan) -> ComputedGPTDataset | ComputedPackedDataset:
        source = self.source(mid.prefix)
        if mid.prefix is None:
            assert isinstance(source, MockSource)
            extent = mock_extent(source, mid.bookend, **self.layout)
        else:
            extent = file_extent(
                mid.prefix,
                mid.bookend,
                self.sequences,
                read_mode=self.data.source.read_mode,
                **self.layout,
            )
        if self.data.packing == "best-fit":
            return self.packed_member(mid, source, extent)
        n = extent.grid.num_windows
        if n == 0 and mid.num_samples:
            raise ConfigError(
                f"the {mid.split} split of {mid.prefix or 'the mock data'} holds"
                f" {extent.grid.num_tokens} tokens"
                f" (sequences {extent.begin}..{extent.end}), less than one sample of"
                f" {extent.grid.window} tokens, but {mid.num_samples} samples were requested",
                hint=f"change the split string, ask for no {mid.split} samples, or use a shorter"
                " sequence length",
            )
        return ComputedGPTDataset(
            source,
            extent,
            self.item,
            seed=self.data.random_seed,
            length=_whole_epochs(mid.num_samples, n),
            block_size=self.block_size,
        )

    def packed_member(
        self, mid: MidLevelPlan, source: MockSource | TokenFile, extent: Extent
    ) -> ComputedPackedDataset:
        """Rows of whole documents of one split (``packing="best-fit"``)."""
        from .packed import ComputedPackedDataset

        if extent.grid.num_tokens == 0 and mid.num_samples:  # no document, or only empty ones
            held = "no document" if extent.end <= extent.begin else "only empty documents"
            raise ConfigError(
                f"the {mid.split} split of {mid.prefix or 'the mock data'} holds {held}"
                f" (sequences {extent.begin}..{extent.end}, 0 tokens), but {mid.num_samples}"
                " samples were requested",
                hint=f"change the split string or ask for no {mid.split} samples",
            )
        return ComputedPackedDataset(
            source,
            extent,
            self.item,
            seed=self.data.random_seed,
            length=mid.num_samples,
            max_documents=self.data.max_documents_per_row,
        )

    def split(
        self,
        plan: SplitPlan,
        period: int,
        schedule: Sequence[tuple[int, Sequence[float]]] | None = None,
    ) -> ComputedGPTDataset | ComputedPackedDataset | ComputedBlendedDataset:
        members = [self.member(mid) for mid in plan.datasets]
        if not plan.blended:
            if schedule is not None:
                raise ConfigError(
                    "weights_schedule needs a blend of two or more prefixes for the train split",
                    hint="drop weights_schedule or list the sources in blend",
                )
            return members[0]
        # one epoch of packed rows (size None) is counted exactly: every block of it packed once
        # (an estimate would leave some of a source's rows unserved); else samples per epoch
        windows = [
            (len(m) if plan.size is None else m.samples_per_epoch)
            if getattr(m, "packed", False)
            else m.grid.num_windows
            for m in members
        ]
        empty = [mid.prefix for mid, n in zip(plan.datasets, windows) if n == 0]
        if empty and plan.size != 0:  # asked for no sample, the split is built empty
            raise ConfigError(
                f"the {plan.split} split of {empty[0]} holds less than one sample of"
                f" {members[0].grid.window} tokens",
                hint="drop the prefix from the blend, change the split string or use a shorter"
                " sequence length",
            )
        weights: Sequence[float]
        if plan.weights is not None:
            assert plan.size is not None  # a weighted blend's size is given
            weights, length = list(plan.weights), int(plan.size)
        else:
            weights = windows
            length = sum(windows) if plan.size is None else int(plan.size)
        return ComputedBlendedDataset(
            members,
            weights,
            seed=self.data.random_seed,
            length=length,
            block_size=self.block_size,
            period=period,
            schedule=schedule,
        )
