"""The shape of ``loader.metrics()``: one ``TypedDict`` per room of the report, shared by what
builds it (``accounting.py``, ``ledger.py``, ``health.py``) and what reads it (the scalars of
``integrations``, the doctor's measurements, the demo). At run time the report is a plain dict
(what ``metrics()`` always returned, JSON-able), so users' code that reads it by key is unchanged.

Where a new figure belongs::

    MetricsReport                      this process's loader (per-process counters, resumed)
    ├── steps, samples, tokens, bytes_read, consumed_samples, epoch, active_s, version
    ├── startup: StartupReport         seconds to build, first batch, the dataset's phases
    ├── data_wait: WaitReport          the training loop's wait in next(), a histogram summary
    ├── sources: [SourceReport]        served by this process, per source (dataset_id order)
    ├── repeating: [name]              sources past one pass over their data
    ├── job: JobReport | None          the whole job, the same on every rank (ledger.py)
    │   ├── skips: [SkipReport]
    │   └── sources: [JobSourceReport] drawn, skipped, delivered; sources of earlier runs too
    ├── packing: PackingReport | None  packed rows: documents per row, padding (per source too)
    ├── storage: {counter: int}        object-storage counters since the loader was built
    └── workers: WorkersReport         replaced workers, stalls, faults (health.py)

A figure of this rank's batches goes in ``sources``; one that every rank must agree on goes in
``job``; one about the worker processes in ``workers``.
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = [
    "DocumentsPerRow",
    "FaultReport",
    "JobReport",
    "JobSourceReport",
    "LoaderReport",
    "MetricsReport",
    "PackingReport",
    "PackingSourceReport",
    "SkipReport",
    "SourceReport",
    "StartupReport",
    "WaitReport",
    "WorkersReport",
]


class StartupReport(TypedDict):
    loader_init_s: float | None
    first_batch_s: float | None
    """From building the loader to its first batch handed over."""
    first_batch_wait_s: float | None
    phases: dict[str, float]
    """The dataset's startup phases (``contract.LoaderDataset.startup_phases``)."""


class WaitReport(TypedDict):
    """``metrics.DurationHistogram.summary()`` of the waits in ``next()``, and their share."""

    count: int
    total_s: float
    mean_s: float | None
    min_s: float | None
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    share: float | None
    """Of the time the iterations were active (None before a step)."""


class SourceReport(TypedDict):
    """What this process served of one source."""

    dataset_id: int
    name: str
    samples: int
    tokens: int
    bytes_read: int
    drawn: int
    """The job's draws of it (exact, else this rank's share times ``consumed_samples``)."""
    samples_per_epoch: int
    epoch: int
    repeating: bool


class SkipReport(TypedDict):
    at: int
    samples: int


class JobSourceReport(TypedDict):
    """The whole job's figures of one source (``ledger.Ledger``)."""

    source: str
    """Its stable identity (a computed member's content identity, a Megatron member's prefix)."""
    name: str
    active: bool
    """False: a source of an earlier run that this dataset lacks."""
    drawn: int
    skipped: int
    samples: int
    tokens: int | None
    samples_per_epoch: int
    epoch: int


class JobReport(TypedDict):
    consumed_samples: int
    skipped_samples: int
    skips: list[SkipReport]
    sources: list[JobSourceReport]
    schedule: dict[str, Any] | None
    """The weights schedule's position (``contract.MixtureCursors.schedule_position``)."""


class DocumentsPerRow(TypedDict):
    p50: int | None
    p99: int | None


class PackingSourceReport(TypedDict):
    name: str
    rows: int
    documents: int
    tokens: int
    """Label slots holding a document's token: S a row, less its padding label slots."""
    padding_share: float | None


class PackingReport(TypedDict):
    rows: int
    documents: int
    padding_share: float | None
    documents_per_row: DocumentsPerRow
    sources: list[PackingSourceReport]


class FaultReport(TypedDict):
    """One worker process lost (``health.Fault``, less its clock reading)."""

    worker: int
    pid: int | None
    cause: str
    exitcode: int | None
    delivered: int | None
    started: bool
    recovered_s: float | None
    stack: str | None


class WorkersReport(TypedDict):
    restarts: int
    stalls: int
    time_lost_s: float
    max_worker_restarts: int
    worker_timeout: float | None
    faults: list[FaultReport]


class LoaderReport(TypedDict):
    """``accounting.LoaderMetrics.as_dict``: everything but the workers' health."""

    version: int
    steps: int
    samples: int
    tokens: int
    bytes_read: int
    consumed_samples: int
    epoch: int
    active_s: float
    startup: StartupReport
    data_wait: WaitReport
    sources: list[SourceReport]
    repeating: list[str]
    job: JobReport | None
    packing: PackingReport | None
    storage: dict[str, int]


class MetricsReport(LoaderReport):
    """``loader.metrics()``."""

    workers: WorkersReport
