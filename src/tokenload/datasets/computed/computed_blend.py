"""A blend in the computed order whose weights may follow a schedule and change at a resume.

Item k comes from the source ``index.schedule.ScheduledMixture`` names (the entry of the weights
schedule in force at k decides the source; the source serves its next cursor). A blend without
a schedule is the one-entry schedule ``[(0, weights)]``.

**Resume.** ``mixture_state(consumed)`` records every source's cursor and the chain it was
serving (its sources, schedule, period and origin); ``resume_mixture(state)`` continues the same
chain when this blend has the same sources, schedule and period (bit-exactly the uninterrupted
run), and otherwise starts a new chain at the saved ``consumed`` from the saved cursors: other
weights or another schedule, sources added (cursor 0) or removed (their cursors kept in the
state, so a source that comes back continues).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ...arrays import distinct, from_end, sample_indices
from ...contract import Allocator, MixtureCursors, RowPieces
from ...errors import ForeignStateError, StateError
from ...index.blends import distinct_sources
from ...index.interleave import DEFAULT_PERIOD
from ...index.mixture import MixtureState
from ...index.schedule import Schedule, ScheduledMixture, check_schedule, check_schedule_fits
from ..contract_parts import BlendContract
from ..items import ItemConfig, finish_windows
from ..packed_rows import merge_packed
from ..pieces import blend_pieces

__all__ = ["ComputedBlendedDataset"]

_MIN, _MAX = np.minimum.reduce, np.maximum.reduce


class _Items:
    """``__getitems__``/``__getitem__`` over ``read_batch`` and ``finish_batch``."""

    def read_batch(self, indices: npt.ArrayLike) -> dict[str, Any]:
        raise NotImplementedError

    def finish_batch(
        self, batch: dict[str, Any], alloc: Allocator | None = None
    ) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def __getitems__(self, indices: npt.ArrayLike) -> dict[str, np.ndarray]:
        return self.finish_batch(self.read_batch(indices))

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}


class ComputedBlendedDataset(_Items, BlendContract):
    """A blend of computed datasets: item k comes from the source the interleave names."""

    def __init__(
        self,
        datasets: Sequence[Any],
        weights: Sequence[float],
        *,
        seed: int,
        length: int,
        block_size: int | None = None,
        period: int = DEFAULT_PERIOD,
        startup_phases: dict[str, float] | None = None,
        schedule: Sequence[tuple[int, Sequence[float]]] | None = None,
    ) -> None:
        self.datasets = list(datasets)
        if len({d.item for d in self.datasets}) > 1:
            raise ValueError("the members of a blend must share one item configuration")
        self.seed, self.block_size, self.period = int(seed), block_size, int(period)
        self._length = int(length)
        self.startup_phases = startup_phases or {}
        self.sources = distinct_sources([d.identity for d in self.datasets])
        given = [(0, list(weights))] if schedule is None else schedule
        self.schedule = check_schedule(given, len(self.datasets))
        if schedule is not None:  # an entry past the end serves nothing: refused at the build
            check_schedule_fits(self.schedule, self._length)
        self.weights = list(self.schedule[0][1])
        """The weights of the schedule's first entry (the blend's weights without a schedule)."""
        self.declared = self.schedule
        """The schedule the blend was built with (``schedule`` adds the loop's changes)."""
        self.mixture = self._chain(None)

    def _chain(self, origin: MixtureState | None) -> ScheduledMixture:
        return ScheduledMixture(
            self.sources,
            self.schedule,
            [_units(d) for d in self.datasets],
            seed=self.seed,
            origin=origin,
            period=self.period,
            block_size=self.block_size,
        )

    def __len__(self) -> int:
        return self._length

    @property
    def item(self) -> ItemConfig:
        item: ItemConfig = self.datasets[0].item  # the members share one (checked at __init__)
        return item

    @property
    def order_fingerprint(self) -> str:
        """What every phase of a run must share: seed, block size and item layout, and for
        packed rows the packing (a cursor counts rows there, windows otherwise)."""
        text = f"computed-blend|{self.seed}|{self.block_size}|{self.item!r}"
        if self.packed:
            rows = self.datasets[0].rows
            text += f"|packed|best-fit|{rows.block_documents}|{rows.max_documents}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def fingerprint(self) -> str:
        """The sources' identities and the order, not the weights (a state resumes into a blend
        of other weights; the loader accepts other sources through ``resume_mixture``)."""
        text = f"{self.order_fingerprint}|{'|'.join(sorted(self.sources))}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def read_batch(self, indices: npt.ArrayLike) -> dict[str, Any]:
        idx, bounds = from_end(sample_indices(indices), len(self))
        draws = self.mixture.draw(idx, bounds)
        if self.packed:
            return self._read_packed(draws)
        width = self.item.window
        present = distinct(draws.source).tolist()
        # the members' common dtype (a blend may mix uint16 and int32 files, as Megatron's may)
        dtypes = [self.datasets[d].extent.dtype for d in present]
        dtype = np.result_type(*dtypes) if dtypes else np.dtype(np.int64)
        windows = np.empty((idx.size, width), dtype=dtype)
        masking = self.item.inter_document_masking
        seq = self.item.sequence_length
        doc_bounds = np.empty((idx.size, seq + 1), np.int32) if masking else None
        for d in present:
            rows = draws.source == d
            windows[rows] = self.datasets[d].read_windows(draws.window[rows])
            if doc_bounds is not None:  # each row's document boundaries
                doc_bounds[rows] = self.datasets[d].bounds_of(draws.window[rows])
        batch = {"windows": windows, "padded": False, "dataset_id": draws.source}
        if doc_bounds is not None:
            batch["doc_bounds"] = doc_bounds
        return batch

    def share_plans(self, folder: str | None) -> None:
        """Packed members share their blocks with the other processes given ``folder``
        (``shared_plans``), each under its place in the blend: two files that look alike to
        the computed order's sampled identity never share a plan."""
        for i, member in enumerate(self.datasets):
            share = getattr(member, "share_plans", None)
            if share is not None:
                share(folder, tag=f"member {i}")

    @property
    def packed(self) -> bool:
        """Members of packed rows (``packing="best-fit"``): a source serves its row at the
        cursor the mixture draws."""
        return bool(getattr(self.datasets[0], "packed", False))

    def _read_packed(self, draws: Any) -> dict[str, Any]:
        reads = [
            (rows, self.datasets[d].read_rows(draws.cursor[rows]))
            for d in distinct(draws.source).tolist()
            for rows in [draws.source == d]
        ]
        batch = merge_packed(reads, draws.source.size, self.item).batch(self.item.sequence_length)
        batch["dataset_id"] = draws.source
        return batch

    def finish_batch(
        self, batch: dict[str, Any], alloc: Allocator | None = None
    ) -> dict[str, np.ndarray]:
        out = finish_windows(batch, self.item, alloc)
        out["dataset_id"] = batch["dataset_id"]
        return out

    # -- provenance (contract.PieceSource) ------------------------------------------------------
    def sample_pieces(self, indices: npt.ArrayLike) -> RowPieces:
        """The document pieces of each sample's ``tokens``, numbered by member (packed members:
        the rows at the drawn cursors)."""
        idx = sample_indices(indices)
        draws = self.mixture.draw(idx)
        if self.packed:
            return blend_pieces(
                draws.source,
                distinct(draws.source).tolist(),
                lambda d, rows: self.datasets[d].sample_pieces(draws.cursor[rows]),
            )
        return blend_pieces(
            draws.source,
            distinct(draws.source).tolist(),
            lambda d, rows: self.datasets[d].window_pieces(draws.window[rows]),
        )

    def samples_of(self, source: int, document: int) -> np.ndarray:
        """The global samples whose ``tokens`` hold a token of ``document`` of member
        ``source``: its windows (the grid), each epoch's positions of them (the window order's
        inverse), then the samples that serve those cursors (the interleave's inverse, per
        phase). Cursors served before this chain's origin (a resume that changed the mixture)
        are not this chain's: left out."""
        member = self.datasets[source]
        drawn = int(self.mixture.cursors(len(self))[source])
        if self.packed:  # the source's rows holding it
            cursors = member.rows.document_rows(document, drawn)
        else:
            cursors = member.cursors_of(member.document_windows(document), drawn)
        samples = self.mixture.samples_of(source, cursors)
        return np.sort(samples[(samples >= self.mixture.start) & (samples < len(self))])

    # -- accounting ------------------------------------------------------------------------------
    def source_cursors(self, consumed: int) -> np.ndarray:
        """int64 samples drawn from each member by the first ``consumed`` global samples (all
        epochs and phases, the run before this chain included): the same on every rank."""
        return self.mixture.cursors(consumed)

    def schedule_position(self, consumed: int) -> dict[str, Any]:
        """The schedule's entry in force after ``consumed`` samples, and the next change."""
        entry = self.mixture.phase_of(consumed)
        start, weights = self.schedule[entry]
        following = self.schedule[entry + 1][0] if entry + 1 < len(self.schedule) else None
        start = max(start, self.mixture.start)  # a chain begun at a resume: from there
        return {
            "entry": entry,
            "entries": len(self.schedule),
            "start": start,
            "weights": list(weights),
            "next_change": following,
        }

    # -- the loader's contract (contract.LoaderDataset) ------------------------------------------
    # reads_in_groups, describe_sources, epoch_sizes, sample_bytes: from BlendContract
    def member_keys(self, names: list[str]) -> Sequence[str]:
        """Members keyed by their content identities."""
        return self.sources

    def blend_index(self) -> np.ndarray | None:
        return None

    def mixture_cursors(self) -> MixtureCursors | None:
        """This blend: its cursors, schedule position and resumable mixture state."""
        return self

    def cyclic_key(self) -> str:
        """The first weights: the cyclic sampler's fingerprint covers them."""
        return repr(self.weights)

    # -- mixture changes -------------------------------------------------------------------------
    def change_weights(self, start: int, weights: Sequence[float] | None) -> bool:
        """Serve ``weights`` from global sample ``start`` on (``loader.set_weights``): an entry
        appended to the schedule at ``start``, replacing its entries from there; None: the
        declared schedule's entries from ``start`` on again. The phases before ``start`` are
        kept, so the chain is the one the new schedule declared up front gives. Returns True:
        another process's copy of this blend makes the same change with the same call."""
        if weights is None:
            kept = tuple(e for e in self.schedule if e[0] < start)
            self.schedule = check_schedule(kept + tuple(e for e in self.declared if e[0] >= start))
            self.mixture = self._chain(self.mixture.origin)
            return True
        self.mixture.append(start, weights)
        self.schedule = self.mixture.schedule
        self.weights = list(self.schedule[0][1])
        return True

    def mixture_state(self, consumed: int) -> dict[str, Any]:
        """The cursors of every source after ``consumed`` global samples, and the chain served
        (its sources, schedule, period and origin), JSON-able: the loader keeps it in its state."""
        current = self.schedule[self.mixture.phase_of(consumed)][1]
        phase = {
            "identities": list(self.sources),
            "weights": list(current),
            "period": self.period,
            "schedule": [[s, list(w)] for s, w in self.schedule],
            **self.mixture.origin.to_dict(),
        }
        cursors = self.mixture.state(consumed).to_dict()
        return {"order": self.order_fingerprint, **cursors, "phase": phase}

    def resume_mixture(self, state: dict[str, Any]) -> str:
        """Continue the run that saved ``state`` (``mixture_state``). With the saved chain's
        sources, schedule and period the same chain continues (the order of the uninterrupted
        run): returns ``"same"``. Otherwise a new chain starts at ``state["consumed"]`` where
        every source serves its next cursor under this blend's schedule: ``"weights"`` (same
        sources) or ``"sources"`` (added, removed or reordered ones). ``StateError`` for a state
        of another seed, block size or item layout, or a source whose windows per epoch changed."""
        if not isinstance(state, dict) or state.get("order") != self.order_fingerprint:
            found = state.get("order") if isinstance(state, dict) else type(state).__name__
            raise ForeignStateError(
                f"the mixture state was saved for order {found!r}; this blend's is"
                f" {self.order_fingerprint}",
                hint="resume with the seed, block size, sequence length and item options of the"
                " saved run",
            )
        saved = MixtureState.from_dict(state)
        phase: Any = state.get("phase")
        if saved.consumed > len(self):
            raise StateError(
                f"the mixture state was saved after {saved.consumed} samples; this blend holds"
                f" {len(self)}",
                hint="build the blend with at least as many samples as the run has consumed",
            )
        same_sources = isinstance(phase, dict) and phase.get("identities") == self.sources
        same_chain = _saved_schedule(phase) == self.schedule and phase.get("period") == self.period
        if same_sources and same_chain:
            self.mixture = self._chain(MixtureState.from_dict(phase))
            return "same"
        self.mixture = self._chain(saved)
        return "weights" if same_sources else "sources"


def _saved_schedule(phase: Any) -> Schedule | None:
    """The schedule a state's chain served (a state of a blend without one: its weights)."""
    try:
        return check_schedule(phase.get("schedule") or [(0, phase.get("weights"))])
    except Exception:  # a malformed record never matches: the run continues as a new chain
        return None


def _units(member: Any) -> int:
    """What a member's cursor counts per epoch, for the mixture: windows, or for packed rows
    (whose epochs differ a little in rows) the documents of its split."""
    if getattr(member, "packed", False):
        return int(member.rows.num_documents)
    return int(member.grid.num_windows)
