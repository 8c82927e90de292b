"""The doctor's checks: each runs its measurements (``measure.py``) on the job's data and
configuration and adds a ``Finding`` to the report, with the fix when the measure crosses the
threshold below. ``diagnose`` (``tokenload.doctor``) runs them in order.

Kept apart from the measuring tools, which are usable alone, and from the report types; the
thresholds are the judgement, and live here with it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CacheError, ConfigError
from .measure import (
    SlowReads,
    content_digest,
    count_io,
    file_size,
    loader_rate,
    read_delay,
    window_read_rate,
)
from .report import DoctorConfig, Finding, Report

if TYPE_CHECKING:
    from ..datasets import MegatronDataConfig
    from ..loader.report import WorkersReport
    from ..megatron_args import Batches

#: Opens + stats per rank above which a startup counts as a burst: a manifest load makes 1-2
#: (one more with a sequences JSON), a per-dataset cache check about 13 per dataset.
IO_BURST_LIMIT = 4
#: Data slower than this fraction of mock data of the same shape: the loader is the bottleneck.
SLOW_RATIO = 0.5
#: A read mode this many times slower than the other is worth switching.
READ_MODE_RATIO = 1.5
#: Measurements of each read mode, alternating, whose median is compared.
READ_MODE_ROUNDS = 3
#: Prefixes from which their number, when they are small, is a finding.
MANY_PREFIXES = 64
#: Megatron's advice: at least this much per token file.
MERGE_TARGET_BYTES = 10 * 10**9
#: Data wait, as a share of the step, that counts as hidden.
HIDDEN_SHARE = 0.05
WORKER_COUNTS = (0, 1, 2, 4)


def _data_config(config: DoctorConfig, **overrides: Any) -> MegatronDataConfig:
    from ..datasets import MegatronDataConfig
    from ..datasets.config import fields_for_order

    values: dict[str, Any] = dict(
        sequence_length=config.seq_length,
        random_seed=config.seed,
        blend=config.data_path,
        split=config.split,
        path_to_cache=config.data_cache_path,
        build_policy=config.build_policy,
        order=config.order,
        packing=config.packing,
        read_mode=config.read_mode,
        sequences_path=config.sequences_path,
        tokenizer=config.tokenizer,
    )
    values.update(overrides)
    # the job's cache folder and policy belong to the Megatron order (timed beside the computed)
    return MegatronDataConfig(**fields_for_order(values))


def _sizes(config: DoctorConfig) -> list[int | None]:
    """The sizes the doctor builds with (it measures the train split). Plain prefixes: the
    job's ``train_samples`` (None: one epoch), valid and test one epoch each (None), as
    ``build_datasets`` takes them. A weighted blend needs an int size per split: valid and test
    are 0 (built empty), and without ``train_samples`` the train size is one pass over the
    blend's train tokens: every prefix's tokens times the split's train share, over
    ``seq_length`` (what a job whose train length is one epoch of its data would ask)."""
    from ..index import parse_blend

    job = job_counts(config)
    if job is not None:
        return list(job.samples)
    blend = parse_blend(config.data_path)
    if blend is None or blend.weights is None:
        return [config.train_samples, None, None]
    train = config.train_samples
    if train is None:
        train = _one_pass(config, blend.prefixes)
    return [train, 0, 0]


#: The Megatron length flags of a job, in the order the prepare-cache command prints them.
_LENGTH_FIELDS = (
    "train_iters",
    "train_samples",
    "global_batch_size",
    "eval_iters",
    "eval_interval",
)
#: Megatron's ``--eval-iters`` when the job does not give it.
MEGATRON_EVAL_ITERS = 100


def _job_mode(config: DoctorConfig) -> bool:
    """Whether the job's Megatron length flags size the splits (any but ``train_samples``)."""
    return any(getattr(config, f) is not None for f in _LENGTH_FIELDS if f != "train_samples")


