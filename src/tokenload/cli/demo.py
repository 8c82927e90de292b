"""``tokenload demo``: the main job end to end, on N local ranks, from nothing but the package.

Raw text (the Python standard library's own sources, written as JSONL) -> token files with the
built-in byte-level tokenizer -> the index caches prepared once, offline, in one process (what
``tokenload prepare-cache`` runs) with the build manifest and a sequences JSON -> N ranks started
at once by torchrun (gloo, CPU), each loading batches in three orders: Megatron's on the prepared
cache (``build_policy="none"``: no build, no barrier), the computed order (no cache at all) and
mock data. Each rank checkpoints its loader after K steps and goes on; then a job on another
rank count resumes from the checkpoint, and the samples it serves are compared with those of the
uninterrupted run. Then ``tokenload doctor`` measures the same data and draws its picture (a PNG,
with the ``plot`` extra). One table gives, per order and rank, the time to the first batch (the
data phase, after imports), samples/s, the share of time spent waiting for data (from
``loader.metrics()``, and after the first batch), and whether the resume was exact; a legend under
it says what each column measured. One line per phase before it: the whole output fits a screen.

The work folder is removed at the end unless ``--keep``; after a failure it is kept for its log.
torchrun's own temporary folders (``torchelastic_*``) are made inside it, so none is left in the
machine's temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .args import at_least, positive

#: Global batch per step, whatever the rank count (micro-batch = this / ranks).
GLOBAL_BATCH = 16


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo", help="run the main job on N local ranks on the Python standard library's sources"
    )
    p.add_argument(
        "--ranks", type=positive(int), default=4, help="ranks of the job (torchrun, gloo on CPU)"
    )
    p.add_argument(
        "--resume-ranks",
        type=positive(int),
        default=None,
        help="ranks of the job that resumes from the checkpoint"
        " (default: 2, or 1 when --ranks is 2)",
    )
    p.add_argument(
        "--output", default=None, metavar="DIR", help="work folder (default: a new temporary one)"
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the work folder (token files, caches, results)"
    )
    p.add_argument(
        "--max-mb", type=positive(float), default=8.0, help="size cap of the sample corpus in MB"
    )
    p.add_argument("--workers", type=positive(int), default=2, help="tokenizer workers")
    p.add_argument(
        "--seq-length", type=positive(int), default=1024, help="tokens per training sample"
    )
    p.add_argument(
        "--steps", type=positive(int), default=12, help="training steps of the uninterrupted run"
    )
    p.add_argument(
        "--checkpoint", type=positive(int), default=6, help="save the loader state after this step"
    )
    p.add_argument(
        "--loader-workers",
        type=at_least(int, 0),
        default=1,
        help="loader worker processes per rank",
    )
    p.add_argument(
        "--step-ms", type=at_least(float, 0), default=20.0, help="simulated training step (ms)"
    )
    p.add_argument(
        "--plot",
        default="tokenload-demo-doctor.png",
        metavar="PNG",
        help="where the doctor's picture goes (default: %(default)s in the current folder;"
        " '' for none; needs the plot extra)",
    )
    p.set_defaults(func=run)


def _resume_ranks(args: argparse.Namespace) -> int:
    resume = args.resume_ranks or (1 if args.ranks == 2 else 2)
    for n in (args.ranks, resume):
        if GLOBAL_BATCH % n:
            raise ConfigError(
                f"{n} ranks do not divide the demo's global batch of {GLOBAL_BATCH} samples",
                hint="use 1, 2, 4, 8 or 16 ranks",
            )
    if resume == args.ranks:
        raise ConfigError(
            f"--resume-ranks is {resume}, the same as --ranks",
            hint="resume on another rank count to see the order continue across it",
        )
    if not args.checkpoint < args.steps:
        raise ConfigError(
            f"--checkpoint {args.checkpoint} is not before the last step {args.steps}",
            hint="checkpoint before --steps, e.g. at half of it",
        )
    if args.loader_workers < 0:
        raise ConfigError(f"--loader-workers is {args.loader_workers}", hint="use 0 or more")
    corpus = int(args.max_mb * 2**20)  # tokens, at most: the byte tokenizer's one per byte
    if args.seq_length * GLOBAL_BATCH > corpus:
        raise ConfigError(
            f"--seq-length {args.seq_length} x the demo's global batch of {GLOBAL_BATCH} samples"
            f" is more than the {corpus:,} tokens of its corpus at --max-mb {args.max_mb:g}",
            hint="lower --seq-length (default 1024) or raise --max-mb",
        )
    if args.plot:
        from .doctor import check_plot_path

        check_plot_path(args.plot)  # before the minutes of work that come before the plot
    return resume


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM as an exit, so that the running torchrun is stopped and the user told where the
    work folder is (killed outright, the demo left torchrun running)."""
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    from ..errors import require

    require("torch", "torch", "tokenload demo (its ranks run the PyTorch loader)")
    resume = _resume_ranks(args)
    started = time.perf_counter()
    if args.output and os.path.exists(args.output) and not os.path.isdir(args.output):
        raise ConfigError(
            f"--output {args.output!r} is a file; expected a folder (made when missing)",
            path=args.output,
            hint="name a folder for the demo's files, or leave --output out (a temporary one)",
        )
    folder = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="tokenload-demo-"))
    created = not args.output or not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from ..storage.os_errors import write_error

        raise write_error(exc, folder, "the demo's work folder") from None
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _run(args, resume, started, folder, created)
    except BaseException:  # an error, Ctrl-C, SIGTERM: what was made stays, for its logs
        print(f"\ntokenload demo: the work folder is kept: {folder}", file=sys.stderr, flush=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace, resume: int, started: float, folder: Path, created: bool) -> int:
    work = folder / "work"
    shutil.rmtree(work, ignore_errors=True)  # results of an earlier run must not be compared
    work.mkdir()
    job = _prepare(args, folder, work)
    ok = _launch(
        job,
        args.ranks,
        "run",
        f"[4/6] {args.ranks} ranks (torchrun, gloo), each order: checkpoint after step"
        f" {args.checkpoint}, on to step {args.steps}",
    )
    ok = ok and _launch(job, resume, "resume", f"[5/6] {resume} ranks resume from the checkpoint")
    if not ok:
        return 2
    _doctor(job, args.ranks, args.plot)
    exact = _print_table(work, job, args.ranks, resume)
    print(f"demo finished in {time.perf_counter() - started:.0f} s")
    if args.keep:
        print(f"files are in {folder}{os.sep}")
    else:
        _clean(folder, created)
    return 0 if exact else 1


