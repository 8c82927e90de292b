"""``tokenload doctor``: the checklist of the scale guides (Megatron's "Data Loading at Scale",
docs/SCALE.md), each item measured on the user's own data, filesystem and configuration.

``diagnose(DoctorConfig(...))`` returns a ``Report``: one ``Finding`` per check, each with what
was measured and, when it is a problem, the fix:

* ``startup``: is an index build on the critical path? ``build_datasets`` is timed with the cache
  as found (a prepared cache loaded as the build policy loads it; a missing one built in memory,
  which is what the job's ranks would build or wait for). Fix: ``prepare-cache`` +
  ``build_policy="none"``, or ``order="computed"`` (its startup is timed too).
* ``io-burst``: the opens (an audit hook on ``open``) and stats (``os.stat``) of that startup, which
  every rank makes at the same moment. Fix: deferred index loading (``build_policy="none"``: one
  manifest) and a sequences JSON (no ``.idx`` header per file).
* ``steady-state``: the loader's samples/s on the data against mock data of the same shape (is the
  loader the bottleneck?), ``mmap`` against ``pread`` reads of training windows on this
  filesystem, and the smallest worker count whose data wait stays under 5% of a training step of
  ``step_ms``.
* ``prefixes``: many small prefixes cost opens and index builds. Fix: ``tokenload merge``, aiming
  for at least 10 GB per file.
* ``copies``: every prefix named twice (the same file name in two folders, e.g. two nodes' copies)
  or found under a ``compare`` folder is compared by content digest; copies that differ mean
  ranks that read different data.

The package: ``report.py`` (the config, the findings, their text and PNG), ``measure.py`` (the
measuring tools, usable alone, and the ``READ_DELAY_ENV`` slow-storage rehearsal), ``checks.py``
(each check and its threshold; the packing check in ``packing.py``); this module runs the checks
in order and re-exports the public names.
"""

from __future__ import annotations

from .checks import (
    check_copies,
    check_prefixes,
    check_startup,
    check_steady_state,
)
from .measure import (
    READ_DELAY_ENV,
    SlowReads,
    content_digest,
    count_io,
    loader_rate,
    window_read_rate,
)
from .packing import check_packing
from .report import DoctorConfig, Finding, Report, format_report, plot, summary

__all__ = [
    "READ_DELAY_ENV",
    "DoctorConfig",
    "Finding",
    "Report",
    "SlowReads",
    "content_digest",
    "count_io",
    "diagnose",
    "format_report",
    "loader_rate",
    "plot",
    "summary",
    "window_read_rate",
]


def diagnose(config: DoctorConfig) -> Report:
    """Run every check on ``config``'s data (see the module docstring)."""
    from ..index import parse_blend

    blend = parse_blend(config.data_path)
    assert blend is not None  # data_path is a list
    prefixes = list(dict.fromkeys(blend.prefixes))
    report = Report(step_ms=config.step_ms)
    train = check_startup(config, report)
    check_steady_state(config, train, prefixes, report)
    check_prefixes(prefixes, report)
    check_packing(config, prefixes, report)
    check_copies(prefixes, config.compare, report)
    return report
