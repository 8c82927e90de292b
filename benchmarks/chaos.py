"""Chaos run of the self-healing loader (issue 24): randomized worker faults, every batch checked.

Usage: python benchmarks/chaos.py [--faults 300] [--seed 1] [--out /tmp/chaos.json] [--quick]
       [--read-modes mmap,pread,s3] [--s3-endpoint URL]

Each case builds a loader (fork or spawn; 1, 2 or 4 workers; the Megatron order, the computed
order or a flat file; token files read by mmap, pread or from ``s3://``), injects one or more
faults at random micro-batches, runs to the end of its window and compares every batch delivered
with the fault-free run (``num_workers=0``), bit for bit. Faults:

* ``kill``: SIGKILL a random worker (the out-of-memory killer);
* ``stop``: SIGSTOP a worker for ever (a hung NFS/FUSE read, a debugger);
* ``stop_cont``: SIGSTOP, then SIGCONT after a random delay (below or above ``worker_timeout``);
* ``exit_start``: the next worker to start exits before it is ready (under fork in an after-fork
  hook, under spawn while its dataset is unpickled);
* ``raise``: the dataset's read of one sample raises ``FormatError`` (once): the loop must get it
  typed, then resume at ``consumed_samples`` and get the rest right;
* ``block``: the dataset's read of one sample blocks for ever (once).

Some cases get more process faults than ``max_worker_restarts`` allows; they must end in a
``WorkerError`` naming the worker, its pid, how it ended, the last micro-batch it delivered and a
HINT. Every case runs under a SIGALRM watchdog of its own bound: a case still running then is a
hang (the watchdog's ``TimeoutError`` must come out of ``next()`` as itself, not as a worker
fault). Results: counts per outcome and fault, and the time from detecting a fault to the
replacement's first batch (from the loaders' ``metrics()["workers"]``).

Read mode ``s3``: the token files are uploaded to a bucket and read as an ``s3://`` prefix (the
Megatron and computed orders; a flat file has no remote reader), through small chunks so that
every worker keeps sending ranged GETs. Without ``--s3-endpoint`` a SeaweedFS server is started
on free ports with tests/storage/conftest.py's ``start_server`` and stopped at the end; endpoint
and credentials reach the workers through the ``AWS_*`` environment.

``FaultyDataset`` and ``run_case`` are imported by tests/unit/loader/test_chaos.py (a short run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from multiprocessing import util
from pathlib import Path
from typing import Any

import numpy as np

SEQ, MBS, STEPS = 32, 4, 32
LATEST = STEPS - 12  # faults strike before: a worker killed later may owe nothing more
FAULTS = ("kill", "stop", "stop_cont", "exit_start", "raise", "block")
S3_BUCKET = "tokenload-test"  # the bucket tests/storage/conftest.py's server makes
# worker_timeout of an s3 case: a fresh worker makes its S3 client before its first read (forked:
# ~50 ms from the parent's botocore session; spawned: a session of its own, ~0.15 s; before
# session 32 two libraries' sessions, 0.3-1.3 s, and a loaded CI machine once took a forked
# worker past 5 s), so the local axes' 2 s would be tight for spawn on a loaded machine
S3_TIMEOUT = 5.0
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
          "AWS_DEFAULT_REGION": "us-east-1",
          # small chunks, few kept: every worker keeps sending ranged GETs
          "TOKENLOAD_CHUNK_BYTES": "8192", "TOKENLOAD_CHUNK_CACHE_BYTES": "32768"}


class Hang(TimeoutError):
    """Raised by the case's watchdog: the case ran past its bound."""