def _clean(folder: Path, created: bool) -> None:
    """Remove the work folder the demo created, or only what it wrote into a folder it found."""
    if created:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for path in [
        folder / "work",
        folder / "stdlib.jsonl",
        folder / "index-cache",
        folder / "sequences.json",
        *folder.glob("stdlib_text_document*"),
    ]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()


def _prepare(args: argparse.Namespace, folder: Path, work: Path) -> dict[str, Any]:
    """Corpus, token files, caches and sequences JSON; the job description the ranks read."""
    from ..datasets import build_datasets
    from ..format import TokenFile, read_sidecar
    from ..format.sequences import counts_of, write_sequences
    from ..preprocess import PreprocessConfig, TokenizerSpec, preprocess, write_stdlib_corpus
    from .demo_rank import order_config

    corpus = folder / "stdlib.jsonl"
    print(f"[1/6] sample corpus: the standard library's sources -> {corpus}", flush=True)
    write_stdlib_corpus(corpus, max_bytes=int(args.max_mb * 2**20))
    print(f"[2/6] tokenize, byte-level tokenizer, {args.workers} workers:", end="", flush=True)
    start = time.perf_counter()
    result = preprocess(
        PreprocessConfig(
            inputs=(str(corpus),),
            output_prefix=str(folder / "stdlib"),
            tokenizer=TokenizerSpec(kind="byte"),
            append_eod=True,
            workers=args.workers,
            resume=False,
        ),
        progress=False,
    )
    prefix = result.outputs["text"]
    print(f" {sum(result.tokens.values()):,} tokens in {time.perf_counter() - start:.1f} s")
    sidecar = read_sidecar(prefix)
    assert sidecar is not None  # preprocess wrote it
    tokenizer = sidecar.tokenizer or {}
    job = {
        "work": str(work),
        "prefix": prefix,
        "cache": str(folder / "index-cache"),
        "sequences": str(folder / "sequences.json"),
        "seq_length": args.seq_length,
        "seed": 1234,
        "split": "100,0,0",
        "eod_id": tokenizer.get("eod_id"),
        "vocab_size": tokenizer.get("vocab_size"),
        "tokenizer": tokenizer,
        "global_batch": GLOBAL_BATCH,
        "steps": args.steps,
        "checkpoint": args.checkpoint,
        "sizes": [args.steps * GLOBAL_BATCH, None, None],
        "workers": args.loader_workers,
        "step_ms": args.step_ms,
    }
    print("[3/6] index caches prepared once, in one process (prepare-cache):", end="", flush=True)
    start = time.perf_counter()
    write_sequences(job["sequences"], {prefix: counts_of(TokenFile(prefix))})
    train, _, _ = build_datasets(order_config(job, "megatron", prepare=True), job["sizes"])
    written = len(os.listdir(job["cache"]))
    assert train is not None  # the demo's split has a train part
    print(f" {written} files, {len(train):,} samples in {time.perf_counter() - start:.1f} s")
    (work / "job.json").write_text(json.dumps(job))
    return job


