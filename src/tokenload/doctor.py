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

``READ_DELAY_ENV`` (``TOKENLOAD_DOCTOR_READ_DELAY_MS``) is a rehearsal hook: every batch read of
the doctor's loaders on the data then sleeps that long first, as on slow storage, so that the
steady-state findings can be seen (and tested) on a fast disk.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from .errors import CacheError, ConfigError

READ_DELAY_ENV = "TOKENLOAD_DOCTOR_READ_DELAY_MS"
#: Opens + stats per rank above which a startup counts as a burst: a manifest load makes 1-2
#: (one more with a sequences JSON), a per-dataset cache check about 13 per dataset.
IO_BURST_LIMIT = 4
#: Data slower than this fraction of mock data of the same shape: the loader is the bottleneck.
SLOW_RATIO = 0.5
#: A read mode this many times slower than the other is worth switching.
READ_MODE_RATIO = 1.5
#: Prefixes from which their number, when they are small, is a finding.
MANY_PREFIXES = 64
#: Megatron's advice: at least this much per token file.
MERGE_TARGET_BYTES = 10 * 10**9
#: Data wait, as a share of the step, that counts as hidden.
HIDDEN_SHARE = 0.05
WORKER_COUNTS = (0, 1, 2, 4)
#: Files up to this size are digested whole; larger ones by sampled chunks.
FULL_DIGEST_BYTES = 1 << 30
_CHUNK = 1 << 20


@dataclass(frozen=True, kw_only=True)
class DoctorConfig:
    """The job's data flags (as Megatron's) and how long to measure."""

    data_path: list[str]
    seq_length: int
    data_cache_path: str | None = None
    split: str = "969, 30, 1"
    train_samples: int | None = None
    """Samples of the train split (None: one epoch, as ``build_datasets``)."""
    seed: int = 1234
    build_policy: str = "auto"
    order: str = "megatron"
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


# -- measuring opens and stats ----------------------------------------------------------------------
class _IOCount:
    opens = 0
    stats = 0
    active = False
    hooked = False


def _audit(event: str, args: tuple) -> None:
    if _IOCount.active and event == "open":
        _IOCount.opens += 1


@contextmanager
def count_io() -> Iterator[_IOCount]:
    """Count opens (audit hook) and ``os.stat`` calls made inside the block, in this process."""
    if not _IOCount.hooked:
        sys.addaudithook(_audit)  # permanent by design; counts only while active
        _IOCount.hooked = True
    real_stat = os.stat

    def stat(*args: Any, **kwargs: Any):
        _IOCount.stats += 1
        return real_stat(*args, **kwargs)

    _IOCount.opens = _IOCount.stats = 0
    _IOCount.active, os.stat = True, stat
    try:
        yield _IOCount
    finally:
        _IOCount.active, os.stat = False, real_stat


# -- the slow-storage rehearsal ---------------------------------------------------------------------
class SlowReads:
    """A dataset whose batch reads sleep ``delay_s`` first (``READ_DELAY_ENV``)."""

    def __init__(self, dataset: Any, delay_s: float) -> None:
        self.dataset, self.delay_s = dataset, delay_s

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices):
        time.sleep(self.delay_s)
        return self.dataset.__getitems__(indices)

    def read_batch(self, indices):
        time.sleep(self.delay_s)
        return self.dataset.read_batch(indices)

    def finish_batch(self, raw, alloc):
        return self.dataset.finish_batch(raw, alloc)

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # unpickling: not set yet
            raise AttributeError(name)
        return getattr(self.dataset, name)


def _read_delay() -> float:
    text = os.environ.get(READ_DELAY_ENV)
    if not text:
        return 0.0
    try:
        return max(float(text), 0.0) / 1e3
    except ValueError:
        raise ConfigError(f"{READ_DELAY_ENV} is {text!r}, expected milliseconds",
                          hint=f"unset {READ_DELAY_ENV} or give a number") from None