def _claim(folder: str, name: str) -> bool:
    """True in the one process that claims ticket ``name`` first (one-shot faults)."""
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class FaultyDataset:
    """A dataset that fails once where told: ``raise_at``/``block_at`` (a sample index) in its
    read; after ``arm_exit``, in the next worker that starts. Tickets are files in ``folder``:
    each fault fires in the first process that claims it."""

    def __init__(self, dataset: Any, folder: str, *, raise_at: int | None = None,
                 block_at: int | None = None) -> None:
        self.dataset, self.folder = dataset, folder
        self.raise_at, self.block_at = raise_at, block_at
        self._register()

    def arm_exit(self) -> None:
        """The next worker process to start exits before it is ready (once per call)."""
        n = sum(name.startswith("armed") for name in os.listdir(self.folder))
        Path(self.folder, f"armed{n}").touch()

    def _register(self) -> None:
        util.register_after_fork(self, FaultyDataset._starting)  # runs in forked workers

    def __getstate__(self) -> dict:
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:  # a spawned worker loads its dataset
        self.__dict__.update(state)
        self._starting()

    def _starting(self) -> None:
        """Exit if an ``exit_start`` fault is armed and this process claims it."""
        armed = sorted(n for n in os.listdir(self.folder) if n.startswith("armed"))
        for name in armed:
            if _claim(self.folder, "exit" + name[len("armed"):]):
                os._exit(7)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: list[int]) -> Any:
        if self.raise_at in indices and _claim(self.folder, "raise"):
            from tokenload.errors import FormatError

            raise FormatError(f"planted fault at sample {self.raise_at}", hint="none: a chaos test")
        if self.block_at in indices and _claim(self.folder, "block"):
            while True:
                time.sleep(3600)
        return self.dataset.__getitems__(indices)

    @property
    def fingerprint(self) -> str:
        return self.dataset.fingerprint


# -- data ------------------------------------------------------------------------------------------
def make_data(folder: Path, s3: Any = None) -> dict[str, str]:
    """One token file pair (Megatron and computed orders) and one flat file; with ``s3`` (an
    fsspec filesystem), the pair is also uploaded to ``S3_BUCKET`` (key ``s3``)."""
    from tokenload.format import TokenFileWriter, write_flat

    rng = np.random.default_rng(5)
    prefix = folder / "corpus"
    with TokenFileWriter(prefix, dtype=np.uint16) as writer:
        for n in rng.integers(5, 90, size=600):
            writer.add_document(np.append(rng.integers(1, 999, size=int(n)), 0))
    write_flat(folder / "flat.bin", rng.integers(0, 50_000, size=20_000))
    data = {"prefix": str(prefix), "flat": str(folder / "flat.bin"), "cache": str(folder / "cache")}
    if s3 is not None:
        key = f"{S3_BUCKET}/chaos-{os.getpid()}-{time.time_ns()}/corpus"
        for ext in (".bin", ".idx"):
            s3.put(str(prefix) + ext, key + ext)
        data["s3"] = f"s3://{key}"
    return data


def build(kind: str, read_mode: str, data: dict[str, str]) -> Any:
    """The dataset of ``kind`` over ``data``; read mode ``s3`` reads the uploaded prefix."""
    from tokenload.datasets import (FlatDatasetConfig, FlatTokenDataset, MegatronDataConfig,
                                    build_datasets)
    from tokenload.datasets.computed.computed_dataset import build_computed_datasets

    if kind == "flat":
        config = FlatDatasetConfig(block_size=SEQ, seed=2, mode=read_mode)
        return FlatTokenDataset(data["flat"], config)
    remote = read_mode == "s3"
    config = MegatronDataConfig(blend=[data["s3" if remote else "prefix"]], split="100,0,0",
                                sequence_length=SEQ, eod_id=0, path_to_cache=data["cache"],
                                read_mode="mmap" if remote else read_mode)
    if kind == "megatron":
        return build_datasets(config, [None, 0, 0])[0]
    return build_computed_datasets(config, [None, 0, 0])[0]


# -- one case --------------------------------------------------------------------------------------
@dataclass
class Case:
    method: str
    workers: int
    kind: str
    read_mode: str
    faults: list[tuple[str, int]]  # (fault, micro-batch at which it strikes)
    budget: int = 3
    timeout: float = 2.0  # worker_timeout
    seed: int = 0

    @property
    def bound(self) -> float:
        start = 6.0 if self.method == "spawn" else 2.0
        return 20.0 + len(self.faults) * (self.timeout + start + 2.0) + self.workers * start