def _launch(job: dict[str, Any], ranks: int, phase: str, title: str) -> bool:
    """torchrun with ``ranks`` processes; a failure is one line (and the log kept), not a wall."""
    work = Path(job["work"])
    print(f"{title}:", end="", flush=True)
    started = time.perf_counter()
    log = work / f"torchrun-{phase}.log"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        "-m",
        "tokenload.cli.demo_rank",
        "--job",
        str(work / "job.json"),
        "--phase",
        phase,
    ]
    # torchrun makes a torchelastic_* folder per run in the temporary folder and leaves it: this
    # one is in the work folder, which goes with it
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TMPDIR=str(tmp))
    with open(log, "wb") as err:
        code = subprocess.run(
            command, stdout=err, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
        ).returncode
    if code == 0:
        print(f" done in {time.perf_counter() - started:.1f} s", flush=True)
        return True
    print(flush=True)  # end the phase's line
    # the first rank to fail is the cause; the others fail after it (a closed connection)
    errors = sorted((work / "errors").glob("rank*.txt"), key=lambda p: p.stat().st_mtime_ns)
    what = (
        f"{errors[0].stem}: {errors[0].read_text().strip()}"
        if errors
        else f"torchrun exited with status {code}"
    )
    print(
        f"tokenload demo: error: {what} (log: {log}; the work folder is kept)",
        file=sys.stderr,
        flush=True,
    )
    return False


def _doctor(job: dict[str, Any], ranks: int, plot: str) -> None:
    """``tokenload doctor`` on the demo's data and prepared cache, as the ranks loaded them; its
    picture (the startup timeline, the data wait per step per worker count) to ``plot``."""
    from ..doctor import DoctorConfig, diagnose, summary
    from ..doctor.report import plot as draw
    from ..errors import MissingExtraError

    print("[6/6] tokenload doctor on this data:", end="", flush=True)
    start = time.perf_counter()
    report = diagnose(
        DoctorConfig(
            data_path=[job["prefix"]],
            seq_length=job["seq_length"],
            data_cache_path=job["cache"],
            split=job["split"],
            train_samples=job["sizes"][0],
            seed=job["seed"],
            sequences_path=job["sequences"],
            micro_batch_size=job["global_batch"] // ranks,
            step_ms=job["step_ms"],
        )
    )
    names = summary(report)  # each problem's check and what it is, in a few words
    found = f" {len(report.problems)} problem(s){f' ({names})' if names else ''}" + (
        f" in {time.perf_counter() - start:.1f} s"
    )
    if not plot:
        print(found, flush=True)
        return
    try:
        draw(report, plot)
    except MissingExtraError:
        print(f"{found}; no picture: pip install '.[plot]' in tokenload's clone adds matplotlib")
        return
    print(f"{found}; picture: {os.path.abspath(plot)}", flush=True)


def _load(work: Path, phase: str, order: str, ranks: int) -> list[dict[str, Any]]:
    return [
        json.loads((work / "results" / f"{phase}-{order}-rank{r}.json").read_text())
        for r in range(ranks)
    ]


def _exact(
    run: list[dict[str, Any]], resumed: list[dict[str, Any]], job: dict[str, Any]
) -> list[bool]:
    """Per rank of the uninterrupted run: whether the samples it served after the checkpoint are,
    position for position, those the resumed job served there (both cut the same global batch)."""
    per_rank = job["global_batch"] // len(run)
    ok = [True] * len(run)
    for step in range(job["checkpoint"], job["steps"]):
        key = str(step)
        after = [d for r in resumed for d in r["served"].get(key, [])]
        for rank, result in enumerate(run):
            mine = result["served"].get(key)
            ok[rank] &= (
                mine is not None
                and len(mine) == per_rank
                and after[rank * per_rank : (rank + 1) * per_rank] == mine
            )
    return ok


def _print_table(work: Path, job: dict[str, Any], ranks: int, resume: int) -> bool:
    from .demo_rank import ORDERS

    header = (
        f"{'order':<10}{'rank':>4}{'first batch':>13}{'samples/s':>11}{'data wait':>11}"
        f"{'steady':>8}   resume exact"
    )
    print(header)
    print("-" * len(header))
    every = True
    for order in ORDERS:
        run, resumed = _load(work, "run", order, ranks), _load(work, "resume", order, resume)
        exact = _exact(run, resumed, job)
        every &= all(exact)
        for r in run:
            rate = r["samples"] / r["loop_s"] if r["loop_s"] else 0.0
            share = "-" if r["wait_share"] is None else f"{r['wait_share']:.1%}"
            steady = r.get("steady_wait_share")
            steady_text = "-" if steady is None else f"{steady:.1%}"
            print(
                f"{order:<10}{r['rank']:>4}{r['first_batch_s']:>11.2f} s{rate:>11.0f}{share:>11}"
                f"{steady_text:>8}   {'yes' if exact[r['rank']] else 'no'}"
            )
    per_rank = job["global_batch"] // ranks
    step_s = job["step_ms"] / 1e3
    ceiling = f"{per_rank / step_s:,.0f} samples/s" if step_s else "nothing"
    print(
        "first batch: the datasets and the loader built, and the first micro-batch (after imports)."
        f"\nsamples/s: per rank; a simulated {job['step_ms']:g} ms step of {per_rank} samples caps"
        f" it at {ceiling}.\ndata wait: the share of the loop spent waiting for data"
        " (loader.metrics()); steady: after batch 1."
        f"\nresume exact: the samples served after step {job['checkpoint']} equal, in order, those"
        f" of the {resume}-rank resume."
    )
    return every