# -- the checks -------------------------------------------------------------------------------------
def diagnose(config: DoctorConfig) -> Report:
    """Run every check on ``config``'s data (see the module docstring)."""
    from .index import parse_blend

    blend = parse_blend(config.data_path)
    prefixes = list(dict.fromkeys(blend.prefixes))
    report = Report(step_ms=config.step_ms)
    train = _check_startup(config, report)
    _check_steady_state(config, train, prefixes, report)
    _check_prefixes(prefixes, report)
    _check_copies(prefixes, config.compare, report)
    return report


def _data_config(config: DoctorConfig, **overrides: Any):
    from .datasets import MegatronDataConfig

    values = dict(
        sequence_length=config.seq_length, random_seed=config.seed, blend=config.data_path, split=config.split,
        path_to_cache=config.data_cache_path, build_policy=config.build_policy, order=config.order,
        read_mode=config.read_mode, sequences_path=config.sequences_path,
    )
    values.update(overrides)
    return MegatronDataConfig(**values)


def _sizes(config: DoctorConfig) -> list[int | None]:
    return [config.train_samples, None, None]


def _timed_build(config: DoctorConfig, **overrides: Any) -> tuple[Any, float, int, int, dict[str, float]]:
    """(train, seconds, opens, stats, phases) of one ``build_datasets``."""
    from .datasets import build_datasets

    data_config = _data_config(config, **overrides)
    with count_io() as io:
        start = time.perf_counter()
        train, _, _ = build_datasets(data_config, _sizes(config))
        seconds = time.perf_counter() - start
    if train is None:
        raise ConfigError(f"split {config.split!r} gives no train split", hint="pass the job's --split")
    return train, seconds, io.opens, io.stats, dict(getattr(train, "startup_phases", {}) or {})


def _cache_found(config: DoctorConfig) -> bool:
    """Whether the job's index caches are there (a 'none' load: it builds and writes nothing)."""
    try:
        _timed_build(config, build_policy="none", order="megatron")
    except CacheError:
        return False
    return True


def _check_startup(config: DoctorConfig, report: Report) -> Any:
    """Time the job's startup with the cache as found; findings for a build on the critical path
    and for the opens/stats every rank makes at once. Returns the train dataset."""
    policy = config.build_policy
    computed = _timed_build(config, order="computed", build_policy="auto")
    if config.order == "computed":
        train, seconds, opens, stats, phases = computed
        report.findings.append(Finding("startup", False, f"the computed order starts in {seconds:.3f} s:"
                                       " no index build, no cache, no barrier"))
    elif _cache_found(config):
        # the readers of rank0/local-rank0 load as 'none' does once the barrier is passed
        load_policy = policy if policy in ("auto", "none") else "none"
        overrides = {"cache": "off"} if policy == "every-rank" else {"build_policy": load_policy}
        train, seconds, opens, stats, phases = _timed_build(config, **overrides)
        if policy == "every-rank":
            report.findings.append(_stall(policy, seconds, computed[1], "every rank builds every index at every start",
                                          _prepare_command(config)))
        else:
            report.findings.append(Finding("startup", False, f"the index caches are prepared: a rank loads them"
                                           f" in {seconds:.3f} s (build_policy={policy!r}); no build at startup"))
    else:
        train, seconds, opens, stats, phases = _timed_build(config, cache="off")
        what = {
            "none": "every rank fails at once with a CacheError: build_policy='none' finds no prepared cache",
            "rank0": "global rank 0 builds every index while every other rank waits at the barrier",
            "local-rank0": "local rank 0 of every node builds every index while the node's other ranks wait",
            "auto": "rank 0 builds and writes every index while every other rank builds it in memory",
            "every-rank": "every rank builds every index at every start",
        }[policy]
        report.findings.append(_stall(policy, seconds, computed[1], what, _prepare_command(config)))
    report.timeline = [(name, s) for name, s in phases.items()]
    _check_io(config, opens, stats, report)
    return train


def _prepare_command(config: DoctorConfig) -> str:
    from .datasets.policy import prepare_command

    return prepare_command(_data_config(config), _sizes(config))


