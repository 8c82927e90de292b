"""What a loader served: per-step data wait, startup, and samples, tokens and bytes per source.

Everything is counted in the training process as batches are handed over (the consumer's view),
so it is the same with 0 workers, worker processes, shared-memory slots or pipes, and nothing
crosses the process boundary. A source is a blend member (rows grouped by the batch's
``dataset_id``, one ``bincount``) or the whole dataset. Per batch this is a few NumPy calls on
small arrays and one histogram bin; memory is fixed whatever the run's length.

Tokens are the elements of the ``tokens`` field; bytes are what the samples read from their
token files: ``window x itemsize`` per sample as the dataset tells it (``sample_bytes``), or from
the batch's own shapes when it does not say. The sources, their names and their sizes come from
the dataset's side of ``contract.LoaderDataset``.

A source repeats once the job has drawn more samples of it than one pass over its data holds
(Megatron's samples per epoch: the tokens of its split, less the extra token, over the sequence
length; a blend member built for a large weight holds several such passes). The job's draws of
each source, its ``epoch`` and ``repeating`` in ``sources`` and the repeat warning all come from
the job's exact accounting (``ledger.Ledger.counts``: a function of ``consumed_samples`` and the
order, the same on every rank and across a resume that changes a computed blend's sources), so
they agree with ``metrics()["job"]``. The warning is checked when the job could have passed an
epoch: a source's draws grow by at most the samples consumed, so after each check nothing is
computed until ``consumed_samples`` has grown by the smallest distance of a source to its epoch.
Only Megatron's cyclic sampler over a blend, whose shuffled epochs are not a prefix of the order,
estimates a source's draws as its share of this rank's samples times ``consumed_samples``. A
source whose data the loader cannot see repeats past its length.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..contract import LoaderDataset
from ..errors import StateError
from ..metrics import DurationHistogram
from ..storage import stats as storage_stats
from .report import (
    LoaderReport,
    MetricsReport,
    PackingReport,
    SourceReport,
    StartupReport,
    WaitReport,
)

if TYPE_CHECKING:
    from .ledger import Ledger

logger = logging.getLogger(__name__)

METRICS_VERSION = 1


class LoaderMetrics:
    """Counters of one loader (see the module docstring); ``as_dict`` is ``loader.metrics()``."""

    def __init__(self, dataset: LoaderDataset) -> None:
        self.created = time.perf_counter()
        self.dataset = dataset
        sources = dataset.describe_sources()
        self.names = [s.name for s in sources.members]
        n = len(self.names)
        self.blend = sources.blended  # batches carry dataset_id
        self.packing = PackingCounts(n) if sources.packed else None
        self.samples = np.zeros(n, dtype=np.int64)
        self.tokens = np.zeros(n, dtype=np.int64)
        self.warned = np.zeros(n, dtype=bool)
        self.steps = 0
        self.active_s = 0.0
        self.wait = DurationHistogram()
        self.storage_base = storage_stats()  # this process's object-storage counters so far
        self.startup: dict[str, float | None] = {
            "loader_init_s": None,
            "first_batch_s": None,
            "first_batch_wait_s": None,
        }
        self._limits: np.ndarray | None = None  # samples per epoch, resolved at the first batch
        self._next_check = 0  # consumed_samples at which a source could first pass its epoch
        self._checked_at = 0  # consumed_samples of the last check
        self._bytes: list[int] | None = None
        self.ledger: Ledger | None = None
        """The job's exact per-source figures, set by the loader."""

    # -- per batch ---------------------------------------------------------------------------------
    def record(
        self,
        batch: Any,
        wait_s: float,
        interval_s: float,
        consumed: int,
        packing: Any = None,
    ) -> None:
        """One batch handed to the training loop after ``wait_s`` in ``__next__``, ``interval_s``
        after the one before; ``consumed`` is the job's ``consumed_samples`` after it.
        ``packing``: packed rows' documents and padding, as made with the batch
        (``collate.PACKING_COUNTS``: the loader's fetch makes them for every packed batch)."""
        rows, width = _rows_and_width(batch)
        if self._limits is None:
            self._resolve(batch, width)
            self.startup["first_batch_s"] = time.perf_counter() - self.created
            self.startup["first_batch_wait_s"] = wait_s
        self.steps += 1
        self.wait.add(wait_s)
        self.active_s += interval_s
        ids = None
        if not self.blend:
            self.samples[0] += rows
            self.tokens[0] += rows * width
        else:
            ids = _numpy(batch["dataset_id"])
            counts = np.bincount(ids, minlength=len(self.names))
            self.samples += counts
            self.tokens += counts * width
        if self.packing is not None and packing is not None:
            self.packing.record(width, ids, packing)
        # one comparison per batch until a source could have passed its epoch (the vector check
        # cost ~6 us of the ~12 a batch's accounting took)
        if consumed >= self._next_check or consumed < self._checked_at:  # or a resume went back
            self._check_repeats(consumed)

    def _resolve(self, batch: Any, width: int) -> None:
        """Per-source epoch sizes and bytes per sample (once: may read index arrays)."""
        self._limits = np.array(self.dataset.epoch_sizes(), dtype=np.int64)
        fallback = width * _itemsize(batch)
        told = self.dataset.sample_bytes()
        self._bytes = [b if b is not None else fallback for b in told]

    @property
    def exact(self) -> bool:
        """The job's draws come from its exact accounting (else: this rank's share, estimated)."""
        return self.ledger is not None and self.ledger.exact

    def _drawn(self, consumed: int) -> np.ndarray:
        """The job's draws of each source after ``consumed`` global samples."""
        if self.ledger is not None and self.ledger.exact:
            return self.ledger.counts(consumed)
        served = int(self.samples.sum())  # Megatron's cyclic sampler over a blend: an estimate
        if not self.blend or not served:
            return np.full(len(self.names), consumed if served else 0, dtype=np.int64)
        return (self.samples * consumed + served // 2) // served

    def _check_repeats(self, consumed: int) -> None:
        assert self._limits is not None
        drawn = self._drawn(consumed)
        over = (drawn > self._limits) & ~self.warned
        for s in np.flatnonzero(over).tolist():
            self.warned[s] = True
            logger.warning(
                "data source %s is repeating: the job has drawn %s%d samples of it, more than"
                " the %d its data holds in one pass; its samples now repeat (raise its data or"
                " lower its weight if that is not intended)",
                self.names[s],
                "" if self.exact else "about ",
                int(drawn[s]),
                int(self._limits[s]),
            )
        self._checked_at = consumed
        if self.warned.all():
            self._next_check = np.iinfo(np.int64).max
        elif not self.exact:  # an estimate moves with every batch
            self._next_check = consumed + 1
        else:  # no source can pass its epoch before its distance to it is consumed
            left = self._limits[~self.warned] - drawn[~self.warned]
            self._next_check = consumed + int(left.min()) + 1

    # -- export ------------------------------------------------------------------------------------
    def as_dict(self, *, consumed: int, epoch: int) -> LoaderReport:
        """The metrics as a plain dict of numbers, strings, lists and dicts (``report.py``)."""
        limits = self._limits
        if limits is None:  # nothing served in this process yet: resolve without a batch
            limits = np.array(self.dataset.epoch_sizes(), dtype=np.int64)
        per_sample = self._bytes or [b or 0 for b in self.dataset.sample_bytes()]
        drawn = self._drawn(consumed)
        # exact: what the job drew (a state that has not served here yet says it too)
        repeating = drawn > limits if self.exact else self.warned
        sources: list[SourceReport] = []
        for s, name in enumerate(self.names):
            sources.append(
                {
                    "dataset_id": s,
                    "name": name,
                    "samples": int(self.samples[s]),
                    "tokens": int(self.tokens[s]),
                    "bytes_read": int(self.samples[s]) * per_sample[s],
                    "drawn": int(drawn[s]),
                    "samples_per_epoch": int(limits[s]),
                    "epoch": int(drawn[s] // limits[s]) if limits[s] else 0,
                    "repeating": bool(repeating[s]),
                }
            )
        wait = cast(WaitReport, self.wait.summary())
        wait["share"] = self.wait.total / self.active_s if self.active_s > 0 else None
        startup = cast(StartupReport, {**self.startup, "phases": dict(self.dataset.startup_phases)})
        return {
            "version": METRICS_VERSION,
            "steps": self.steps,
            "samples": sum(s["samples"] for s in sources),
            "tokens": sum(s["tokens"] for s in sources),
            "bytes_read": sum(s["bytes_read"] for s in sources),
            "consumed_samples": consumed,
            "epoch": epoch,
            # from each iteration's start to its latest batch: samples / active_s is the rate
            "active_s": self.active_s,
            "startup": startup,
            "data_wait": wait,
            "sources": sources,
            "repeating": [s["name"] for s in sources if s["repeating"]],
            # the whole job's figures, the same on every rank (ledger.py): drawn, skipped,
            # delivered samples and tokens and epoch per source, skips, the schedule's position
            "job": None if self.ledger is None else self.ledger.as_dict(consumed),
            # packed rows (packing="best-fit"): documents per row and padding, per source too
            "packing": None if self.packing is None else self.packing.as_dict(self.names),
            # object-storage counters of this process since the loader was built (0 for local files)
            "storage": {k: v - self.storage_base.get(k, 0) for k, v in storage_stats().items()},
        }

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The counters (not the startup of this process, which the next one measures anew)."""
        return {
            "version": METRICS_VERSION,
            "steps": self.steps,
            "active_s": self.active_s,
            "data_wait": self.wait.state_dict(),
            "samples": self.samples.tolist(),
            "tokens": self.tokens.tolist(),
            "repeating": self.warned.tolist(),
            "packing": None if self.packing is None else self.packing.state_dict(),
        }

    def load_state_dict(self, state: Any) -> None:
        """Continue the counters of ``state``. A state of another metrics version is skipped with
        a warning (counters start at zero: statistics never block a resume); a malformed one
        raises StateError."""
        if not isinstance(state, dict) or state.get("version") != METRICS_VERSION:
            version = state.get("version") if isinstance(state, dict) else type(state).__name__
            logger.warning(
                "loader state holds metrics of version %r, expected %d: metrics start from zero",
                version,
                METRICS_VERSION,
            )
            return
        n = len(self.names)
        try:
            samples = _counts(state["samples"], n)
            tokens = _counts(state["tokens"], n)
            warned = [bool(x) for x in state["repeating"]]
            steps, active = state["steps"], float(state["active_s"])
            wait = DurationHistogram()
            wait.load_state_dict(state["data_wait"])
            # none in the state (saved before they were kept): from zero, as every counter
            packing = None if self.packing is None else PackingCounts(n)
            if packing is not None and state.get("packing") is not None:
                packing.load_state_dict(state["packing"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(
                f"loader state 'metrics' is malformed ({exc!r}) for a loader of {n} source(s)",
                hint="pass the dict saved from loader.state_dict(), unchanged, or drop its"
                " 'metrics' entry to restart the counters",
            ) from None
        if len(warned) != n or isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise StateError(
                f"loader state 'metrics' has steps={steps!r} and {len(warned)} repeat flags,"
                f" expected a count and {n}",
                hint="pass the dict saved from loader.state_dict(), unchanged, or drop its"
                " 'metrics' entry to restart the counters",
            )
        self.samples, self.tokens = samples, tokens
        if packing is not None:
            self.packing = packing
        self.warned = np.array(warned, dtype=bool)
        self._next_check = 0  # the next batch checks
        self.steps, self.active_s, self.wait = steps, active, wait


class PackingCounts:
    """What packed rows held, counted from the batches handed over: documents per row (pieces
    beginning among a row's inputs) and padding label slots. A batch's counts are kept as they
    come and added up every ``_FOLD`` batches (one vectorized pass, not a dozen small NumPy calls
    per batch in the training process). Memory: one count per documents-per-row value seen, and
    the counts of at most ``_FOLD`` batches."""

    _FOLD = 256

    def __init__(self, sources: int) -> None:
        self.rows_by_documents = np.zeros(0, dtype=np.int64)  # rows holding k documents
        self.documents = np.zeros(sources, dtype=np.int64)
        self.padding = np.zeros(sources, dtype=np.int64)
        self.slots = np.zeros(sources, dtype=np.int64)
        self.rows = np.zeros(sources, dtype=np.int64)
        # per batch not yet added up: the bytes of its int64 (documents, padding) per row, source
        # per row (None: one source), and the rows' width
        self._pending: list[tuple[bytes, np.ndarray | None, int]] = []

    def record(self, width: int, ids: np.ndarray | None, counts: Any) -> None:
        """Count a batch's rows of ``width`` inputs from ``counts`` (``collate.PACKING_COUNTS``:
        each row's documents and padding label slots, int64 ``(rows, 2)``; from a worker's ring,
        already their bytes)."""
        # copies: the batch's memory (a worker's ring slot) is reused once it is freed
        if not isinstance(counts, bytes):
            values = counts.numpy() if hasattr(counts, "numpy") else counts
            counts = np.asarray(values, dtype=np.int64).tobytes()
        pending = self._pending
        pending.append((counts, None if ids is None else np.array(ids), width))
        if len(pending) >= self._FOLD:
            self._fold()

    def _fold(self) -> None:
        """Add the pending batches' counts to the totals."""
        if not self._pending:
            return
        batches, self._pending = self._pending, []
        pending_ids = [i for _, i, _ in batches]
        widths = [w for _, _, w in batches]
        counts = np.frombuffer(b"".join(c for c, _, _ in batches), dtype=np.int64).reshape(-1, 2)
        per_row, padding = counts[:, 0], counts[:, 1]
        sizes = [len(c) // 16 for c, _, _ in batches]  # rows: 2 int64 each
        width = np.repeat(np.array(widths, dtype=np.int64), sizes)
        found = np.bincount(per_row)
        if found.size > self.rows_by_documents.size:
            grown = np.zeros(found.size, dtype=np.int64)
            grown[: self.rows_by_documents.size] = self.rows_by_documents
            self.rows_by_documents = grown
        self.rows_by_documents[: found.size] += found
        if all(i is None for i in pending_ids):  # one source (no dataset_id): source 0
            self.rows[0] += per_row.size
            self.documents[0] += int(per_row.sum())
            self.padding[0] += int(padding.sum())
            self.slots[0] += int(width.sum())
            return
        n = self.documents.size
        ids = np.concatenate(
            [np.zeros(k, dtype=np.int64) if i is None else i for i, k in zip(pending_ids, sizes)]
        ).astype(np.int64, copy=False)
        self.rows += np.bincount(ids, minlength=n)
        self.documents += np.bincount(ids, weights=per_row, minlength=n).astype(np.int64)
        self.padding += np.bincount(ids, weights=padding, minlength=n).astype(np.int64)
        self.slots += np.bincount(ids, weights=width, minlength=n).astype(np.int64)

    _KEYS = ("rows_by_documents", "documents", "padding", "slots", "rows")

    def state_dict(self) -> dict[str, list[int]]:
        """The totals, every batch counted so far included."""
        self._fold()
        return {key: getattr(self, key).tolist() for key in self._KEYS}

    def load_state_dict(self, state: Any) -> None:
        """Continue the totals of ``state`` (ValueError, TypeError or KeyError when it is not
        ``state_dict``'s for as many sources)."""
        for key in self._KEYS:
            values = np.array(state[key], dtype=np.int64)
            if key != "rows_by_documents" and values.shape != self.rows.shape:
                raise ValueError(f"packing {key} of {values.shape}, expected {self.rows.shape}")
            if values.ndim != 1 or (values < 0).any():
                raise ValueError(f"packing {key} {state[key]!r}: expected counts")
            setattr(self, key, values)

    def as_dict(self, names: list[str]) -> PackingReport:
        self._fold()
        rows = int(self.rows_by_documents.sum())
        cumulative = np.cumsum(self.rows_by_documents)

        def percentile(q: float) -> int | None:
            if not rows:
                return None
            return int(np.searchsorted(cumulative, q * rows))

        slots = int(self.slots.sum())
        return {
            "rows": rows,
            "documents": int(self.documents.sum()),
            "padding_share": int(self.padding.sum()) / slots if slots else None,
            "documents_per_row": {"p50": percentile(0.5), "p99": percentile(0.99)},
            "sources": [
                {
                    "name": name,
                    "rows": int(self.rows[s]),
                    "documents": int(self.documents[s]),
                    # input slots holding a document's token (the rest is padding)
                    "tokens": int(self.slots[s] - self.padding[s]),
                    "padding_share": int(self.padding[s]) / int(self.slots[s])
                    if self.slots[s]
                    else None,
                }
                for s, name in enumerate(names)
            ],
        }


def _numpy(values: Any) -> np.ndarray:
    return values.numpy() if hasattr(values, "numpy") else np.asarray(values)


def summary_line(m: LoaderReport | MetricsReport) -> str:
    """One log line of ``as_dict``'s output."""
    wait, startup = m["data_wait"], m["startup"]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.2f} ms"

    share = "-" if wait["share"] is None else f"{wait['share']:.1%}"
    first = "-" if startup["first_batch_s"] is None else f"{startup['first_batch_s']:.2f} s"
    total = max(m["samples"], 1)
    sources = ", ".join(
        f"{s['name']} {s['samples'] / total:.0%} epoch {s['epoch']}"
        + (" REPEATING" if s["repeating"] else "")
        for s in m["sources"]
    )
    return (
        f"loader: step {m['steps']}, {m['samples']} samples, {m['tokens']} tokens,"
        f" {m['bytes_read'] / 1e6:.3g} MB read; data wait mean {ms(wait['mean_s'])}, p99"
        f" {ms(wait['p99_s'])}, max {ms(wait['max_s'])} ({share} of the time); first batch {first};"
        f" sources: {sources}"
    )


def _rows_and_width(batch: Any) -> tuple[int, int]:
    """Samples in a batch and tokens per sample (from its ``tokens`` field, else its first
    field with a shape)."""
    values = batch.values() if isinstance(batch, dict) else [batch]
    field = batch.get("tokens") if isinstance(batch, dict) else None
    if field is None:
        field = next((v for v in values if getattr(v, "shape", None)), None)
    shape = getattr(field, "shape", None)
    if not shape:
        return (len(batch) if isinstance(batch, list) else 0), 0
    return int(shape[0]), int(shape[1]) if len(shape) > 1 else 1


def _itemsize(batch: Any) -> int:
    field: Any = batch.get("tokens") if isinstance(batch, dict) else batch
    try:
        return int(field.element_size())  # a tensor
    except AttributeError:
        return int(getattr(getattr(field, "dtype", None), "itemsize", 8))


def _counts(values: Any, n: int) -> np.ndarray:
    if len(values) != n or not all(type(v) is int and v >= 0 for v in values):
        raise ValueError(f"expected {n} counts, found {values!r}")
    return np.array(values, dtype=np.int64)