def job_counts(config: DoctorConfig) -> Batches | None:
    """The job's samples per split by Megatron's arithmetic (``megatron_args.batches``, as
    ``tokenload prepare-cache`` computes them from the same flags; one process, no
    model parallelism: the global batch is given), or None without the job's length flags."""
    if not _job_mode(config):
        return None
    if config.global_batch_size is None:
        raise ConfigError(
            "the job's `train_iters=`, `eval_iters=` and `eval_interval=` need its"
            " `global_batch_size=`: Megatron's sample counts are iterations x global batch",
            hint="pass the job's `global_batch_size=`",
        )
    if config.eval_interval is None:
        raise ConfigError(
            "the job's sample counts need its `eval_interval=`: Megatron sizes the valid split as"
            " (iterations // eval interval + 1) x eval iterations x global batch",
            hint="pass the job's `eval_interval=` (any, with `eval_iters=0`, for a job that never"
            " evaluates)",
        )
    from ..megatron_args import batches

    args = argparse.Namespace(
        seq_length=config.seq_length,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        context_parallel_size=1,
        prepare_cache_world_size=1,
        rampup_batch_size=None,
        step_batch_size_schedule=None,
        global_batch_size=config.global_batch_size,
        micro_batch_size=None,  # the doctor's is the loader's, not checked against the batch
        train_iters=config.train_iters,
        train_samples=config.train_samples,
        skip_train=False,
        full_validation=False,
        eval_iters=MEGATRON_EVAL_ITERS if config.eval_iters is None else config.eval_iters,
        eval_interval=config.eval_interval,
        start_eval_at_iter=None,
        eval_global_batch_size=None,
        eval_micro_batch_size=None,
    )
    return batches(args)


