"""The nanoGPT + Lightning seed scenario of issue 14, shared by its CI test and its benchmark.

N ranks, each a fresh ``python -m integrations.seed_app`` (as torchrun or Lightning's own
launcher starts them, so loader workers get Python's default start method; a rank spawned by
multiprocessing would hand "spawn" down to its workers, which then re-import torch), join a gloo
group through a file store and run a Lightning ``Trainer(strategy="ddp")`` on a tiny language
model (embedding + linear) fed by ``TokenloadDataModule`` over a ``FlatTokenDataset``, with
loader workers. Each rank records what it was served and what memory it and its workers hold:

* Which windows: the token file is sparse (``truncate``) except for random regions and a
  marker ``[MARK, w >> 16, w & 0xFFFF]`` at the start of each window ``w`` the run will read.
  Random regions draw tokens below ``MARK``, so a row that does not start with ``MARK`` was
  never meant to be read, and no two marked windows decode alike.
* Memory: PSS (``/proc/<pid>/smaps_rollup``) of the rank and of each of its loader workers,
  sampled at every step; the kernel's peak RSS (``VmHWM``); and the PSS of the token file's own
  mapping (``/proc/<pid>/smaps``) at the last step. PSS splits shared pages among the processes
  that map them, so summing it over all processes does not count torch's libraries N times.
* Time, apart from the 5-10 s of imports: the dataset factory's call in ``setup`` to
  ``on_train_start`` (Lightning's DDP setup), ``on_train_start`` to the first batch in hand
  (loader workers' start and first read: the data phase), first to last step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
import torch.distributed as dist

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.integrations.lightning import TokenloadDataModule

from .lightning_app import trainer

MARK = 0xFFFF
"""First token of every window the run reads; random content stays below it."""
VOCAB = 256
"""The tiny model's vocabulary: token ids are taken modulo it."""
_RANDOM_REGIONS = 32
_RANDOM_REGION_TOKENS = 32 * 1024
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """One training run of every rank over one token file."""

    path: str
    """The flat uint16 token file (from ``sparse_token_file``)."""
    block_size: int = 1024
    seed: int = 1234
    micro_batch_size: int = 4
    steps: int = 8
    """Optimizer steps (one micro-batch per rank each: no gradient accumulation)."""
    num_workers: int = 2
    context: str | None = None
    """The loader workers' multiprocessing context (None: the platform's default, fork on Linux)."""
    mode: str = "mmap"
    """FlatDatasetConfig's read mode (mmap, the default, or pread)."""

    def dataset(self) -> FlatTokenDataset:
        config = FlatDatasetConfig(block_size=self.block_size, seed=self.seed, mode=self.mode)
        return FlatTokenDataset(self.path, config)


def sparse_token_file(path: str | os.PathLike[str], size_bytes: int, *, block_size: int, seed: int,
                      marked_samples: int) -> str:
    """A sparse uint16 flat file of ``size_bytes``: random regions, and a window marker at the
    start of each of the global order's first ``marked_samples`` windows. Only the written
    4 KiB blocks take disk space (~``marked_samples`` of them plus 2 MiB of random regions)."""
    path = os.fspath(path)
    with open(path, "wb") as f:
        f.truncate(size_bytes)
    rng = np.random.default_rng(seed)
    tokens = size_bytes // 2
    with open(path, "r+b") as f:
        regions = np.linspace(0, tokens - _RANDOM_REGION_TOKENS, _RANDOM_REGIONS).astype(np.int64)
        for start in regions.tolist():
            f.seek(start * 2)
            f.write(rng.integers(0, MARK, _RANDOM_REGION_TOKENS, dtype=np.uint16).tobytes())
        order = FlatTokenDataset(path, FlatDatasetConfig(block_size=block_size, seed=seed))
        for start in np.sort(order.window_starts(np.arange(marked_samples))).tolist():
            window = start // block_size
            f.seek(start * 2)
            f.write(np.array([MARK, window >> 16, window & 0xFFFF], dtype=np.uint16).tobytes())
    return path


def decode_windows(tokens: torch.Tensor) -> list[int]:
    """The window number of each row, -1 for a row that carries no marker."""
    head = tokens[:, :3].to(torch.int64)
    windows = (head[:, 1] << 16) | head[:, 2]
    return torch.where(head[:, 0] == MARK, windows, torch.full_like(windows, -1)).tolist()


def pss_kib(pid: int) -> int:
    """Proportional set size of a process in KiB (0 once it is gone)."""
    return _status_field(f"/proc/{pid}/smaps_rollup", "Pss:")