def _stall(policy: str, seconds: float, computed_s: float, what: str, command: str) -> Finding:
    return Finding(
        "startup", True,
        f"no prepared index cache for this job: {what}; the build takes {seconds:.3f} s here on one"
        f" rank (build_policy={policy!r}), and grows with the data and the number of prefixes",
        f"run `{command}` (tokenload prepare-cache with the job's flags) once, offline, then train with"
        f" build_policy=\"none\" (docs/SCALE.md); or use order=\"computed\" (starts in {computed_s:.3f} s here,"
        " no index at all)",
    )


def _check_io(config: DoctorConfig, opens: int, stats: int, report: Report) -> None:
    where = f"{opens} opens and {stats} stats per rank in build_datasets"
    if opens + stats > IO_BURST_LIMIT:
        missing = []
        if config.build_policy != "none":
            missing.append("deferred index loading (build_policy=\"none\" on a prepared cache: one manifest"
                           " read, the arrays mapped on first use)")
        if config.sequences_path is None:
            missing.append("a sequences JSON (`tokenload sequences --data-path ... --per-dataset-sequences-path"
                           " FILE`, then sequences_path=FILE: no .idx header read per file)")
        fix = "; ".join(missing) or "merge the prefixes (fewer files to open)"
        report.findings.append(Finding("io-burst", True, f"{where}, made by every rank at the same moment:"
                                       " a metadata burst on a shared filesystem at hundreds of nodes", fix))
    else:
        report.findings.append(Finding("io-burst", False, f"{where}: no burst"))


# -- steady state -----------------------------------------------------------------------------------
def _mock_like(config: DoctorConfig, train: Any) -> Any:
    """Mock data of the same shape (sequence length, sample count) as ``train``."""
    from .datasets import MegatronDataConfig, build_datasets

    mock = MegatronDataConfig(sequence_length=config.seq_length, vocab_size=65536, eod_id=0, order="computed")
    dataset, _, _ = build_datasets(mock, [len(train), None, None])
    return dataset


def loader_rate(dataset: Any, config: DoctorConfig, workers: int = 0, step_s: float = 0.0) -> tuple[float, list[float]]:
    """(samples/s of the training loop, the data wait of each step) over ``config.steps`` steps."""
    from .loader import build_dataloader

    loader = build_dataloader(dataset, micro_batch_size=config.micro_batch_size, num_workers=workers,
                              dp_rank=0, dp_size=1)
    waits: list[float] = []
    try:
        iterator = iter(loader)
        start = asked = time.perf_counter()
        for _ in range(config.steps + 1):
            try:
                next(iterator)
            except StopIteration:
                break
            waits.append(time.perf_counter() - asked)
            if len(waits) == 1:
                start = time.perf_counter()  # the rate is the steady state's: after the first batch
            if step_s:
                time.sleep(step_s)
            asked = time.perf_counter()
        elapsed = time.perf_counter() - start
    finally:
        loader.close()
    served = (len(waits) - 1) * config.micro_batch_size
    return (served / elapsed if elapsed > 0 and served > 0 else 0.0), waits


def _check_steady_state(config: DoctorConfig, train: Any, prefixes: list[str], report: Report) -> None:
    delay = _read_delay()
    data = SlowReads(train, delay) if delay else train
    rate, waits = loader_rate(data, config)
    report.timeline.append(("first batch", waits[0] if waits else 0.0))
    mock_rate, _ = loader_rate(_mock_like(config, train), config)
    slow = rate < SLOW_RATIO * mock_rate
    measured = (f"the loader serves {rate:,.0f} samples/s of this data against {mock_rate:,.0f} of mock data of"
                f" the same shape (one process, no workers)")
    report.findings.append(Finding(
        "steady-state", slow, measured + (": reading the data is the bottleneck" if slow else ""),
        "reads are slow on this storage: use loader workers (below), the faster read mode (below), a"
        " larger prefetch_factor, or a faster filesystem (stage the data on local disk)" if slow else None,
    ))
    _check_read_modes(config, prefixes, report)
    _check_workers(config, data, report)