def _one_pass(config: DoctorConfig, prefixes: tuple[str, ...]) -> int:
    """Samples of ``seq_length`` tokens in the train split of every prefix, summed (at least
    one)."""
    from ..format import TokenFile
    from ..index.splits import parse_split

    share = parse_split(config.split)[0]
    tokens = sum(TokenFile(prefix).num_tokens for prefix in prefixes)
    return max(1, int(tokens * share) // config.seq_length)


def _timed_build(
    config: DoctorConfig, **overrides: Any
) -> tuple[Any, float, int, int, dict[str, float]]:
    """(train, seconds, opens, stats, phases) of one ``build_datasets``."""
    from ..datasets import build_datasets

    data_config = _data_config(config, **overrides)
    sizes = _sizes(config)  # before the count: a weighted blend's may read headers
    with count_io() as io:
        start = time.perf_counter()
        train, _, _ = build_datasets(data_config, sizes)
        seconds = time.perf_counter() - start
    if train is None:
        raise ConfigError(
            f"split {config.split!r} gives no train split", hint="pass the job's `split=`"
        )
    return train, seconds, io.opens, io.stats, dict(getattr(train, "startup_phases", {}) or {})


def _cache_found(config: DoctorConfig) -> bool:
    """Whether the job's index caches are there (a 'none' load: it builds and writes nothing)."""
    try:
        _timed_build(config, build_policy="none", order="megatron")
    except CacheError:
        return False
    return True


def check_startup(config: DoctorConfig, report: Report) -> Any:
    """Time the job's startup with the cache as found; findings for a build on the critical path
    and for the opens/stats every rank makes at once. Returns the train dataset."""
    policy = config.build_policy
    computed = _timed_build(config, order="computed", build_policy="auto")
    if config.order == "computed":
        train, seconds, opens, stats, phases = computed
        report.findings.append(
            Finding(
                "startup",
                False,
                f"the computed order starts in {seconds:.3f} s:"
                " no index build, no cache, no barrier",
            )
        )
    elif _cache_found(config):
        # the readers of rank0/local-rank0 load as 'none' does once the barrier is passed
        load_policy = policy if policy in ("auto", "none") else "none"
        overrides = {"cache": "off"} if policy == "every-rank" else {"build_policy": load_policy}
        train, seconds, opens, stats, phases = _timed_build(config, **overrides)
        if policy == "every-rank":
            report.findings.append(
                _stall(
                    policy,
                    seconds,
                    computed[1],
                    "every rank builds every index at every start",
                    _prepare_advice(config),
                    "every rank builds every index at every start",
                )
            )
        else:
            report.findings.append(
                Finding(
                    "startup",
                    False,
                    f"the index caches are prepared: a rank loads them"
                    f" in {seconds:.3f} s (build_policy={policy!r}); no build at startup",
                )
            )
        _check_cache_trust(config, report)
    else:
        # measured as an in-memory build (cache='off'; 'none' with it would be refused)
        memory = {"build_policy": "auto"} if policy == "none" else {}
        train, seconds, opens, stats, phases = _timed_build(config, cache="off", **memory)
        what = {
            "none": (
                "every rank fails at once with a CacheError: build_policy='none' finds no"
                " prepared cache"
            ),
            "rank0": "global rank 0 builds every index while every other rank waits at the barrier",
            "local-rank0": (
                "local rank 0 of every node builds every index while the node's other ranks wait"
            ),
            "auto": (
                "rank 0 builds and writes every index while every other rank builds it in memory"
            ),
            "every-rank": "every rank builds every index at every start",
        }[policy]
        brief = (
            "no prepared cache: every rank fails"
            if policy == "none"
            else "no prepared cache: indices built at startup"
        )
        report.findings.append(
            _stall(policy, seconds, computed[1], what, _prepare_advice(config), brief)
        )
    report.timeline = [(name, s) for name, s in phases.items()]
    _check_io(config, opens, stats, report)
    return train


def _cache_folders(config: DoctorConfig) -> list[str]:
    """The local folders the job's caches are in: ``--data-cache-path``, else Megatron's default
    folder beside each prefix."""
    from ..caches import default_cache_dir

    if config.data_cache_path is not None:
        folders = [config.data_cache_path]
    else:
        prefixes = [p for p in config.data_path if not p.replace(".", "", 1).isdigit()]
        folders = [default_cache_dir(p) for p in prefixes]
    return [f for f in dict.fromkeys(folders) if "://" not in f and os.path.isdir(f)]


def _check_cache_trust(config: DoctorConfig, report: Report) -> None:
    """Which caches carry no tokenload sidecar (Megatron wrote them), and what is then checked:
    a GPT cache against the token files' lengths on first use, a blend's by its sizes only."""
    gpt, blended = 0, 0
    for folder in _cache_folders(config):
        for name in os.listdir(folder):
            if name.endswith("-description.txt"):
                stem = name[: -len("description.txt")]
                if not os.path.exists(os.path.join(folder, stem + "tokenload.json")):
                    blended += "-BlendedDataset-" in name
                    gpt += "-BlendedDataset-" not in name
    if gpt:
        report.findings.append(
            Finding(
                "cache-trust",
                False,
                f"{gpt} index cache(s) written by Megatron (no tokenload sidecar, so no content"
                " hash): their match with the current token files is checked against the sequence"
                " lengths on first use (document ids, sample starts, the shuffle a permutation);"
                " values swapped in place keep every invariant and cannot be found",
                "to have every array's content verified, prepare the caches with tokenload"
                " (`tokenload prepare-cache` into a new --data-cache-path): its sidecar records an"
                " xxh3-64 per array",
            )
        )
    if blended:
        report.findings.append(
            Finding(
                "cache-trust",
                False,
                f"{blended} blend cache(s) written by Megatron: cache written by Megatron: its"
                " match with the current token files is checked by sizes only (and each value's"
                " range as a batch reads it)",
                "prepare the caches with `tokenload prepare-cache` into a new --data-cache-path",
            )
        )


#: The length flags a prepare-cache command line carries (``prepare_command``'s), and how many
#: values each takes.
_COMMAND_LENGTH_FLAGS = {
    f"--{name}": values
    for name, values in (
        ("global-batch-size", 1),
        ("train-samples", 1),
        ("train-iters", 1),
        ("eval-iters", 1),
        ("eval-interval", 1),
        ("full-validation", 0),
        ("train-valid-test-num-samples", 3),
    )
}


def _prepare_command(config: DoctorConfig) -> str:
    """The ``tokenload prepare-cache`` command of the job's caches: with the job's own length
    flags when the doctor has them (the same sample counts, so the same cache names), else with
    the counts the doctor measured with."""
    from ..datasets.megatron.policy import prepare_command

    command = prepare_command(_data_config(config), _sizes(config))
    if not _job_mode(config):
        return command
    job = []
    for name in _LENGTH_FIELDS:
        value = getattr(config, name)
        if name == "eval_iters" and value is None:
            value = MEGATRON_EVAL_ITERS  # written out: the count depends on it
        if value is not None:
            job += [f"--{name.replace('_', '-')}", str(value)]
    # the command's own length flags (the same counts, with a global batch of 1) give way to
    # the job's, in their place
    words = shlex.split(command)
    cut = next(i for i in range(len(words)) if words[i : i + 2] == ["tokenload", "prepare-cache"])
    args, kept, at, i = words[cut + 2 :], [], None, 0
    while i < len(args):
        values = _COMMAND_LENGTH_FLAGS.get(args[i])
        if values is None:
            kept.append(args[i])
            i += 1
        else:
            at = len(kept) if at is None else at
            i += 1 + values
    at = len(kept) if at is None else at
    line = shlex.join(["tokenload", "prepare-cache", *kept[:at], *job, *kept[at:]])
    mkdir = words[: cut - 1] if cut else []  # "mkdir -p DIR &&" when the folder is not there
    return f"{shlex.join(mkdir)} && {line}" if mkdir else line


def _prepare_advice(config: DoctorConfig) -> tuple[str, str]:
    """How to prepare the job's caches, as (the command to run, a note on its sample counts):
    the job's when the doctor has its length flags, else the doctor's, which a job whose
    counts differ does not find (the caches' names hold them)."""
    command = _prepare_command(config)
    if _job_mode(config):
        return f"`{command}` (the job's length flags: its sample counts, in the caches' names)", ""
    return (
        f"`{command}`",
        ". That command's sample counts are the ones the doctor measured with, and the caches'"
        " names hold them: a job with other counts does not find its caches. Give the doctor the"
        " job's `train_iters=` (or `train_samples=`), `global_batch_size=`, `eval_iters=` and"
        " `eval_interval=` for the command of the job's caches, or give prepare-cache the job's"
        " length flags in place of the counts (Megatron's counts: train = iters x batch, valid ="
        " (iters // eval_interval + 1) x eval_iters x batch, test = eval_iters x batch)",
    )


def _stall(
    policy: str,
    seconds: float,
    computed_s: float,
    what: str,
    advice: tuple[str, str],
    brief: str,
) -> Finding:
    command, note = advice
    # 'none' builds nothing: the time is of the build its caches need (measured in memory)
    build = (
        f"building them takes {seconds:.3f} s here on one rank"
        if policy == "none"
        else f"the build takes {seconds:.3f} s here on one rank (build_policy={policy!r})"
    )
    return Finding(
        "startup",
        True,
        f"no prepared index cache for this job: {what}; {build}, and grows with the data and the"
        " number of prefixes",
        f"run {command} once, offline, then train with"
        f' build_policy="none" (docs/SCALE.md); or use order="computed" (starts in {computed_s:.3f}'
        f" s here, no index at all){note}",
        brief,
    )


def _check_io(config: DoctorConfig, opens: int, stats: int, report: Report) -> None:
    where = f"{opens} opens and {stats} stats per rank in build_datasets"
    computed = config.order == "computed"
    from ..index import parse_blend

    blend = parse_blend(config.data_path)
    prefixes = 0 if blend is None else len(set(blend.prefixes))
    if computed and opens + stats > IO_BURST_LIMIT and config.sequences_path and prefixes <= 1:
        # nothing left to take: the computed order reads a few entries of each .idx per split
        # (no index cache, so no deferred loading), and one file is as few as files get
        report.findings.append(
            Finding(
                "io-burst",
                False,
                f"{where}: the computed order's least for one prefix (a few .idx entries per"
                " split, no index to load)",
            )
        )
        return
    if opens + stats > IO_BURST_LIMIT:
        missing = []
        if config.build_policy != "none" and not computed:
            missing.append(
                'deferred index loading (build_policy="none" on a prepared cache: one manifest'
                " read, the arrays mapped on first use)"
            )
        if config.sequences_path is None:
            missing.append(
                "a sequences JSON (`tokenload sequences --data-path ..."
                " --per-dataset-sequences-path FILE`, then sequences_path=FILE: no .idx header read"
                " per file)"
            )
        if computed and prefixes > 1:
            missing.append("merge the prefixes (`tokenload merge`: fewer files to open)")
        fix = "; ".join(missing) or "merge the prefixes (fewer files to open)"
        report.findings.append(
            Finding(
                "io-burst",
                True,
                f"{where}, made by every rank at the same moment:"
                " a metadata burst on a shared filesystem at hundreds of nodes",
                fix,
                f"{opens + stats} opens/stats per rank at startup",
            )
        )
    else:
        report.findings.append(Finding("io-burst", False, f"{where}: no burst"))


# -- steady state ----------------------------------------------------------------------------------
def _mock_like(config: DoctorConfig, train: Any) -> Any:
    """Mock data of the same shape (sequence length, sample count) as ``train``."""
    from ..datasets import MegatronDataConfig, build_datasets

    mock = MegatronDataConfig(
        sequence_length=config.seq_length, vocab_size=65536, eod_id=0, order="computed"
    )
    dataset, _, _ = build_datasets(mock, [len(train), None, None])
    return dataset


def check_steady_state(
    config: DoctorConfig, train: Any, prefixes: list[str], report: Report
) -> None:
    delay = read_delay()
    data = SlowReads(train, delay) if delay else train
    rate, waits = loader_rate(data, config)
    report.timeline.append(("first batch", waits[0] if waits else 0.0))
    mock_rate, _ = loader_rate(_mock_like(config, train), config)
    slow = rate < SLOW_RATIO * mock_rate
    measured = (
        f"the loader serves {rate:,.0f} samples/s of this data against {mock_rate:,.0f} of mock"
        " data of the same shape (one process, no workers)"
    )
    report.findings.append(
        Finding(
            "steady-state",
            slow,
            measured + (": reading the data is the bottleneck" if slow else ""),
            "reads are slow on this storage: use loader workers (below), the faster read mode"
            " (below), a larger prefetch_factor, or a faster filesystem (stage the data on local"
            " disk)"
            if slow
            else None,
            f"the loader at {rate / mock_rate if mock_rate else 0:.0%} of mock data's speed",
        )
    )
    _check_read_modes(config, prefixes, report)
    _check_workers(config, data, report)


def _check_read_modes(config: DoctorConfig, prefixes: list[str], report: Report) -> None:
    largest = max(prefixes, key=lambda p: file_size(p + ".bin"))
    # each mode 3 times, alternating, each time at places of its own (neither reads what the
    # other brought into the page cache): the median of each, not one noisy pass
    runs: dict[str, list[float]] = {"mmap": [], "pread": []}
    for round_ in range(READ_MODE_ROUNDS):
        for mode in ("mmap", "pread") if round_ % 2 == 0 else ("pread", "mmap"):
            seed = 2 * round_ + (mode == "pread")
            runs[mode].append(window_read_rate(largest, mode, config.seq_length + 1, seed=seed))
    rates = {mode: statistics.median(r) for mode, r in runs.items()}
    other = "pread" if config.read_mode == "mmap" else "mmap"
    mine = rates.get(config.read_mode, rates["mmap"])
    slow = rates[other] > READ_MODE_RATIO * mine
    measured = (
        f"random training windows of {largest}: mmap {rates['mmap']:,.0f}/s, pread"
        f" {rates['pread']:,.0f}/s on this filesystem (read_mode={config.read_mode!r})"
    )
    report.findings.append(
        Finding(
            "read-mode",
            slow,
            measured,
            f"use read_mode={other!r} (Megatron:"
            f" {'--no-mmap-bin-files' if other == 'pread' else 'drop --no-mmap-bin-files'})"
            if slow
            else None,
            f"{other} reads {rates[other] / mine if mine else 0:.1f}x faster here",
        )
    )


def _check_workers(config: DoctorConfig, data: Any, report: Report) -> None:
    step_s = config.step_ms / 1e3
    enough = None
    shares = []
    health: list[WorkersReport] = []
    for workers in WORKER_COUNTS:
        _, waits = loader_rate(data, config, workers=workers, step_s=step_s, health=health)
        report.waits[workers] = waits
        steady = waits[1:] or waits
        share = sum(steady) / (sum(steady) + step_s * len(steady)) if steady else 0.0
        shares.append(f"{workers}: {share:.0%}")
        if share < HIDDEN_SHARE:
            enough = workers
            break
    measured = (
        f"data wait as a share of a {config.step_ms:g} ms step, per worker count:"
        f" {', '.join(shares)}"
    )
    if enough is None:
        report.findings.append(
            Finding(
                "workers",
                True,
                measured + f"; no count up to {WORKER_COUNTS[-1]} hides loading",
                "loading cannot keep up with this step: speed up the reads (read mode, local"
                " staging, fewer and larger files) or raise prefetch_factor; more workers than"
                " cores do not help",
                f"data wait not hidden by up to {WORKER_COUNTS[-1]} workers",
            )
        )
    else:
        report.findings.append(
            Finding("workers", False, measured + f"; num_workers={enough} hides loading")
        )
    _check_worker_faults(health, report)


def _check_worker_faults(health: list[WorkersReport], report: Report) -> None:
    """Loader workers replaced while the doctor measured (issue 24): restarts, stalls, time lost."""
    restarts = sum(h["restarts"] for h in health)
    stalls = sum(h["stalls"] for h in health)
    lost = sum(h["time_lost_s"] for h in health)
    measured = (
        f"loader workers replaced while measuring: {restarts} ({stalls} stalled past"
        f" worker_timeout), {lost:.1f} s lost waiting for them"
    )
    report.findings.append(
        Finding(
            "worker-faults",
            restarts > 0,
            measured,
            "see the warnings above: a worker killed by signal 9 is usually the out-of-memory"
            " killer (check the kernel log, lower num_workers or prefetch_factor); a stalled one"
            " points at stuck storage (raise worker_timeout only if its reads are legitimately that"
            " slow)"
            if restarts
            else None,
            f"{restarts} loader worker(s) replaced while measuring",
        )
    )


# -- files -----------------------------------------------------------------------------------------
def check_prefixes(prefixes: list[str], report: Report) -> None:
    sizes = [file_size(p + ".bin") for p in prefixes]
    median = statistics.median(sizes)
    small = sum(s < MERGE_TARGET_BYTES for s in sizes)
    measured = (
        f"{len(prefixes)} prefix(es), median {median / 1e6:,.1f} MB per .bin, {small} under 10 GB"
    )
    if len(prefixes) >= MANY_PREFIXES and small >= MANY_PREFIXES:
        report.findings.append(
            Finding(
                "prefixes",
                True,
                measured + ": every one costs opens and an index build at startup",
                "merge them (`tokenload merge --input DIR --output-prefix merged`, Megatron's"
                " merge_datasets), aiming for at least 10 GB per file",
                f"{small} small prefixes to open and index",
            )
        )
    else:
        report.findings.append(Finding("prefixes", False, measured))


def _copies(prefixes: list[str], compare: list[str]) -> dict[str, list[str]]:
    """The copies of each file name: prefixes named twice, and each one's twin under ``compare``."""
    groups: dict[str, list[str]] = {}
    for p in prefixes:
        groups.setdefault(os.path.basename(p), []).append(p)
    for folder in compare:
        for name, members in groups.items():
            members.append(os.path.join(folder, name))
    return {name: members for name, members in groups.items() if len(members) > 1}


def check_copies(prefixes: list[str], compare: list[str], report: Report) -> None:
    groups = _copies(prefixes, compare)
    if not groups:
        report.findings.append(
            Finding(
                "copies",
                False,
                "no prefix given twice and no `compare=` folder: nothing to compare",
            )
        )
        return
    differ = []
    for name, members in groups.items():
        digests = {}
        for p in members:
            digests[p] = (
                content_digest(p)
                if Path(p + ".bin").exists() and Path(p + ".idx").exists()
                else "missing"
            )
        if len(set(digests.values())) > 1:
            differ.append(f"{name}: " + ", ".join(f"{p} {d[:12]}" for p, d in digests.items()))
    checked = f"{len(groups)} file name(s) present in {max(len(m) for m in groups.values())} copies"
    if differ:
        report.findings.append(
            Finding(
                "copies",
                True,
                f"{checked}; copies that differ: " + "; ".join(differ),
                "copy the data again from one source (e.g. `rsync -c`) and check with `tokenload"
                " verify --hashes`: ranks reading different copies train on different samples, and"
                " a resume's fingerprint check refuses them",
                f"copies of {len(differ)} file(s) differ",
            )
        )
    else:
        report.findings.append(Finding("copies", False, f"{checked}: identical content"))