@dataclass
class Outcome:
    case: Case
    result: str = "ok"  # ok, worker_error (expected beyond the budget), hang, wrong, unexpected
    detail: str = ""
    seconds: float = 0.0
    restarts: int = 0
    stalls: int = 0
    sure: int = 0  # restarts the faults delivered were sure to cost
    recover_s: list[float] = field(default_factory=list)


def expected_batches(dataset: Any) -> list[np.ndarray]:
    return [dataset.__getitems__(list(range(k * MBS, (k + 1) * MBS)))["tokens"]
            for k in range(STEPS)]


@contextlib.contextmanager
def watchdog(seconds: float):
    def fire(signum, frame):
        frames = reversed(traceback.extract_stack(frame)[-8:])
        where = " <- ".join(f"{f.name}:{f.lineno}" for f in frames)
        raise Hang(f"case still running after {seconds:.0f} s, in {where}")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_case(case: Case, base: Any, want: list[np.ndarray]) -> Outcome:
    """Run ``case`` over ``base`` (a dataset); every batch must equal ``want``. A WorkerError is
    right when the case spent its whole budget, and names what it must; finishing is right only
    when the faults sure to cost a restart fit in the budget."""
    from tokenload.errors import FormatError
    from tokenload.loader import build_dataloader
    from tokenload.loader.workers import WorkerError

    rng = random.Random(case.seed)
    out = Outcome(case)
    tickets = tempfile.mkdtemp(prefix="tokenload-chaos-")
    by_step: dict[int, list[str]] = {}
    for fault, step in case.faults:
        by_step.setdefault(step, []).append(fault)
    reads = {f: s * MBS + rng.randrange(MBS) for f, s in case.faults if f in ("raise", "block")}
    dataset = FaultyDataset(base, tickets, raise_at=reads.get("raise"), block_at=reads.get("block"))
    striker = _Striker(dataset, rng, case)
    for fault in by_step.pop(0, []):  # at step 0: while the loader starts
        striker.strike(fault, None)
    began = time.monotonic()
    loader = build_dataloader(dataset, micro_batch_size=MBS, num_workers=case.workers, dp_rank=0,
                              dp_size=1, multiprocessing_context=case.method, prefetch_factor=2,
                              worker_timeout=case.timeout, max_worker_restarts=case.budget)
    got = 0
    try:
        with watchdog(case.bound):
            while got < STEPS:
                try:
                    for batch in loader:
                        if not np.array_equal(batch["tokens"].numpy(), want[got]):
                            out.result, out.detail = "wrong", f"micro-batch {got} differs"
                            break
                        got += 1
                        for fault in by_step.pop(got, []):
                            striker.strike(fault, loader)
                        if got == STEPS:
                            break
                    else:
                        out.result, out.detail = "wrong", f"the iteration ended after {got} batches"
                    if out.result == "wrong":
                        break
                except FormatError as exc:
                    if "planted fault" not in str(exc):
                        raise
                    loader.restart(loader.consumed_samples)  # resume where the loop stopped
    except WorkerError as exc:
        text = str(exc)
        fields = ("loader worker", "pid", "last micro-batch", "HINT:", "max_worker_restarts")
        spent = loader.metrics()["workers"]["restarts"] == case.budget
        if spent and striker.possible > case.budget and all(f in text for f in fields):
            out.result = "worker_error"
        else:  # the whole error, and where each stalled worker was stuck (its stack)
            stacks = [f"worker {f['worker']} (pid {f['pid']}), {f['cause']}:\n{f['stack']}"
                      for f in loader.metrics()["workers"]["faults"] if f.get("stack")]
            out.result, out.detail = "unexpected", "\n".join([text, *stacks])
    except Hang as exc:
        out.result, out.detail = "hang", str(exc)
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the run goes on
        out.result, out.detail = "unexpected", f"{type(exc).__name__}: {exc}"
    finally:
        for t in striker.timers:
            t.cancel()
        health = loader.metrics()["workers"]
        out.restarts, out.stalls = health["restarts"], health["stalls"]
        out.recover_s = [f["recovered_s"] for f in health["faults"] if f["recovered_s"] is not None]
        with watchdog(30):
            loader.close()
        out.seconds = time.monotonic() - began
        for name in os.listdir(tickets):
            os.unlink(os.path.join(tickets, name))
        os.rmdir(tickets)
    out.sure = striker.sure
    if out.result == "ok" and striker.sure > case.budget:
        out.result, out.detail = "unexpected", f"{striker.sure} sure faults, no WorkerError"
    return out


