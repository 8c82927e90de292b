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
  (seed, source identity, e) (``index.computed``): O(1) per sample, vectorized over a batch, no
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

Document boundaries are not needed to read a window: the item fields come from the tokens (EOD
positions), exactly as in the Megatron order, which also reads a sample's document pieces back
to back. ``documents(indices)`` gives the pieces ``(sequence, offset, length)`` of each sample
by a binary search over the pointers of the file it touches (no copy of the pointers).

**Startup and memory.** Per source, building reads a few entries of the ``.idx`` (its header,
or nothing of it with a sequences JSON, then the pointers at the split's two ends and at most
8 KiB of lengths next to them) with ``pread``, and keeps O(1) numbers: time and per-rank memory
do not depend on the number of documents. No file stays open: a rank opens (maps) only the
token files its samples touch, on their first read, in the process that reads them.

**Trade-off against the Megatron order.** No index files, no cache folder, no barrier, no
O(N) build on any rank, and a mixture that can change mid-run; but another order than
Megatron's (not bit-identical to a Megatron run), documents are not shuffled inside a split
(the sample is a window of the file's document order: neighbouring documents share samples as
in the file), and the fewer than S tokens after an epoch's last window are not read in that
epoch (Megatron joins them to the next epoch). docs/ORDER.md compares both.

**Fingerprint** (what a resume state must match): the source identities (content facts read at
build: counts, dtype, ``.bin`` size, the split's range and token extent, a hash of the lengths
next to both ends; never the path), seed, block size and item layout; for a blend not the
weights, so a state resumes into a blend of other weights.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from ..errors import ConfigError, FormatError, StateError
from ..format import read_sequences
from ..format.idx import FLOAT_CODES, HEADER_SIZE, parse_header
from ..format.legacy import is_legacy
from ..format.sequences import SequencesFile
from ..format.storage import read_error
from ..index import MOCK_SPLIT, Blend, parse_blend, plan_splits, split_range
from ..index.computed import WindowOrder, source_seed
from ..index.interleave import DEFAULT_PERIOD
from ..index.mixture import Mixture, MixtureState, resume
from ..index.windows import WindowGrid, window_pieces
from ..storage import file_size, local_path
from .config import MegatronDataConfig
from .items import Allocator, ItemConfig, build_items
from .sources import MockSource, open_source, open_token_file

__all__ = ["ComputedBlendedDataset", "ComputedGPTDataset", "build_computed_datasets"]

_MIN, _MAX = np.minimum.reduce, np.maximum.reduce  # the ufuncs: less dispatch than .min()/.max()
_SAMPLED_LENGTHS = 1024
"""Lengths hashed next to each end of a split for its identity (4 KiB each)."""


@dataclass(frozen=True, kw_only=True)
class Extent:
    """What the computed order needs of one split of one file, read without mapping it."""

    begin: int
    end: int
    grid: WindowGrid
    dtype: np.dtype
    identity: str
    """Content facts of the file and the split (never its path)."""


def _pread(fd: int, offset: int, size: int, path: str) -> bytes:
    try:
        data = os.pread(fd, size, offset)
    except OSError as exc:
        raise read_error(exc, path, "the index") from None
    if len(data) != size:
        raise FormatError(
            f"index holds {len(data)} bytes at offset {offset}, expected {size}",
            path=path, hint="the .idx is truncated; rewrite the token file",
        )
    return data


