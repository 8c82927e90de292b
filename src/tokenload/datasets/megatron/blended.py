"""Megatron's blended dataset: item k is item ``dataset_sample_index[k]`` of member
``dataset_index[k]``, with ``dataset_id`` added. A batch is read with one vectorized call per
member that appears in it, then scattered back into batch order; the members share one item
configuration, so the fields are built once for the whole batch. Index values out of range (a
damaged cache) raise a ``CacheError`` naming the file; the check rides on the ``unique`` the
grouping needs anyway, plus one reduction."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ...arrays import distinct, sample_indices
from ...contract import (
    PIECE_FIRST,
    PIECE_LENGTH,
    ROW_COUNTS,
    ROW_POSITIONS,
    Allocator,
    MixtureCursors,
    RowPieces,
)
from ...index.blends import distinct_sources
from ..contract_parts import BlendContract
from ..packed_rows import merge_pieces
from ..pieces import blend_pieces, not_answered
from .gpt_dataset import IndexArrays

_MIN, _MAX = np.minimum.reduce, np.maximum.reduce


class BlendedDataset(BlendContract):
    """A weighted mixture of datasets in Megatron's blending order."""

    def __init__(
        self,
        datasets: Sequence[Any],
        indices: IndexArrays,
        *,
        identity: str,
        length: int | None = None,
        startup_phases: dict[str, float] | None = None,
    ) -> None:
        self.datasets = list(datasets)
        items = {d.item for d in self.datasets}
        if len(items) > 1:
            raise ValueError("the members of a blend must share one item configuration")
        self.indices = indices
        self.identity = identity
        self._length = length
        self.startup_phases = startup_phases or {}
        """Seconds per phase of the ``build_datasets`` call that made it (loader metrics)."""

    def __len__(self) -> int:
        if self._length is None:
            self._length = int(self.indices["dataset_index"].shape[0])
        return self._length

    @property
    def dataset_index(self) -> np.ndarray:
        return self.indices["dataset_index"]

    @property
    def dataset_sample_index(self) -> np.ndarray:
        return self.indices["dataset_sample_index"]

    @property
    def fingerprint(self) -> str:
        members = "|".join(d.fingerprint for d in self.datasets)
        return hashlib.sha256(f"{self.identity}|{members}".encode()).hexdigest()[:16]

    def read_batch(self, indices: npt.ArrayLike) -> dict[str, Any]:
        """Windows of every member present in the batch, scattered back into batch order."""
        idx = sample_indices(indices)
        n = len(self)
        bounds = (int(_MIN(idx)), int(_MAX(idx))) if idx.size else None
        if bounds is not None and bounds[0] < 0:  # from the end, as megatron-core's NumPy indexing
            idx = np.where(idx < 0, idx + n, idx)
            bounds = (int(_MIN(idx)), int(_MAX(idx)))
        if bounds is not None and (bounds[0] < 0 or bounds[1] >= n):
            raise IndexError(f"sample indices must lie in [-{n}, {n})")
        which, within = self._locate(idx, bounds)
        present = distinct(which).tolist()
        if present and (present[0] < 0 or present[-1] >= len(self.datasets)):
            raise self.indices.corrupt(
                "dataset_index",
                f"dataset {present[0] if present[0] < 0 else present[-1]}",
                f"0..{len(self.datasets) - 1} (the blend's datasets)",
            )
        if within.size and _MIN(within) < 0:
            raise self.indices.corrupt(
                "dataset_sample_index", "a negative sample number", "0 or more"
            )
        rows = {d: which == d for d in present}
        parts = {d: self._member_batch(d, within[r]) for d, r in rows.items()}
        padded = any(p["padded"] for p in parts.values())
        dtypes = {p["windows"].dtype for p in parts.values()}
        # packed rows tell their padding by their token counts, other windows by the pad id
        counted = all("row_tokens" in p for p in parts.values())
        # int64 when padded with the pad id, when members differ, or for an empty micro-batch
        dtype = np.int64 if (padded and not counted) or len(dtypes) != 1 else dtypes.pop()
        width = self.datasets[0].item.window
        windows = np.empty((idx.size, width), dtype=dtype)
        for d, part in parts.items():
            windows[rows[d]] = part["windows"]
        batch = {"windows": windows, "padded": padded, "dataset_id": which}
        packed = bool(getattr(self.datasets[0], "packed", False))
        if counted and (parts or packed):  # packed rows: even an empty micro-batch's
            row_tokens = np.empty(idx.size, dtype=np.int64)
            for d, part in parts.items():
                row_tokens[rows[d]] = part["row_tokens"]
            batch["row_tokens"] = row_tokens
        item = self.datasets[0].item
        if packed:  # packed rows: their pieces, and their counts (every member's read makes them)
            pieces = [(rows[d], part[PIECE_FIRST], part[PIECE_LENGTH]) for d, part in parts.items()]
            batch[PIECE_FIRST], batch[PIECE_LENGTH] = merge_pieces(pieces, idx.size)
            # per row, when every member's read made them: int64 counts, and the rows' position
            # ids (each member's shape and type: items.window_positions'; none for no row)
            small = np.dtype(np.uint16 if width <= 1 << 16 else np.uint32)
            wanted = ((ROW_COUNTS, 2, np.dtype(np.int64)), (ROW_POSITIONS, width, small))
            for key, shape, dt in wanted:
                if all(key in part for part in parts.values()):
                    made = [part[key] for part in parts.values()]
                    if made:
                        shape, dt = made[0].shape[1], np.result_type(*made)
                    merged = np.empty((idx.size, shape), dtype=dt)
                    for d, part in parts.items():
                        merged[rows[d]] = part[key]
                    batch[key] = merged
        elif item.inter_document_masking:
            # each row's document boundaries
            doc_bounds = np.empty((idx.size, item.sequence_length + 1), np.int32)
            for d, part in parts.items():
                doc_bounds[rows[d]] = part["doc_bounds"]
            batch["doc_bounds"] = doc_bounds
        return batch

    def _locate(
        self, idx: np.ndarray, bounds: tuple[int, int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Member and member sample of each global sample (Megatron's two arrays); ``bounds``:
        the samples' ``(min, max)``, for a subclass that serves them from other arrays."""
        which = np.asarray(self.dataset_index[idx], dtype=np.int64)
        return which, np.asarray(self.dataset_sample_index[idx], dtype=np.int64)

    # -- provenance (contract.PieceSource) ------------------------------------------------------
    def sample_pieces(self, indices: npt.ArrayLike) -> RowPieces:
        """The document pieces of each sample's ``tokens``, numbered by member."""
        idx = sample_indices(indices)
        which, within = self._locate(idx)
        return blend_pieces(
            which,
            distinct(which).tolist(),
            lambda d, rows: self.datasets[d].sample_pieces(within[rows]),
        )

    def samples_of(self, source: int, document: int) -> np.ndarray:
        """The global samples whose ``tokens`` hold a token of ``document`` of member
        ``source``: the member's samples of it, then where Megatron's blending arrays draw them
        (one pass)."""
        member = self.datasets[source]
        if not hasattr(member, "samples_of"):
            raise not_answered(member)
        held: np.ndarray = member.samples_of(0, document)
        if not held.size:
            return held
        n = len(self)
        which = np.asarray(self.dataset_index[:n]) == source
        return np.flatnonzero(which & np.isin(self.dataset_sample_index[:n], held))

    def _member_batch(self, d: int, samples: np.ndarray) -> dict[str, Any]:
        try:
            batch: dict[str, Any] = self.datasets[d].read_batch(samples)
        except IndexError:  # a member refuses only sample numbers past its length
            raise self.indices.corrupt(
                "dataset_sample_index",
                f"sample numbers past dataset {d}'s length",
                f"numbers below {len(self.datasets[d])}",
            ) from None
        return batch

    def finish_batch(
        self, batch: dict[str, Any], alloc: Allocator | None = None
    ) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = self.datasets[0].finish_batch(batch, alloc)
        out["dataset_id"] = batch["dataset_id"]
        return out

    def __getitems__(self, indices: npt.ArrayLike) -> dict[str, np.ndarray]:
        return self.finish_batch(self.read_batch(indices))

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    # -- the loader's contract (contract.LoaderDataset) ------------------------------------------
    # reads_in_groups, describe_sources, epoch_sizes, sample_bytes: from BlendContract
    def member_keys(self, names: list[str]) -> list[str]:
        """Members keyed by prefix (``#2`` for a repeat)."""
        return distinct_sources(names)

    def blend_index(self) -> np.ndarray | None:
        """``dataset_index``: the job's draws per member are counts of its prefix."""
        return self.dataset_index

    def mixture_cursors(self) -> MixtureCursors | None:
        return None
