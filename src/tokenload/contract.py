"""What the loader needs from a dataset: the one contract between ``datasets`` and ``loader``.

``LoaderDataset`` is everything ``loader`` calls on a dataset: its length, a micro-batch read in
two stages (``read_batch``: index lookups and token reads, in the file's compact dtype;
``finish_batch``: the item fields, into arrays from an allocator, so a worker builds them straight
in shared memory) or in one (``__getitems__``), the fingerprint a resume state must match, the
seconds its build took per phase, a description of its sources for the loader's accounting, and,
for blends, how the job's draws per source are found. Every dataset kind of ``tokenload.datasets``
implements it; a plain map-style dataset (``__len__`` with ``__getitems__`` or ``__getitem__``)
is wrapped once, where ``build_dataloader`` takes it (``loader.mapstyle``), so nothing inside the
loader asks a dataset what it can do.

The contract is structural (``typing.Protocol``): datasets do not inherit from it, a type checker
checks them where they are passed as one. ``BatchSource`` holds its methods only, so that
``isinstance`` can tell a contract dataset from a map-style one at run time without evaluating a
property (``fingerprint`` reads a file's content; Python 3.11's check calls every member).

Standard library and NumPy only: it sits below ``datasets`` and ``loader``, which both import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Allocator",
    "Batch",
    "BatchSource",
    "DocumentSamples",
    "LoaderDataset",
    "MixtureCursors",
    "PieceSource",
    "RowPieces",
    "SourceInfo",
    "Sources",
]

Batch = dict[str, Any]
"""One micro-batch: field name to array (a row per sample) or to a value the rows share."""

Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray]
"""Returns an uninitialized array of the given shape and dtype (``np.empty`` by default; a loader
worker passes one that places the fields straight into shared memory)."""


PIECE_FIRST, PIECE_LENGTH = "piece_first", "piece_length"
"""Keys of a packed ``read_batch`` result: int64 each row's first piece (a row per sample), and
every piece's tokens, flat, row after row (not a row per sample). Cutting such a result by rows
cuts the pieces with them (``loader.worker_main``)."""

PIECE_SLOT, PIECE_INPUTS, ROW_COUNTS = "piece_slot", "piece_inputs", "row_counts"
"""Optional keys of a packed ``read_batch`` result, made with the plan: each piece's first slot in
its row and the input positions it covers (its tokens; a row's last piece, the rest of the row's
S inputs), flat like ``PIECE_LENGTH``; and each row's packing counts, int64 ``(rows, 2)``: its
documents among its inputs and its padding label slots (a row per sample). Position ids and the
packing counts are then laid from them instead of worked out."""

ROW_POSITIONS = "row_positions"
"""Optional key of a packed ``read_batch`` result: each row's position ids, ``(rows, S)`` or over
its whole window of W = S + extra slots, in a narrow integer type (``items.laid_positions``,
``items.window_positions``), made for every row of the read at once; finishing a micro-batch
then converts its rows' first S columns (a row per sample)."""

PIECE_KEYS = (PIECE_LENGTH, PIECE_SLOT, PIECE_INPUTS)
"""The keys of a packed read that hold a value per piece (cut with their rows' pieces)."""


def row_counts(documents: np.ndarray, row_tokens: np.ndarray, seq: int) -> np.ndarray:
    """``ROW_COUNTS`` of packed rows of S = ``seq`` inputs: int64 ``(rows, 2)``, each row's
    documents among its inputs, and its padding label slots. Label slot i holds the window's
    token i + 1, so the slots from ``row_tokens - 1`` on are padding (with or without the extra
    token: without it, the last label is padding in every row): S + 1 - ``row_tokens``, at most
    S since a row holds 1 to S + extra tokens."""
    out = np.empty((row_tokens.size, 2), dtype=np.int64)
    out[:, 0] = documents
    np.subtract(seq + 1, row_tokens, out=out[:, 1])
    return out


@dataclass(frozen=True)
class SourceInfo:
    """One source of a dataset as the loader's accounting names it (cheap: no file is opened)."""

    name: str
    """Readable name: the token file's prefix, the flat file's path, else a type's name."""
    key: str
    """Stable identity the job's ledger keys the source by, unique within the dataset (a computed
    source's content identity; a prefix, with ``#2`` appended to its second copy)."""
    sequence_length: int | None = None
    """Tokens per sample that the job's ledger counts (None: the dataset does not say)."""


@dataclass(frozen=True)
class Sources:
    """The sources of a dataset: a blend's members (what a batch's ``dataset_id`` numbers), else
    the dataset itself as one source."""

    members: tuple[SourceInfo, ...]
    blended: bool = False
    """Batches carry ``dataset_id``: the member of each row."""
    packed: bool = False
    """Rows of whole documents then padding (``packing="best-fit"``): position ids restart at
    each document, padded labels are 0 with no loss (the loader counts documents and padding)."""