def _file_extent(prefix: str, bookend, sequences: SequencesFile | None, config: MegatronDataConfig) -> Extent:
    """The split ``bookend`` of ``prefix``: a few ``pread`` s of the ``.idx`` (no header with a
    sequences JSON that gives the dtype), the ``.bin`` size from one ``stat`` (a URL: its
    node-local ``.idx`` copy and one HEAD)."""
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    try:
        fd = os.open(local_path(idx_path), os.O_RDONLY)  # a URL's .idx: its local copy
    except OSError as exc:
        raise read_error(exc, idx_path, "the index") from None
    try:
        entry = None if sequences is None else sequences.entry(prefix)
        if entry is not None and entry.dtype is not None:
            n, d, dtype = entry.sequence_count, entry.document_count, np.dtype(entry.dtype)
        else:
            size = os.fstat(fd).st_size
            head = _pread(fd, 0, min(HEADER_SIZE, size), idx_path)
            if is_legacy(head[:8]):
                return _opened_extent(prefix, bookend, config)
            header = parse_header(head, size, idx_path, dtype_codes="megatron")
            if header.code in FLOAT_CODES:  # the .bin size decides the float type: open it
                return _opened_extent(prefix, bookend, config)
            n, d, dtype = header.sequence_count, header.document_count, header.dtype
        begin, end = split_range(bookend, n)
        sampled = b""
        first = last = 0
        if end > begin:
            pointers = HEADER_SIZE + 4 * n
            first = struct.unpack("<q", _pread(fd, pointers + 8 * begin, 8, idx_path))[0]
            last_ptr = struct.unpack("<q", _pread(fd, pointers + 8 * (end - 1), 8, idx_path))[0]
            head_n = min(_SAMPLED_LENGTHS, end - begin)
            tail_n = min(_SAMPLED_LENGTHS, end - begin)
            lead = _pread(fd, HEADER_SIZE + 4 * begin, 4 * head_n, idx_path)
            tail = _pread(fd, HEADER_SIZE + 4 * (end - tail_n), 4 * tail_n, idx_path)
            last = last_ptr + dtype.itemsize * int(np.frombuffer(tail, dtype="<i4")[-1])
            sampled = lead + tail
    finally:
        os.close(fd)
    bin_bytes = file_size(bin_path)  # one stat, or one HEAD of an object (StorageError)
    if last > bin_bytes:
        raise FormatError(
            f".bin is {bin_bytes} bytes, shorter than the {last} bytes its index describes",
            path=bin_path, hint="the .bin and .idx do not belong together or one was truncated",
        )
    facts = f"{n}|{d}|{dtype.str}|{bin_bytes}|{begin}|{end}|{first}|{last}|{xxhash.xxh3_64_hexdigest(sampled)}"
    return _extent(begin, end, first // dtype.itemsize, (last - first) // dtype.itemsize, dtype, facts, config)


def _opened_extent(prefix: str, bookend, config: MegatronDataConfig) -> Extent:
    """Legacy and float indices: their reader decides (it opens the file; rare formats)."""
    tf = open_token_file(prefix, config.read_mode, None)
    begin, end = split_range(bookend, tf.num_sequences)
    pointers, lengths, size = tf.sequence_pointers, tf.sequence_lengths, tf.dtype.itemsize
    grid = WindowGrid.from_pointers(pointers, lengths, size, begin, end, config.sequence_length, int(config.add_extra_token))
    sampled = np.concatenate([lengths[begin:begin + _SAMPLED_LENGTHS], lengths[max(begin, end - _SAMPLED_LENGTHS):end]])
    facts = f"{tf.num_sequences}|{tf.dtype.str}|{tf.num_tokens}|{begin}|{end}|{xxhash.xxh3_64_hexdigest(sampled.tobytes())}"
    tf.close()
    return _extent(begin, end, grid.first_token, grid.num_tokens, tf.dtype, facts, config)


def _extent(begin, end, first_token, num_tokens, dtype, facts, config: MegatronDataConfig) -> Extent:
    grid = WindowGrid(
        first_token=first_token, num_tokens=num_tokens, sequence_length=config.sequence_length,
        extra=int(config.add_extra_token),
    )
    identity = hashlib.sha256(f"{facts}|S={grid.sequence_length}|x={grid.extra}".encode()).hexdigest()[:16]
    return Extent(begin=begin, end=end, grid=grid, dtype=np.dtype(dtype), identity=identity)


def _mock_extent(source: MockSource, bookend, config: MegatronDataConfig) -> Extent:
    lengths = source.sequence_lengths
    begin, end = split_range(bookend, len(lengths))
    first = int(np.sum(lengths[:begin], dtype=np.int64))
    tokens = int(np.sum(lengths[begin:end], dtype=np.int64))
    facts = f"mock|{source.vocab_size}|{source.eod_id}|{begin}|{end}"
    return _extent(begin, end, first, tokens, np.dtype(np.int64), facts, config)


class _Items:
    """``__getitems__``/``__getitem__`` over ``read_batch`` and ``finish_batch``."""

    def __getitems__(self, indices) -> dict[str, np.ndarray]:
        return self.finish_batch(self.read_batch(indices))

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}


