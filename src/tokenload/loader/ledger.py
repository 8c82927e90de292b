"""Exact per-source accounting of the whole job, and the skipped windows (issue 26).

Global sample k of the loader's order is a pure function of k, so what the *job* has drawn from
each source after ``consumed_samples`` is a function of the order and that number alone: the
cursors of a computed blend (``mixture_cursors().source_cursors``), a count of the blend index
for a Megatron-order blend (``blend_index``: incremental, O(new samples)), ``consumed`` for one
source. The figures are
therefore the same on every rank and whatever the data-parallel size, micro-batch size or
worker count, unlike the per-process counters of ``accounting.LoaderMetrics``.

``loader.skip(samples=N)`` (after a loss spike) moves the job N global samples on without
serving them: the stream afterwards is the unskipped stream from that point. Each skip is
recorded with the samples it took from each source (computed when it happens, since a later
resume may serve another mixture), so *delivered* = drawn - skipped per source, and the record
travels in the loader state (``state["skips"]``) across resumes.

Per source: ``drawn`` (cursor: samples taken from it, delivered or skipped, all epochs),
``skipped``, ``samples`` (delivered), ``tokens`` (delivered x sequence length) and ``epoch``
(``drawn // samples_per_epoch``: the pass over its data the next sample belongs to). Sources are
keyed by a stable identity (a computed member's content identity; a Megatron member's prefix),
so a source removed at a resume keeps its figures in the state and continues if it comes back.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from ..contract import LoaderDataset
from ..errors import StateError
from .report import JobReport, JobSourceReport

__all__ = ["Ledger"]

_CHUNK = 1 << 22


class Ledger:
    """The job's per-source draws and skips for one loader's dataset."""

    def __init__(self, dataset: LoaderDataset, *, in_order: bool = True) -> None:
        self.dataset = dataset
        sources = dataset.describe_sources().members
        self.keys = [s.key for s in sources]
        self.exact = in_order or len(self.keys) == 1
        """``counts`` is the job's exact draws: the loader serves global samples in order (the
        single sampler), or the dataset is one source. Megatron's cyclic sampler serves a
        shuffled epoch, whose draws per blend member are not a count of a prefix."""
        self.names = {s.key: s.name for s in sources}
        self.mixture = dataset.mixture_cursors()
        self.skips: list[dict[str, Any]] = []
        self.remembered: dict[str, JobSourceReport] = {}
        """Sources of an earlier run that this dataset lacks (removed at a resume)."""
        self._counted = 0  # Megatron blend: dataset_index counted up to here
        self._counts = np.zeros(len(self.keys), dtype=np.int64)
        self._epochs: dict[str, int] | None = None
        self.sequence_length = sources[0].sequence_length  # the members share one item layout

    # -- draws -----------------------------------------------------------------------------------
    def drawn(self, consumed: int) -> dict[str, int]:
        """Samples the job drew from each source (delivered or skipped) by global ``consumed``."""
        return {k: int(c) for k, c in zip(self.keys, self.counts(consumed))}

    def counts(self, consumed: int) -> np.ndarray:
        """``drawn`` as int64 per member, in the dataset's member order (``dataset_id``)."""
        if self.mixture is not None:
            return np.asarray(self.mixture.source_cursors(consumed), dtype=np.int64)
        index = self.dataset.blend_index()
        if index is not None:
            return self._blend_counts(index, consumed)
        return np.array([consumed], dtype=np.int64)

    def _blend_counts(self, index: np.ndarray, consumed: int) -> np.ndarray:
        if consumed < self._counted:  # a resume or restart went back: count again
            self._counted, self._counts[:] = 0, 0
        for at in range(self._counted, consumed, _CHUNK):  # bounded memory after a long resume
            part = np.asarray(index[at : min(at + _CHUNK, consumed)], dtype=np.int64)
            self._counts += np.bincount(part, minlength=self._counts.size)
        self._counted = consumed
        return np.array(self._counts)  # a copy (mypy reads ndarray.copy() here as Any)

    def epoch_sizes(self) -> dict[str, int]:
        if self._epochs is None:
            self._epochs = dict(zip(self.keys, self.dataset.epoch_sizes()))
        return self._epochs

    # -- skips -----------------------------------------------------------------------------------
    def skip(self, at: int, samples: int) -> None:
        """Record that global samples ``[at, at + samples)`` are skipped."""
        before, after = self.drawn(at), self.drawn(at + samples)
        taken = {k: after[k] - before[k] for k in self.keys if after[k] != before[k]}
        self.skips.append({"at": int(at), "samples": int(samples), "sources": taken})

    def skipped(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for entry in self.skips:
            for k, n in entry["sources"].items():
                out[k] = out.get(k, 0) + int(n)
        return out

    # -- export ----------------------------------------------------------------------------------
    def as_dict(self, consumed: int) -> JobReport:
        """The job's figures after ``consumed`` global samples (plain JSON values)."""
        drawn, skipped, sizes = self.drawn(consumed), self.skipped(), self.epoch_sizes()
        sources: list[JobSourceReport] = []
        for k in self.keys:
            sources.append(self._source(k, self.names[k], drawn[k], skipped.get(k, 0), sizes[k]))
        for k, old in self.remembered.items():
            if k not in drawn:
                sources.append({**old, "active": False})
        return {
            "consumed_samples": int(consumed),
            "skipped_samples": sum(int(e["samples"]) for e in self.skips),
            "skips": [{"at": e["at"], "samples": e["samples"]} for e in self.skips],
            "sources": sources,
            "schedule": None if self.mixture is None else self.mixture.schedule_position(consumed),
        }

    def _source(
        self, key: str, name: str, drawn: int, skipped: int, per_epoch: int
    ) -> JobSourceReport:
        samples = drawn - skipped
        tokens = None if self.sequence_length is None else samples * int(self.sequence_length)
        return {
            "source": key,
            "name": name,
            "active": True,
            "drawn": drawn,
            "skipped": skipped,
            "samples": samples,
            "tokens": tokens,
            "samples_per_epoch": per_epoch,
            "epoch": drawn // per_epoch if per_epoch else 0,
        }

    # -- resume ----------------------------------------------------------------------------------
    def state_dict(self) -> list[dict[str, Any]]:
        return [dict(e, sources=dict(e["sources"])) for e in self.skips]

    def load_state_dict(self, skips: Any, accounting: Any = None) -> None:
        """The skips of a saved state (``state["skips"]``) and, from its ``"accounting"``, the
        figures of sources this dataset lacks (kept, so that they are not forgotten)."""
        self.skips = parse_skips(skips)
        self.remembered = {}
        if isinstance(accounting, dict):
            for s in accounting.get("sources") or []:
                if isinstance(s, dict) and s.get("source") not in self.names:
                    self.remembered[str(s.get("source"))] = cast(JobSourceReport, s)


def parse_skips(skips: Any) -> list[dict[str, Any]]:
    """A saved state's ``skips`` (None: none), checked: ``StateError`` when malformed."""
    try:
        return [
            {
                "at": _int(e["at"]),
                "samples": _int(e["samples"]),
                "sources": {str(k): _int(v) for k, v in e["sources"].items()},
            }
            for e in skips or []
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateError(
            f"loader state 'skips' is malformed ({type(exc).__name__}: {exc})",
            hint="pass the dict saved from loader.state_dict(), unchanged",
        ) from None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return int(value)