class MixtureCursors(Protocol):
    """A blend that knows every source's cursor as a function of the global sample count: the job's
    draws per source, its weights schedule, and a state that resumes into other weights."""

    def source_cursors(self, consumed: int) -> np.ndarray:
        """int64 samples drawn from each member by the first ``consumed`` global samples."""
        ...

    def schedule_position(self, consumed: int) -> dict[str, Any]:
        """The weights schedule's entry in force after ``consumed`` samples, and the next change."""
        ...

    def mixture_state(self, consumed: int) -> dict[str, Any]:
        """Every source's cursor after ``consumed`` global samples (JSON-able; the loader's state
        keeps it as ``"mixture"``)."""
        ...

    def resume_mixture(self, state: dict[str, Any]) -> str:
        """Continue the run that saved ``state``: ``"same"`` (the same chain), ``"weights"`` (other
        weights) or ``"sources"`` (sources added or removed)."""
        ...

    def cyclic_key(self) -> str:
        """What the cyclic sampler's fingerprint adds for this blend (the cyclic order draws
        samples out of order, so its weights cannot change mid-run)."""
        ...

    def change_weights(self, start: int, weights: Sequence[float] | None) -> bool:
        """Serve ``weights`` (one per member) from global sample ``start`` on: a weights-schedule
        entry appended at ``start``, replacing the schedule's entries from there (None: the
        entries the blend was built with, from ``start`` on). The stream equals the one of a
        schedule that declares the same entries up front. Returns whether a copy of the blend in
        another process (a loader worker) reaches the same state by the same call (False: it
        must be given the changed blend). ``ConfigError``, before anything changes, when the
        blend cannot change its weights (what to build instead)."""
        ...


class RowPieces(NamedTuple):
    """What rows of a dataset hold (``tokenload.provenance``), in CSR form: row i's pieces are
    ``offsets[i]:offsets[i + 1]`` of the other arrays (int64), in the order of its ``tokens``
    field; each piece is tokens ``[start, stop)`` of document ``document`` (its index in the
    token file of member ``source`` of the blend, 0 for a dataset of one source). Only the S
    input tokens count (the extra label token is not a piece); padding at a row's end is none."""

    offsets: np.ndarray
    source: np.ndarray
    document: np.ndarray
    start: np.ndarray
    stop: np.ndarray


@runtime_checkable
class PieceSource(Protocol):
    """A dataset that says what its samples hold (``tokenload.provenance.explain``)."""

    def sample_pieces(self, indices: Sequence[int] | np.ndarray) -> RowPieces:
        """The pieces of the ``tokens`` of each sample of ``indices`` (dataset indices)."""
        ...


@runtime_checkable
class DocumentSamples(Protocol):
    """A dataset that says where a document went (``tokenload.provenance.where``)."""

    def samples_of(self, source: int, document: int) -> np.ndarray:
        """Sorted int64 dataset indices whose ``tokens`` hold a token of ``document`` of member
        ``source`` (directly: no pass over every sample's pieces)."""
        ...


@runtime_checkable
class BatchSource(Protocol):
    """The methods of ``LoaderDataset`` (checkable with ``isinstance``)."""

    def __len__(self) -> int: ...

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> Any:
        """One micro-batch in one call (``finish_batch(read_batch(indices))``)."""
        ...

    def read_batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """The raw part of a micro-batch (index lookups and reads). Arrays with a row per sample
        may be cut by rows (``PIECE_FIRST``/``PIECE_LENGTH`` with them): a worker reads several
        micro-batches in one call when ``reads_in_groups``."""
        ...

    def finish_batch(self, batch: Batch, alloc: Allocator | None = None) -> Batch:
        """The item fields of a ``read_batch`` result, in arrays made by ``alloc``."""
        ...

    def describe_sources(self) -> Sources:
        """The sources, for the loader's accounting (no file opened, no index read)."""
        ...

    def epoch_sizes(self) -> list[int]:
        """Samples in one pass over each source's data (Megatron's samples per epoch); may read
        index arrays, so the loader asks once, at its first batch."""
        ...

    def sample_bytes(self) -> list[int | None]:
        """Token-file bytes one sample of each source reads (None: the loader measures the batch);
        may open the token files."""
        ...

    def blend_index(self) -> np.ndarray | None:
        """The member of each global sample, for a blend that stores it (Megatron's
        ``dataset_index``: the job's draws are counts of its prefix); else None."""
        ...

    def mixture_cursors(self) -> MixtureCursors | None:
        """The blend's cursors when its mixture is computed or may change (then the loader's state
        records them and resumes into other weights); else None."""
        ...


class LoaderDataset(BatchSource, Protocol):
    """Everything the loader needs from a dataset (module docstring)."""

    @property
    def fingerprint(self) -> str:
        """Identity of data, order and item layout: what a resume state must match."""
        ...

    @property
    def startup_phases(self) -> Mapping[str, float]:
        """Seconds per phase of the build that made the dataset (empty when not measured)."""
        ...

    @property
    def reads_in_groups(self) -> bool:
        """Whether a worker may read several micro-batches with one ``read_batch`` (every array of
        its result with a row per sample) and finish each into its own slot."""
        ...
