"""The doctor's data and its renderings: what it is asked (``DoctorConfig``), what it answers
(``Finding``, ``Report``), and the report as text (``format_report``) and as a PNG (``plot``).

Kept apart from the checks (``checks.py``) and the measuring tools (``measure.py``) so that both
share these types without importing each other.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class DoctorConfig:
    """The job's data flags (as Megatron's) and how long to measure."""

    data_path: list[str]
    seq_length: int
    data_cache_path: str | None = None
    split: str = "969, 30, 1"
    train_samples: int | None = None
    """Samples of the train split (None: one epoch, as ``build_datasets``; for a weighted blend,
    one pass over its train tokens). A weighted blend's valid and test are built with size 0:
    the doctor measures the train split. With the job's length flags below: its
    ``--train-samples``."""
    train_iters: int | None = None
    """The job's ``--train-iters``. With it, ``global_batch_size``, ``eval_iters`` or
    ``eval_interval``, the three splits are sized by Megatron's arithmetic, as ``tokenload
    prepare-cache`` sizes them from the same flags (``megatron_args.batches``): the doctor then
    looks for the job's own caches (their names hold the sample counts) and prints the
    prepare-cache command with these flags."""
    global_batch_size: int | None = None
    """The job's ``--global-batch-size`` (needed with the other length flags, as is
    ``eval_interval``)."""
    eval_iters: int | None = None
    """The job's ``--eval-iters`` (None: Megatron's default, 100)."""
    eval_interval: int | None = None
    """The job's ``--eval-interval``."""
    seed: int = 1234
    tokenizer: Mapping[str, Any] | None = None
    """The job's tokenizer identity (Megatron's ``unique_identifiers``, as
    ``MegatronDataConfig(tokenizer=...)``): part of every index cache's name, so the doctor looks
    for the caches named for it and prints the prepare-cache command that writes them."""
    build_policy: str = "auto"
    order: str = "megatron"
    packing: str = "concat"
    read_mode: str = "mmap"
    sequences_path: str | None = None
    micro_batch_size: int = 4
    step_ms: float = 20.0
    steps: int = 16
    compare: list[str] = field(default_factory=list)


@dataclass
class Finding:
    check: str
    problem: bool
    measured: str
    fix: str | None = None
    brief: str = ""
    """A problem in a few words, for the summary line (``summary``): what, not the fix."""


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    timeline: list[tuple[str, float]] = field(default_factory=list)
    """Startup phases in order (name, seconds) as one rank runs them."""
    waits: dict[int, list[float]] = field(default_factory=dict)
    """Per-step data wait (seconds) per loader worker count."""
    step_ms: float = 0.0

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.problem]


def format_report(report: Report) -> str:
    lines = []
    for f in report.findings:
        lines.append(f"[{f.check}] {'PROBLEM' if f.problem else 'ok'}: {f.measured}")
        if f.problem and f.fix:
            lines.append(f"    fix: {f.fix}")
    n = len(report.problems)
    lines.append(f"{n} problem(s) found ({summary(report)})" if n else "no problem found")
    return "\n".join(lines)


def summary(report: Report) -> str:
    """The problems in one line, each its check and a few words on what it is
    (``io-burst: 8 opens/stats per rank at startup; packing: ...``); empty without one."""
    return "; ".join(f"{f.check}: {f.brief}" if f.brief else f.check for f in report.problems)


def plot(
    report: Report, path: str, *, width_in: float = 10.0, height_in: float = 6.0, dpi: int = 100
) -> None:
    """A PNG of the startup timeline and of the per-step data wait per worker count."""
    from ..errors import require

    matplotlib = require("matplotlib", "plot", "the doctor's plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(width_in, height_in), dpi=dpi)
    left = 0.0
    for i, (name, seconds) in enumerate(report.timeline or [("startup", 0.0)]):
        top.barh(
            0, seconds * 1e3, left=left * 1e3, color=f"C{i}", label=f"{name} {seconds * 1e3:.1f} ms"
        )
        left += seconds
    top.set_yticks([])
    top.set_xlabel("ms from the start of build_datasets (one rank)")
    top.set_title("startup timeline")
    top.legend(loc="upper right", fontsize=8)
    for workers, waits in sorted(report.waits.items()):
        bottom.plot(
            range(1, len(waits) + 1),
            [w * 1e3 for w in waits],
            marker="o",
            label=f"{workers} workers",
        )
    bottom.axhline(
        report.step_ms, color="grey", linestyle="--", label=f"training step {report.step_ms:g} ms"
    )
    bottom.set_yscale("symlog", linthresh=0.1)
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("step")
    bottom.set_ylabel("data wait (ms)")
    bottom.set_title("per-step data wait")
    bottom.legend(loc="best", fontsize=8)
    fig.tight_layout()
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}.png")  # hidden, then renamed
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        from ..storage.os_errors import write_error

        raise write_error(exc, path, "the plot") from None
    finally:
        plt.close(fig)