class ComputedGPTDataset(_Items):
    """Items of one split of one token file (or of the mock source) in the computed order."""

    def __init__(
        self, source: Any, extent: Extent, item: ItemConfig, *, seed: int, length: int,
        block_size: int | None = None, startup_phases: dict[str, float] | None = None,
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
    def identity(self) -> str:
        return self.extent.identity

    @property
    def grid(self) -> WindowGrid:
        return self.extent.grid

    @property
    def samples_per_epoch(self) -> int:
        """Windows per epoch: every sample of the split once."""
        return self.grid.num_windows

    @property
    def order(self) -> WindowOrder:
        """The window order (a ConfigError for a split without a whole window)."""
        if self._order is None:
            self._order = WindowOrder(
                self.grid.num_windows, source_seed(self.seed, self.identity), block_size=self.block_size
            )
        return self._order

    def __len__(self) -> int:
        return self._length

    @property
    def fingerprint(self) -> str:
        """Identity of data, order and item layout: what a resume state must match."""
        text = f"computed|{self.identity}|{self.seed}|{self.block_size}|{self.item!r}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def windows_of(self, indices) -> np.ndarray:
        """int64 window number of each dataset index (the order, no read)."""
        idx = np.asarray(indices, dtype=np.int64).ravel()
        if not idx.size:
            return idx
        low, high = int(_MIN(idx)), int(_MAX(idx))
        if low < 0 or high >= len(self):
            raise IndexError(f"sample indices must lie in [0, {len(self)})")
        return self.order.global_windows(idx, (low, high))

    def read_windows(self, windows: np.ndarray) -> np.ndarray:
        """``(B, S + extra)`` tokens of windows, in the file's dtype: one span each."""
        width = self.grid.window
        if not hasattr(self.source, "read_spans"):  # the mock source reads pieces
            seqs, first, lengths, offsets = self.documents_of(windows)
            starts = np.zeros_like(lengths)
            starts[first] = offsets
            return self.source.read_pieces(seqs, starts, lengths).reshape(len(windows), width)
        starts = self.grid.starts(windows)
        return self.source.read_spans(starts, np.full(starts.size, width, dtype=np.int64)).reshape(starts.size, width)

    def read_batch(self, indices) -> dict[str, Any]:
        return {"windows": self.read_windows(self.windows_of(indices)), "padded": False}

    def finish_batch(self, batch: dict[str, Any], alloc: Allocator | None = None) -> dict[str, np.ndarray]:
        return build_items(batch["windows"], self.item, padded=batch["padded"], alloc=alloc)

    def _pointer_array(self) -> tuple[np.ndarray, np.ndarray, int]:
        lengths = self.source.sequence_lengths
        if hasattr(self.source, "sequence_pointers"):
            return self.source.sequence_pointers, lengths, self.source.dtype.itemsize
        if self._pointers is None:  # the mock source: sequences back to back, 1 "byte" per token
            self._pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)])
        return self._pointers, lengths, 1

    def documents_of(self, windows: np.ndarray):
        """The document pieces of windows (``index.windows.window_pieces``)."""
        pointers, lengths, itemsize = self._pointer_array()
        e = self.extent
        return window_pieces(self.grid, np.asarray(windows), pointers, lengths, itemsize, e.begin, e.end)

    def documents(self, indices):
        """Each sample's document pieces ``(sequences, first, lengths, first_offsets)``, as
        ``GPTDataset._pieces`` gives them: which sequences the sample spans, where."""
        return self.documents_of(self.windows_of(indices))