def peak_rss_kib(pid: int) -> int:
    """The kernel's high-water mark of the process's resident set, in KiB."""
    return _status_field(f"/proc/{pid}/status", "VmHWM:")


def mapped_pss_kib(pid: int, path: str) -> int:
    """PSS of the process's mappings of ``path`` (its pages of the token file), in KiB."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(maxsplit=1)[0]
                if "-" in first and not first.endswith(":"):  # a mapping's header line
                    inside = line.rstrip("\n").endswith(path)
                elif inside and first == "Pss:":
                    total += int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return total


def _status_field(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def process_age_s() -> float:
    """Seconds since this process started (its spawn, imports and gloo setup so far)."""
    with open("/proc/self/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19]) / _TICK
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) - started


class TimedFactory:
    """The DataModule's dataset factory; remembers when ``setup`` called it, in the rank."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.called_at: float | None = None

    def __call__(self) -> FlatTokenDataset:
        self.called_at = time.perf_counter()
        return self.scenario.dataset()


class TinyLM(pl.LightningModule):
    """Embedding + linear next-token model (token ids modulo ``VOCAB``), trained for real; it
    records the windows of every batch and samples the memory of its rank and loader workers."""

    def __init__(self, scenario: Scenario, factory: TimedFactory) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)
        self.scenario, self.factory = scenario, factory
        self.windows: list[list[int]] = []
        self.samples: dict[str, list[int]] = {}
        self.pids: dict[str, int] = {}
        self.file_pss: dict[str, int] = {}
        self.step_times: list[float] = []
        self.train_start: float | None = None
        self.first_batch: float | None = None
        self.losses: list[float] = []
        self.peak_rss: dict[str, int] = {}

    def on_train_start(self) -> None:
        self.train_start = time.perf_counter()

    def on_train_batch_start(self, batch, batch_idx) -> None:
        if self.first_batch is None:
            self.first_batch = time.perf_counter()

    def training_step(self, batch, batch_idx):
        self.step_times.append(time.perf_counter())
        self.windows.append(decode_windows(batch["tokens"]))
        logits = self.head(self.embed(batch["tokens"] % VOCAB))
        targets = (batch["labels"] % VOCAB).flatten()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets)
        self.losses.append(loss.item())
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if not self.pids:
            served = self.trainer.train_dataloader
            assert served is not None
            workers = served.loader.worker_processes
            self.pids = {"rank": os.getpid()}
            self.pids.update({f"worker{w}": p.pid for w, p in enumerate(workers)})
        for role, pid in self.pids.items():
            self.samples.setdefault(role, []).append(pss_kib(pid))
        if self.trainer.global_step >= self.scenario.steps:  # the last step: workers still alive
            path = os.path.realpath(self.scenario.path)
            self.file_pss = {role: mapped_pss_kib(pid, path) for role, pid in self.pids.items()}
            self.peak_rss = {role: peak_rss_kib(pid) for role, pid in self.pids.items()}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def report(self) -> dict:
        """What the parent needs, as plain data."""
        memory = {
            role: {
                "start": s[0],
                "end": s[-1],
                "peak": max(s),
                "peak_rss": self.peak_rss.get(role, 0),
                "file": self.file_pss.get(role, 0),
            }
            for role, s in self.samples.items()
        }
        first, last = self.step_times[0], self.step_times[-1]
        assert self.factory.called_at is not None and self.train_start is not None
        assert self.first_batch is not None
        return {
            "file_bytes": os.path.getsize(self.scenario.path),
            "setup_s": self.train_start - self.factory.called_at,
            "first_batch_s": self.first_batch - self.train_start,
            "steps": len(self.step_times),
            "steps_s": last - first,
            "windows": self.windows,
            "memory": memory,
            "loss": (self.losses[0], self.losses[-1]),
        }


def rank_main(rank: int, world_size: int, scenarios: list[Scenario]) -> dict:
    """One rank: fits each scenario in turn (the process group is already up) and reports it."""
    runs = []
    for scenario in scenarios:
        factory = TimedFactory(scenario)
        dm = TokenloadDataModule(
            train=factory,
            micro_batch_size=scenario.micro_batch_size,
            global_batch_size=scenario.micro_batch_size * world_size,
            num_workers=scenario.num_workers,
            multiprocessing_context=scenario.context,
        )
        model = TinyLM(scenario, factory)
        trainer(devices=world_size, strategy="ddp", max_steps=scenario.steps).fit(model, dm)
        runs.append(model.report())
    return {"rank": rank, "pid": os.getpid(), "runs": runs}