def window_read_rate(prefix: str, mode: str, window: int, reads: int = 64, batch: int = 8) -> float:
    """Training windows per second read at random places of ``prefix``'s ``.bin`` in ``mode``."""
    from .format import TokenFile

    source = TokenFile(prefix, mode=mode)
    total = source.num_tokens
    if total <= window:
        return math.inf
    rng = np.random.default_rng(0)
    starts = rng.integers(0, total - window, size=reads, dtype=np.int64)
    lengths = np.full(batch, window, dtype=np.int64)
    source.read_spans(starts[:1], lengths[:1])  # open (and map) outside the timing
    start = time.perf_counter()
    for i in range(0, reads, batch):
        source.read_spans(starts[i:i + batch], lengths[: len(starts[i:i + batch])])
    seconds = time.perf_counter() - start
    source.close()
    return reads / seconds if seconds > 0 else math.inf


def _check_read_modes(config: DoctorConfig, prefixes: list[str], report: Report) -> None:
    largest = max(prefixes, key=lambda p: _size(p + ".bin"))
    rates = {mode: window_read_rate(largest, mode, config.seq_length + 1) for mode in ("mmap", "pread")}
    other = "pread" if config.read_mode == "mmap" else "mmap"
    mine = rates.get(config.read_mode, rates["mmap"])
    slow = rates[other] > READ_MODE_RATIO * mine
    measured = (f"random training windows of {largest}: mmap {rates['mmap']:,.0f}/s, pread"
                f" {rates['pread']:,.0f}/s on this filesystem (read_mode={config.read_mode!r})")
    report.findings.append(Finding(
        "read-mode", slow, measured,
        f"use read_mode={other!r} (Megatron: {'--no-mmap-bin-files' if other == 'pread' else 'drop --no-mmap-bin-files'})"
        if slow else None,
    ))


def _check_workers(config: DoctorConfig, data: Any, report: Report) -> None:
    step_s = config.step_ms / 1e3
    enough = None
    shares = []
    for workers in WORKER_COUNTS:
        _, waits = loader_rate(data, config, workers=workers, step_s=step_s)
        report.waits[workers] = waits
        steady = waits[1:] or waits
        share = sum(steady) / (sum(steady) + step_s * len(steady)) if steady else 0.0
        shares.append(f"{workers}: {share:.0%}")
        if share < HIDDEN_SHARE:
            enough = workers
            break
    measured = f"data wait as a share of a {config.step_ms:g} ms step, per worker count: {', '.join(shares)}"
    if enough is None:
        report.findings.append(Finding(
            "workers", True, measured + f"; no count up to {WORKER_COUNTS[-1]} hides loading",
            "loading cannot keep up with this step: speed up the reads (read mode, local staging, fewer"
            " and larger files) or raise prefetch_factor; more workers than cores do not help",
        ))
    else:
        report.findings.append(Finding("workers", False, measured + f"; num_workers={enough} hides loading"))


# -- files ------------------------------------------------------------------------------------------
def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _check_prefixes(prefixes: list[str], report: Report) -> None:
    sizes = [_size(p + ".bin") for p in prefixes]
    median = statistics.median(sizes)
    small = sum(s < MERGE_TARGET_BYTES for s in sizes)
    measured = f"{len(prefixes)} prefix(es), median {median / 1e6:,.1f} MB per .bin, {small} under 10 GB"
    if len(prefixes) >= MANY_PREFIXES and small >= MANY_PREFIXES:
        report.findings.append(Finding(
            "prefixes", True, measured + ": every one costs opens and an index build at startup",
            "merge them (`tokenload merge --input DIR --output-prefix merged`, Megatron's merge_datasets),"
            " aiming for at least 10 GB per file",
        ))
    else:
        report.findings.append(Finding("prefixes", False, measured))