class _Striker:
    """Delivers a case's signal faults, each to a live worker no fault has hit yet, and counts
    the restarts they are sure to cost."""

    def __init__(self, dataset: FaultyDataset, rng: random.Random, case: Case) -> None:
        self.dataset, self.rng, self.case = dataset, rng, case
        self.struck: set[int] = set()
        self.timers: list[threading.Timer] = []
        self.sure = 0  # restarts the faults delivered are sure to cost
        self.possible = sum(f == "block" for f, _ in case.faults)  # ... or may cost

    def _target(self, loader: Any) -> int | None:
        if loader is None:
            return None
        live = [p.pid for p in loader.worker_processes if p.pid not in self.struck and p.is_alive()]
        if not live:
            return None
        pid = self.rng.choice(live)
        self.struck.add(pid)
        return pid

    def strike(self, fault: str, loader: Any) -> None:
        if fault == "exit_start":
            self.dataset.arm_exit()
            if loader is None:  # the loader's first workers
                self.sure += 1
                self.possible += 1
                return
            pid = self._target(loader)  # a kill, so that a replacement starts
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                self.sure += 2
            self.possible += 2
            return
        if fault not in ("kill", "stop", "stop_cont"):
            return  # read faults are planted in the dataset
        pid = self._target(loader)
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        if fault == "stop_cont":
            timer = threading.Timer(self.rng.uniform(0.1, 1.5 * self.case.timeout), _cont, (pid,))
            timer.daemon = True
            timer.start()
            self.timers.append(timer)
        else:
            self.sure += 1
        self.possible += 1