def main(argv: list[str] | None = None) -> None:
    """A rank's process, as torchrun would start it: ``python -m integrations.seed_app SPEC``
    with RANK and WORLD_SIZE set. It joins a gloo group through the spec's file store (no port
    to collide with other tests) before Lightning looks, so Lightning takes that group as is."""
    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    startup = process_age_s()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    store = f"file://{spec['store']}"
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    report = rank_main(rank, world, [Scenario(**s) for s in spec["scenarios"]])
    report["startup_s"] = startup
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def expected_windows(scenario: Scenario, world_size: int) -> np.ndarray:
    """Window numbers each rank must read, ``[rank, step, row]``: Megatron's slicing of the
    global order (step j covers global samples ``[j * mbs * world, (j + 1) * mbs * world)``,
    rank r its r-th ``mbs`` of them)."""
    mbs = scenario.micro_batch_size
    samples = np.arange(scenario.steps * mbs * world_size)
    windows = scenario.dataset().window_starts(samples) // scenario.block_size
    return windows.reshape(scenario.steps, world_size, mbs).transpose(1, 0, 2)


def share_problems(results: list[dict], run: int, scenario: Scenario) -> list[str]:
    """What is wrong with the ranks' shares of run ``run`` (empty: each rank read exactly its
    slice, the ranks are disjoint and together cover the run's global batches exactly)."""
    world = len(results)
    expected = expected_windows(scenario, world)
    problems = []
    mbs = scenario.micro_batch_size
    seen = [np.array(r["runs"][run]["windows"], dtype=np.int64).reshape(-1, mbs) for r in results]
    for rank, got in enumerate(seen):
        if got.shape != expected[rank].shape or not np.array_equal(got, expected[rank]):
            problems.append(f"rank {rank} read {got.shape[0]} micro-batches not equal to its slice")
        if (got < 0).any():
            outside = int((got < 0).sum())
            problems.append(f"rank {rank} read {outside} rows outside the run's windows")
    everything = np.concatenate([g.ravel() for g in seen])
    if np.unique(everything).size != everything.size:
        problems.append(f"{everything.size - np.unique(everything).size} windows read twice")
    if set(everything.tolist()) != set(expected.ravel().tolist()):
        problems.append("the ranks together do not cover the global batches exactly")
    return problems


def run_scenarios(
    world_size: int, scenarios: list[Scenario], folder: Path, timeout: float
) -> list[dict]:
    """Every rank's report. The ranks are fresh interpreters (as torchrun and Lightning's own
    launcher start them), so the loader workers get Python's default start method (fork on
    Linux); ranks still running ``timeout`` s after the launch are killed with their workers
    (one process group per rank) and TimeoutError is raised."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("rank*.json"):
        stale.unlink()
    spec = folder / "spec.json"
    store = folder / "store"
    store.unlink(missing_ok=True)
    spec.write_text(json.dumps({"store": str(store), "out": str(folder),
                                "scenarios": [asdict(s) for s in scenarios]}))
    procs = [_start_rank(r, world_size, spec, folder) for r in range(world_size)]
    deadline = time.monotonic() + timeout
    late = []
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            late.append(proc)
    for proc in late:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if late:
        raise TimeoutError(f"{len(late)} of {world_size} ranks still running after {timeout} s"
                           f"\n{_log_tail(folder, procs.index(late[0]))}")
    for rank, proc in enumerate(procs):
        if proc.returncode != 0:
            tail = _log_tail(folder, rank)
            raise RuntimeError(f"rank {rank} exited with {proc.returncode}:\n{tail}")
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world_size)]


def _start_rank(rank: int, world_size: int, spec: Path, folder: Path) -> subprocess.Popen:
    tests = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
           "LOCAL_WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    with open(folder / f"rank{rank}.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "integrations.seed_app", str(spec)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _log_tail(folder: Path, rank: int, chars: int = 3000) -> str:
    return (folder / f"rank{rank}.log").read_text(errors="replace")[-chars:]


def token_file(folder: Path, size_bytes: int, scenario_kwargs: dict, world_size: int) -> Scenario:
    """A scenario over a new sparse file of ``size_bytes`` marked for its whole run."""
    path = str(folder / f"tokens-{size_bytes >> 20}MiB.bin")
    probe = Scenario(path=path, **scenario_kwargs)
    marked = probe.steps * probe.micro_batch_size * world_size
    sparse_token_file(
        path, size_bytes, block_size=probe.block_size, seed=probe.seed, marked_samples=marked
    )
    return probe


if __name__ == "__main__":
    main()