class ComputedBlendedDataset(_Items):
    """A blend of computed datasets: item k comes from the source the interleave names."""

    blended = True
    """A blend (the loader's metrics count ``dataset_id`` per member)."""

    def __init__(
        self, datasets: Sequence[ComputedGPTDataset], weights: Sequence[float], *, seed: int, length: int,
        block_size: int | None = None, period: int = DEFAULT_PERIOD,
        startup_phases: dict[str, float] | None = None,
    ) -> None:
        self.datasets = list(datasets)
        if len({d.item for d in self.datasets}) > 1:
            raise ValueError("the members of a blend must share one item configuration")
        self.weights = [float(w) for w in weights]
        self.seed, self.block_size, self.period = int(seed), block_size, int(period)
        self._length = int(length)
        self.startup_phases = startup_phases or {}
        ids = _distinct([d.identity for d in self.datasets])
        self.sources = ids
        self.mixture = Mixture(
            ids, self.weights, [d.grid.num_windows for d in self.datasets], seed=self.seed,
            period=self.period, block_size=block_size,
        )

    def __len__(self) -> int:
        return self._length

    @property
    def item(self) -> ItemConfig:
        return self.datasets[0].item

    @property
    def order_fingerprint(self) -> str:
        """What every phase of a run must share: seed, block size and item layout."""
        text = f"computed-blend|{self.seed}|{self.block_size}|{self.item!r}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def fingerprint(self) -> str:
        """The sources' identities and the order, not the weights (a state resumes into a blend
        of other weights; the loader accepts other sources through ``resume_mixture``)."""
        text = f"{self.order_fingerprint}|{'|'.join(sorted(self.sources))}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def read_batch(self, indices) -> dict[str, Any]:
        idx = np.asarray(indices, dtype=np.int64).ravel()
        if idx.size and int(idx.max()) >= len(self):
            raise IndexError(f"sample indices must lie in [0, {len(self)})")
        draws = self.mixture.draw(idx)
        width = self.item.window
        present = np.unique(draws.source).tolist()
        dtype = self.datasets[present[0]].extent.dtype if present else np.dtype(np.int64)
        windows = np.empty((idx.size, width), dtype=dtype)
        for d in present:
            rows = draws.source == d
            windows[rows] = self.datasets[d].read_windows(draws.window[rows])
        return {"windows": windows, "padded": False, "dataset_id": draws.source}

    def finish_batch(self, batch: dict[str, Any], alloc: Allocator | None = None) -> dict[str, np.ndarray]:
        out = build_items(batch["windows"], self.item, padded=False, alloc=alloc)
        out["dataset_id"] = batch["dataset_id"]
        return out

    # -- mixture changes -----------------------------------------------------------------------
    def mixture_state(self, consumed: int) -> dict[str, Any]:
        """The cursors of every source after ``consumed`` global samples, and the current phase
        (where it started, its sources and weights), JSON-able: the loader keeps it in its state."""
        phase = {
            "identities": list(self.sources), "weights": self.weights, "period": self.period,
            **self.mixture.state(self.mixture.start).to_dict(),
        }
        return {"order": self.order_fingerprint, **self.mixture.state(consumed).to_dict(), "phase": phase}

    def resume_mixture(self, state: dict[str, Any]) -> str:
        """Continue the run that saved ``state`` (``mixture_state``). With the saved phase's
        sources and weights, the same phase continues (the order is the uninterrupted run's):
        returns ``"same"``. Otherwise a new phase starts at ``state["consumed"]`` where every
        source serves its next cursor under this blend's weights: ``"weights"`` (same sources)
        or ``"sources"`` (added, removed or reordered ones). ``StateError`` for a state of another seed,
        block size or item layout, or a source whose windows per epoch changed."""
        if not isinstance(state, dict) or state.get("order") != self.order_fingerprint:
            found = state.get("order") if isinstance(state, dict) else type(state).__name__
            raise StateError(
                f"the mixture state was saved for order {found!r}; this blend's is {self.order_fingerprint}",
                hint="resume with the seed, block size, sequence length and item options of the saved run",
            )
        saved = MixtureState.from_dict(state)
        phase = state.get("phase")
        if saved.consumed > len(self):
            raise StateError(
                f"the mixture state was saved after {saved.consumed} samples; this blend holds {len(self)}",
                hint="build the blend with at least as many samples as the run has consumed",
            )
        windows = [d.grid.num_windows for d in self.datasets]
        same_sources = isinstance(phase, dict) and phase.get("identities") == self.sources
        if same_sources and phase.get("weights") == self.weights and phase.get("period") == self.period:
            start = MixtureState.from_dict(phase)
            self.mixture = Mixture(
                self.sources, self.weights, windows, seed=self.seed, start=start.consumed, state=start,
                period=self.period, block_size=self.block_size,
            )
            return "same"
        self.mixture = resume(
            saved, self.sources, self.weights, windows, seed=self.seed, period=self.period,
            block_size=self.block_size,
        )
        return "weights" if same_sources else "sources"


def _distinct(identities: list[str]) -> list[str]:
    """Source identities with a repeat count appended to the second and later copies of one file
    (a blend may list a prefix twice): each copy keeps its own order and cursor."""
    seen: dict[str, int] = {}
    out = []
    for s in identities:
        seen[s] = seen.get(s, 0) + 1
        out.append(s if seen[s] == 1 else f"{s}#{seen[s]}")
    return out


def _as_blend(value) -> Blend | None:
    return value if value is None or isinstance(value, Blend) else parse_blend(value)


