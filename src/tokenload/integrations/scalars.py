"""The loader's ``metrics()`` as flat scalars for a training logger (TensorBoard, CSV, W&B).

``loader_scalars`` picks the figures a training dashboard plots, each a number under a stable name
(``{prefix}data_wait_share``, ``{prefix}samples_per_s``, ``{prefix}tokens/{source}``, ...); a figure
not measured yet (no step run) is left out rather than logged as 0. The rates are the loader's own:
served samples (tokens) over the time its iterations were active, since the start of the run
(continued across a resume, as ``metrics()`` is). Framework adapters call it, so every framework
logs the same numbers under the same names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..loader.report import MetricsReport

__all__ = ["loader_scalars"]


def loader_scalars(metrics: MetricsReport, prefix: str = "tokenload/") -> dict[str, float]:
    """Scalars of ``TokenloadDataLoader.metrics()``: data wait share and per-step wait (mean,
    p99), samples/s and tokens/s, consumed samples and epoch, tokens per source, worker restarts
    and stalls (when the loader has workers' health figures)."""
    out: dict[str, float] = {}
    wait = metrics.get("data_wait") or {}
    active = metrics.get("active_s") or 0.0
    figures = {
        "data_wait_share": wait.get("share"),
        "data_wait_mean_s": wait.get("mean_s"),
        "data_wait_p99_s": wait.get("p99_s"),
        "samples_per_s": metrics.get("samples", 0) / active if active > 0 else None,
        "tokens_per_s": metrics.get("tokens", 0) / active if active > 0 else None,
        "consumed_samples": metrics.get("consumed_samples"),
        "epoch": metrics.get("epoch"),
    }
    for source in metrics.get("sources") or []:
        figures[f"tokens/{source['name']}"] = source.get("tokens")
    workers = metrics.get("workers")
    if isinstance(workers, dict):
        figures["worker_restarts"] = workers.get("restarts")
        figures["worker_stalls"] = workers.get("stalls")
    for name, value in figures.items():
        if value is not None:
            out[prefix + name] = float(value)
    return out