def _cont(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


# -- the run ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def s3_server(folder: Path, wanted: bool, endpoint: str | None):
    """An fsspec filesystem on ``endpoint`` or on a SeaweedFS server started for the run (None
    when not ``wanted``); the ``AWS_*``/``TOKENLOAD_*`` variables of ``S3_ENV`` are set for the
    workers, with a private ``.idx`` cache, and the server stopped at the end."""
    if not wanted:
        yield None
        return
    import importlib.util

    import s3fs

    server = None
    if endpoint is None:
        path = Path(__file__).resolve().parents[1] / "tests" / "storage" / "conftest.py"
        spec = importlib.util.spec_from_file_location("tokenload_storage_conftest", path)
        weed = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(weed)
        (folder / "weed").mkdir()
        proc, endpoint, log = weed.start_server(folder / "weed")
        server = (weed, proc, log)
    os.environ.update(S3_ENV, AWS_ENDPOINT_URL=endpoint,
                      TOKENLOAD_CACHE_DIR=str(folder / "idxcache"))
    try:
        yield s3fs.S3FileSystem(key="test", secret="test", skip_instance_cache=True,
                                client_kwargs={"endpoint_url": endpoint})
    finally:
        if server is not None:
            weed, proc, log = server
            weed.stop_server(proc, log)


def random_cases(total_faults: int, seed: int, methods=("fork", "spawn"),
                 read_modes=("mmap", "pread")) -> list[Case]:
    """Cases drawn until they hold ``total_faults`` faults; ``s3`` goes with the two orders."""
    rng = random.Random(seed)
    cases, count = [], 0
    while count < total_faults:
        steps = rng.sample(range(LATEST), rng.choice((1, 1, 2, 3)))
        faults = [(f, step or int(f in ("kill", "stop", "stop_cont")))  # signals need workers
                  for f, step in ((rng.choice(FAULTS), step) for step in steps)]
        budget = rng.choice((3, 3, 3, 1, 0))
        method, workers = rng.choice(methods), rng.choice((1, 2, 4))
        kind, read_mode = rng.choice(("megatron", "computed", "flat")), rng.choice(read_modes)
        if read_mode == "s3" and kind == "flat":
            kind = rng.choice(("megatron", "computed"))
        case = Case(method=method, workers=workers, kind=kind, read_mode=read_mode,
                    faults=sorted(faults, key=lambda f: f[1]), budget=budget,
                    timeout=S3_TIMEOUT if read_mode == "s3" else 2.0,
                    seed=rng.randrange(1 << 30))
        cases.append(case)
        count += len(faults)
    return cases


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    results: dict[str, int] = {}
    faults: dict[str, int] = {}
    for o in outcomes:
        results[o.result] = results.get(o.result, 0) + 1
        for f, _ in o.case.faults:
            faults[f] = faults.get(f, 0) + 1
    recover = sorted(r for o in outcomes for r in o.recover_s)

    def q(p: float) -> float | None:
        return recover[min(len(recover) - 1, int(p * len(recover)))] if recover else None

    return {
        "cases": len(outcomes), "faults": sum(faults.values()), "by_fault": faults,
        "results": results,
        "restarts": sum(o.restarts for o in outcomes), "stalls": sum(o.stalls for o in outcomes),
        "recover_s": {"n": len(recover), "min": recover[0] if recover else None, "p50": q(0.5),
                      "p90": q(0.9), "max": recover[-1] if recover else None,
                      "mean": statistics.fmean(recover) if recover else None},
        "case_s_max": max((o.seconds for o in outcomes), default=None),
        "failures": [f"{o.result}: {o.detail} {asdict(o.case)}" for o in outcomes
                     if o.result not in ("ok", "worker_error")],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="write every outcome and the summary as JSON")
    ap.add_argument("--quick", action="store_true", help="30 faults")
    ap.add_argument("--methods", default="fork,spawn", help="start methods to draw from")
    ap.add_argument("--read-modes", default="mmap,pread", help="read modes to draw from (s3 too)")
    ap.add_argument("--s3-endpoint", default=None,
                    help=f"an S3 server with bucket {S3_BUCKET} (default: start SeaweedFS)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks stop the server
    total = 30 if args.quick else args.faults
    modes = tuple(args.read_modes.split(","))
    import torch  # noqa: F401  (the loader needs it: imported before the first case's bound)

    with tempfile.TemporaryDirectory(prefix="tokenload-chaos-data-") as tmp, \
            s3_server(Path(tmp), "s3" in modes, args.s3_endpoint) as s3:
        data = make_data(Path(tmp), s3)
        datasets, wants, outcomes = {}, {}, []
        cases = random_cases(total, args.seed, tuple(args.methods.split(",")), modes)
        started = time.monotonic()
        for i, case in enumerate(cases):
            key = (case.kind, case.read_mode)
            if key not in datasets:
                datasets[key] = build(case.kind, case.read_mode, data)
                wants[key] = expected_batches(datasets[key])
            o = run_case(case, datasets[key], wants[key])
            outcomes.append(o)
            print(f"[{i + 1}/{len(cases)}] {o.result:12s} {o.seconds:5.1f} s {case.method}"
                  f" w={case.workers} {case.kind}/{case.read_mode} budget={case.budget}"
                  f" {case.faults} {o.detail}", flush=True)
        summary = summarize(outcomes)
        summary["wall_s"] = time.monotonic() - started
        print(json.dumps(summary, indent=1))
        if args.out:
            every = {"summary": summary, "outcomes": [asdict(o) for o in outcomes]}
            Path(args.out).write_text(json.dumps(every, indent=1))
    sys.exit(0 if not summary["failures"] else 1)


if __name__ == "__main__":
    main()