def _whole_epochs(asked: int | None, per_epoch: int) -> int:
    """Every sample of the epochs a request needs (one epoch for None), as Megatron's length."""
    if per_epoch <= 0:
        return 0
    epochs = 1 if not asked else -(-asked // per_epoch)
    return epochs * per_epoch


def build_computed_datasets(
    config: MegatronDataConfig, sizes: Sequence[int | None], *, block_size: int | None = None,
    period: int = DEFAULT_PERIOD,
) -> tuple[Any | None, Any | None, Any | None]:
    """The (train, valid, test) datasets of ``config`` in the computed order (module docstring).

    ``sizes`` as in ``build_datasets``: samples wanted per split, ``None`` for one epoch. A
    single file's split holds every sample of the epochs the request needs; a weighted blend
    holds the requested size (Megatron's sum of per-prefix targets), an unweighted blend weighs
    its sources by their windows and holds the request (one epoch of every source for None).
    ``block_size``: B windows per block (block mode), None for the flat order. ``period``: the
    blend schedule's period (weights resolve to 1/period). No file is written or kept open; the
    call needs no other rank.
    """
    if block_size is not None and (isinstance(block_size, bool) or int(block_size) < 1):
        raise ConfigError(f"block_size is {block_size!r}; expected a positive int or None (flat order)")
    started = time.perf_counter()
    c = config
    split = MOCK_SPLIT if c.mock else (None if c.blend_per_split is not None else c.split)
    per_split = None if c.blend_per_split is None else [_as_blend(b) for b in c.blend_per_split]
    plans = plan_splits(
        blend=None if c.mock else _as_blend(c.blend), blend_per_split=per_split, split=split, sizes=list(sizes),
        surplus=c.mid_level_dataset_surplus,
    )
    builder = _Builder(c, block_size)
    out = [None if plan is None else builder.split(plan, period) for plan in plans]
    phases = {"header_reads": time.perf_counter() - started}
    for ds in out:
        if ds is not None:
            ds.startup_phases = phases
    return out[0], out[1], out[2]


class _Builder:
    def __init__(self, config: MegatronDataConfig, block_size: int | None) -> None:
        self.config = config
        self.item = config.item_config()
        self.block_size = None if block_size is None else int(block_size)
        self.sequences = None if config.sequences_path is None else read_sequences(config.sequences_path)
        self._sources: dict[str | None, Any] = {}

    def source(self, prefix: str | None):
        """A lazy source per prefix (a ``TokenFile`` opens on its first read)."""
        if prefix not in self._sources:
            self._sources[prefix] = open_source(prefix, self.config, self.sequences)
        return self._sources[prefix]

    def member(self, mid) -> ComputedGPTDataset:
        source = self.source(mid.prefix)
        if mid.prefix is None:
            extent = _mock_extent(source, mid.bookend, self.config)
        else:
            extent = _file_extent(mid.prefix, mid.bookend, self.sequences, self.config)
        n = extent.grid.num_windows
        if n == 0 and mid.num_samples:
            raise ConfigError(
                f"the {mid.split} split of {mid.prefix or 'the mock data'} holds {extent.grid.num_tokens} tokens"
                f" (sequences {extent.begin}..{extent.end}), less than one sample of"
                f" {extent.grid.window} tokens, but {mid.num_samples} samples were requested",
                hint=f"change the split string, ask for no {mid.split} samples, or use a shorter sequence length",
            )
        return ComputedGPTDataset(
            source, extent, self.item, seed=self.config.random_seed,
            length=_whole_epochs(mid.num_samples, n), block_size=self.block_size,
        )

    def split(self, plan, period: int):
        members = [self.member(mid) for mid in plan.datasets]
        if not plan.blended:
            return members[0]
        dtypes = {m.extent.dtype for m in members}
        if len(dtypes) > 1:
            listing = ", ".join(f"{mid.prefix} ({m.extent.dtype})" for mid, m in zip(plan.datasets, members))
            raise ConfigError(
                f"the {plan.split} blend mixes token dtypes: {listing}",
                hint="blend only token files made with the same tokenizer (re-tokenize the odd ones out)",
            )
        windows = [m.grid.num_windows for m in members]
        empty = [mid.prefix for mid, n in zip(plan.datasets, windows) if n == 0]
        if empty:
            raise ConfigError(
                f"the {plan.split} split of {empty[0]} holds less than one sample of {members[0].grid.window} tokens",
                hint="drop the prefix from the blend, change the split string or use a shorter sequence length",
            )
        if plan.weights is not None:
            weights, length = list(plan.weights), int(plan.size)
        else:
            weights = windows
            length = sum(windows) if plan.size is None else int(plan.size)
        return ComputedBlendedDataset(
            members, weights, seed=self.config.random_seed, length=length, block_size=self.block_size, period=period,
        )