def content_digest(prefix: str) -> str:
    """xxh3-128 of a token file's ``.idx`` and ``.bin`` (sampled chunks past 1 GiB)."""
    h = xxhash.xxh3_128()
    for path in (prefix + ".idx", prefix + ".bin"):
        size = _size(path)
        h.update(size.to_bytes(8, "little"))
        with open(path, "rb") as f:
            if size <= FULL_DIGEST_BYTES:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
            else:
                for k in range(64):
                    f.seek(k * (size - _CHUNK) // 63)
                    h.update(f.read(_CHUNK))
    return h.hexdigest()


def _copies(prefixes: list[str], compare: list[str]) -> dict[str, list[str]]:
    """The copies of each file name: prefixes named twice, and each one's twin under ``compare``."""
    groups: dict[str, list[str]] = {}
    for p in prefixes:
        groups.setdefault(os.path.basename(p), []).append(p)
    for folder in compare:
        for name, members in groups.items():
            members.append(os.path.join(folder, name))
    return {name: members for name, members in groups.items() if len(members) > 1}


def _check_copies(prefixes: list[str], compare: list[str], report: Report) -> None:
    groups = _copies(prefixes, compare)
    if not groups:
        report.findings.append(Finding("copies", False, "no prefix given twice and no --compare folder:"
                                       " nothing to compare"))
        return
    differ = []
    for name, members in groups.items():
        digests = {}
        for p in members:
            digests[p] = content_digest(p) if Path(p + ".bin").exists() and Path(p + ".idx").exists() else "missing"
        if len(set(digests.values())) > 1:
            differ.append(f"{name}: " + ", ".join(f"{p} {d[:12]}" for p, d in digests.items()))
    checked = f"{len(groups)} file name(s) present in {max(len(m) for m in groups.values())} copies"
    if differ:
        report.findings.append(Finding(
            "copies", True, f"{checked}; copies that differ: " + "; ".join(differ),
            "copy the data again from one source (e.g. `rsync -c`) and check with `tokenload verify --hashes`:"
            " ranks reading different copies train on different samples, and a resume's fingerprint check"
            " refuses them",
        ))
    else:
        report.findings.append(Finding("copies", False, f"{checked}: identical content"))


# -- output -----------------------------------------------------------------------------------------
def format_report(report: Report) -> str:
    lines = []
    for f in report.findings:
        lines.append(f"[{f.check}] {'PROBLEM' if f.problem else 'ok'}: {f.measured}")
        if f.problem and f.fix:
            lines.append(f"    fix: {f.fix}")
    n = len(report.problems)
    lines.append(f"{n} problem(s) found" if n else "no problem found")
    return "\n".join(lines)


def plot(report: Report, path: str, *, width_in: float = 10.0, height_in: float = 6.0, dpi: int = 100) -> None:
    """A PNG of the startup timeline and of the per-step data wait per worker count."""
    from .errors import require

    matplotlib = require("matplotlib", "plot", "tokenload doctor --plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(width_in, height_in), dpi=dpi)
    left = 0.0
    for i, (name, seconds) in enumerate(report.timeline or [("startup", 0.0)]):
        top.barh(0, seconds * 1e3, left=left * 1e3, color=f"C{i}", label=f"{name} {seconds * 1e3:.1f} ms")
        left += seconds
    top.set_yticks([])
    top.set_xlabel("ms from the start of build_datasets (one rank)")
    top.set_title("startup timeline")
    top.legend(loc="upper right", fontsize=8)
    for workers, waits in sorted(report.waits.items()):
        bottom.plot(range(1, len(waits) + 1), [w * 1e3 for w in waits], marker="o", label=f"{workers} workers")
    bottom.axhline(report.step_ms, color="grey", linestyle="--", label=f"training step {report.step_ms:g} ms")
    bottom.set_yscale("symlog", linthresh=0.1)
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("step")
    bottom.set_ylabel("data wait (ms)")
    bottom.set_title("per-step data wait")
    bottom.legend(loc="best", fontsize=8)
    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    os.replace(tmp, path)
