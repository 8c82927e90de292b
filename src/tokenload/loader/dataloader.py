"""One entry point that serves the global order to this rank: ``build_dataloader``.

It takes a dataset that implements ``contract.LoaderDataset`` (every tokenload dataset), or a
plain map-style one, wrapped once here (``mapstyle.py``), and wires a batch sampler
(``sampler.py``) to the dataset's vectorized ``__getitems__``, read in
the training process (``num_workers=0``) or by worker processes (``workers.py``) that make
micro-batches ahead and hand them over through shared slots (``ring.py``); batches are dicts of
tensors either way, in the same order. The returned ``TokenloadDataLoader`` counts the
micro-batches it has handed to the training loop (not those made ahead by workers), so
``state_dict()`` is exact at any step; ``load_state_dict()`` checks the fingerprint and restarts
the order at the saved ``consumed_samples``, with the single sampler also on another data-parallel
size (the cyclic sampler's order depends on the topology, so it refuses another one). For a
computed blend (``datasets.computed``) under the single sampler the state also records every
source's cursor (``"mixture"``), and loading it into a blend of other weights, or with sources
added or removed, continues every source where it stopped: the fingerprint covers the sources'
identities, not the weights, and another set of sources is accepted for such a blend only (a
Megatron-order blend of other weights still refuses the state). It follows
torchdata's StatefulDataLoader protocol (``state_dict``/``load_state_dict``), so Lightning and
plain torch checkpoints store it as a small dict.

``metrics()`` reports startup, per-step data wait (the time the training loop spent in
``__next__``) and what was served per source (``accounting.py``); the counters travel in the
state dict's ``"metrics"`` entry, so they continue across a resume.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import logging
import math
import operator
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..contract import LoaderDataset
from ..distributed import World
from ..errors import ConfigError, ForeignStateError, StateError, require
from ..fielddocs import FieldDocs, documented
from ..storage.options import read_retry_window, retry_reads_for
from .accounting import LoaderMetrics, summary_line
from .collate import PACKING_COUNTS, fetch, to_tensors
from .health import WorkerHealth, read_budget
from .ledger import Ledger
from .mapstyle import AnyDataset, loader_dataset
from .report import MetricsReport
from .sampler import BatchSampler, CyclicSampler, MicroBatchPlan, PretrainingSampler
from .state import (
    LoaderState,
    Topology,
    continue_topologies,
    differences,
    reads,
    refusal_hint,
    restore_mixture,
    topology_history,
    weights_changes,
)
from .workers import WorkerPool

logger = logging.getLogger(__name__)


def _samples(value: Any) -> int:
    """``consumed_samples`` as an int of 0 or more (NumPy's taken, as a state must hold a plain
    int); anything else a ConfigError."""
    count = None if isinstance(value, bool) else _as_count(value)
    if count is None:
        raise ConfigError(
            f"consumed_samples is {value!r} ({type(value).__name__}); expected an int of 0 or more",
            hint="pass the samples the job has consumed (Megatron's consumed_train_samples)",
            field="consumed_samples",
        )
    return count


def _as_count(value: Any) -> int | None:
    """``value`` as a non-negative int when it is an integer of another type (NumPy's), else
    None."""
    try:
        count = operator.index(value)
    except TypeError:
        return None
    return count if count >= 0 else None


@documented
@dataclass(frozen=True, kw_only=True)
class LoaderConfig(metaclass=FieldDocs):
    """How batches are cut and delivered."""

    micro_batch_size: int
    """Samples per micro-batch on each data-parallel rank."""
    dp_rank: int | None = None
    """Data-parallel rank; None takes the global rank (no tensor/pipeline parallelism)."""
    dp_size: int | None = None
    """Data-parallel size; None takes the world size."""
    kind: str = "single"
    """"single" (Megatron's default sampler) or "cyclic" (its random sampler)."""
    data_sharding: bool = True
    """Cyclic sampler only: bucket the permutation per rank (Megatron default)."""
    drop_last: bool = True
    """Drop the last incomplete micro-batch group."""
    num_workers: int = 2
    """Worker processes that make micro-batches ahead (0 reads in the training process)."""
    pin_memory: bool = False
    """Pin batches in page-locked memory (for GPU copies)."""
    persistent_workers: bool = True
    """Keep workers alive between iterations (only with num_workers > 0)."""
    prefetch_factor: int | None = None
    """Micro-batches each worker makes ahead of the training loop (None: 4; at least 1). A worker
    reads half of them (at most 4) in one vectorized read, so more is faster (measured at S = 2048,
    micro-batch 16, 2 workers on 2 cores: 2 gives ~90k samples/s, 4 ~110k, 8 ~135k) at the cost of
    shared memory: ``prefetch_factor + 2`` batches per worker."""
    multiprocessing_context: str | None = None
    """"fork", "spawn" or "forkserver"; None uses the platform default."""
    shared_memory: bool = True
    """Workers hand batches over in reused shared-memory slots (``ring.py``); False sends them
    pickled through each worker's pipe instead (no shared memory at all; slower)."""
    worker_timeout: float | None = 120.0
    """Seconds a worker may send nothing while the training loop waits for its batch before it
    is killed and replaced (a warning names it at half the time); None never replaces a live
    worker. The default stays below NCCL's 10-minute watchdog."""
    max_worker_restarts: int = 3
    """Workers this loader may replace (exited, or silent past ``worker_timeout``); the fault
    after that raises WorkerError. A replacement makes exactly the micro-batches the lost worker
    still owed: the training loop receives the same batches as without the fault."""
    log_metrics_every: int | None = None
    """Log a one-line summary of ``metrics()`` on global rank 0 every this many micro-batches
    (logging at INFO, logger ``tokenload.loader.dataloader``); None logs nothing."""

    def __post_init__(self) -> None:
        for name in ("micro_batch_size", "dp_rank", "dp_size", "num_workers", "prefetch_factor"):
            value = getattr(self, name)
            optional = name in ("dp_rank", "dp_size", "prefetch_factor")
            if (value is None and optional) or (type(value) is int and value >= 0):
                continue
            if type(value) is not bool and _as_count(value) is not None:
                object.__setattr__(self, name, _as_count(value))  # NumPy's ints, a tokenizer's
                continue
            raise ConfigError(
                f"{name} is {value!r} ({type(value).__name__}); expected an int of 0 or more"
                + (" or None" if optional else ""),
                hint=f"pass {name} as a whole number (from the job's arguments: an int, not text"
                " or a float)",
                field=name,
            )
        if self.micro_batch_size < 1:
            raise ConfigError(
                f"micro_batch_size is {self.micro_batch_size}", hint="use 1 or more samples"
            )
        if self.dp_size is not None and self.dp_size < 1:
            raise ConfigError(f"dp_size is {self.dp_size}", hint="use 1 or more ranks, or None")
        if self.kind not in ("single", "cyclic"):
            raise ConfigError(
                f"kind is {self.kind!r}, expected 'single' or 'cyclic'", hint="use kind='single'"
            )
        if self.num_workers < 0:
            raise ConfigError(f"num_workers is {self.num_workers}", hint="use 0 or more workers")
        if self.prefetch_factor is not None and self.prefetch_factor < 1:
            raise ConfigError(
                f"prefetch_factor is {self.prefetch_factor}", hint="use 1 or more (or None for 4)"
            )
        if self.multiprocessing_context not in (None, "fork", "spawn", "forkserver"):
            raise ConfigError(
                f"multiprocessing_context is {self.multiprocessing_context!r}",
                hint="use 'fork', 'spawn' or 'forkserver'",
            )
        timeout = self.worker_timeout
        number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
        if timeout is not None and not (number and 0 < timeout < math.inf):
            raise ConfigError(
                f"worker_timeout is {timeout!r}",
                hint="use a positive number of seconds, or None to disable it",
            )
        restarts = self.max_worker_restarts
        if type(restarts) is not int or restarts < 0:
            raise ConfigError(
                f"max_worker_restarts is {restarts!r}", hint="use 0 or a positive count"
            )
        every = self.log_metrics_every
        if every is not None and (type(every) is not int or every < 1):
            raise ConfigError(
                f"log_metrics_every is {every!r}", hint="use a positive number of steps, or None"
            )


class TokenloadDataLoader:
    """Iterates this rank's micro-batches from ``consumed_samples`` on; resumable."""

    def __init__(
        self, dataset: AnyDataset, config: LoaderConfig, consumed_samples: int = 0
    ) -> None:
        require("torch", "torch", "tokenload's DataLoader")  # now, not at the first batch
        self.dataset = dataset
        """The dataset as given."""
        self._data: LoaderDataset = loader_dataset(dataset)  # what the loader reads through
        self._mixture = self._data.mixture_cursors()
        self._metrics = LoaderMetrics(self._data)
        world = World.detect()
        self.rank = world.rank
        self.config = config
        self.dp_rank = world.rank if config.dp_rank is None else config.dp_rank
        self.dp_size = world.world_size if config.dp_size is None else config.dp_size
        self.plan = MicroBatchPlan(
            total_samples=len(dataset),
            micro_batch_size=config.micro_batch_size,
            dp_rank=self.dp_rank,
            dp_size=self.dp_size,
            drop_last=config.drop_last,
        )
        self.consumed_samples = _samples(consumed_samples)
        # (first global sample, micro_batch_size, dp_size) of each topology the run served with
        # (state.topology_history): a loader started at consumed_samples knows its own only
        self._topologies: list[Topology] = [
            (self.consumed_samples, config.micro_batch_size, self.dp_size)
        ]
        self._pool: WorkerPool | None = None
        # the job's per-source figures and skips (ledger.py), also in metrics()["job"]
        self.ledger = self._metrics.ledger = Ledger(self._data, in_order=config.kind == "single")
        self._skip_count = 0
        self._changes: list[tuple[int, tuple[float, ...]]] = []  # set_weights: (start, weights)
        self._num_sources: int | None = None  # the blend's, asked at the first set_weights
        self._health = WorkerHealth(  # restarts are counted per loader, across its pools
            worker_timeout=config.worker_timeout,
            max_worker_restarts=config.max_worker_restarts,
            context=config.multiprocessing_context,
        )
        self._metrics.startup["loader_init_s"] = time.perf_counter() - self._metrics.created

    def make_sampler(self) -> BatchSampler:
        """The batch sampler for the current ``consumed_samples``."""
        if self.config.kind == "cyclic":
            return CyclicSampler(
                self.plan, self.consumed_samples, data_sharding=self.config.data_sharding
            )
        return PretrainingSampler(self.plan, self.consumed_samples)

    @property
    def fingerprint(self) -> str:
        """Identity of the dataset and the sampler kind (not of the topology: resume may change
        it)."""
        data = self._data.fingerprint
        kind = (
            f"{self.config.kind}:{self.config.data_sharding}"
            if self.config.kind == "cyclic"
            else "single"
        )
        if self.config.kind == "cyclic" and self._mixture is not None:
            # a computed blend's fingerprint leaves out its weights so that the single sampler
            # can change them mid-run; the cyclic order draws samples out of order: it cannot
            kind += f":{self._mixture.cyclic_key()}"
        return hashlib.sha256(f"{data}|{kind}".encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.make_sampler())

    def __iter__(self) -> Iterator[Any]:
        started = time.perf_counter()  # the first step's wait includes starting the workers
        total, step = self.plan.total_samples, self.plan.group
        cyclic = self.config.kind == "cyclic"  # counts on through epochs
        sampler = self.make_sampler()
        pin = self.config.pin_memory and _cuda_available()
        pool = None
        batches: Iterator[Any]
        if self.config.num_workers == 0:
            budget = read_budget(self.config.worker_timeout)  # as workers do (health.py)
            packed = self._metrics.packing is not None
            batches = (_fetch_within(budget, self._data, indices, packed) for indices in sampler)
        else:
            pool = self._workers()
            batches = pool.batches(sampler)
            generation = pool.generation
        metrics, every = self._metrics, self.config.log_metrics_every
        marks = (self._skip_count, len(self._changes), self._changes[-1:])
        asked, handed = started, started
        try:
            for batch in batches:
                counts = batch.pop(PACKING_COUNTS, None) if isinstance(batch, dict) else None
                batch = to_tensors(batch)
                if pin:
                    batch = {
                        k: v.pin_memory() if hasattr(v, "pin_memory") else v
                        for k, v in batch.items()
                    }
                # Counted when handed over: batches made ahead are not consumed. A last short group
                # (drop_last=False) consumes only what is left.
                self.consumed_samples += (
                    step if cyclic else min(step, total - self.consumed_samples)
                )
                now = time.perf_counter()
                metrics.record(batch, now - asked, now - handed, self.consumed_samples, counts)
                counts = None  # a view of the batch's ring slot: not held while the loop runs
                handed = now
                if every is not None and metrics.steps % every == 0:
                    self.log_metrics()
                yield batch
                # Not held while the next one is made: a batch the loop has dropped is freed first,
                # so the next one's arrays reuse its memory, still in the CPU caches (measured 18 us
                # per micro-batch of 16 x 2048 with 0 workers), and its ring slot is free again.
                del batch
                # skip() or set_weights() while iterating: go on from the new point (workers
                # drop the batches they made ahead and make them again)
                if (self._skip_count, len(self._changes), self._changes[-1:]) != marks:
                    yield from self.__iter__()
                    return
                asked = time.perf_counter()
        finally:
            # Non-persistent workers stop with their iteration, unless a newer one uses them (an
            # abandoned iterator may be collected after the next iteration started).
            if (
                pool is not None
                and not self.config.persistent_workers
                and self._pool is pool
                and pool.generation == generation
            ):
                self.close()

    def _workers(self) -> WorkerPool:
        if self._pool is None or self._pool.closed:  # a worker that died is replaced by the pool
            self.close()
            c = self.config
            self._pool = WorkerPool(
                self._data,
                num_workers=c.num_workers,
                prefetch=4 if c.prefetch_factor is None else c.prefetch_factor,
                context=c.multiprocessing_context,
                shared_memory=c.shared_memory,
                health=self._health,
            )
        return self._pool

    @property
    def worker_processes(self) -> list[Any]:
        """The worker processes of the open pool (empty when there is none)."""
        return (
            list(self._pool.processes) if self._pool is not None and not self._pool.closed else []
        )

    def skip(self, samples: int) -> None:
        """Drop the next ``samples`` global samples (e.g. the window of a loss spike): the order
        moves on without serving them, so the stream afterwards is the unskipped stream from that
        point, the same on every rank (call it on all of them). The skip is recorded in the state
        (``state["skips"]``) and in ``metrics()["job"]``, per source. Mid-iteration, batches made
        ahead are dropped and the iteration continues from the new point."""
        group, left = self.plan.group, self.plan.total_samples - self.consumed_samples
        if isinstance(samples, bool) or not isinstance(samples, int) or not 0 <= samples <= left:
            raise ConfigError(
                f"skip(samples={samples!r}); expected an int in [0, {left}] (the samples left)",
                hint="pass how many global samples (all ranks together) to drop",
            )
        if samples % group:
            raise ConfigError(
                f"skip(samples={samples}) is not a multiple of micro_batch_size * dp_size ="
                f" {group}",
                hint=f"skip a multiple of {group} samples: every rank stays on a step boundary",
            )
        if samples:
            self.ledger.skip(self.consumed_samples, samples)
            self.consumed_samples += samples
            self._skip_count += 1
            self.close()  # workers made batches ahead of the skipped point

    def set_weights(self, weights: Sequence[float]) -> None:
        """Serve the blend's sources with ``weights`` (one per source, in the blend's order, as a
        batch's ``dataset_id`` numbers them; 0 for an inactive source) from the first global
        sample the training loop has not received yet (``consumed_samples``) on. Call it on
        every rank between the same two steps with the same weights (e.g. computed from
        all-reduced losses); the loader adds no collective. It is a weights-schedule entry
        appended at that sample, replacing the schedule's entries from there: the stream is the
        one of a ``weights_schedule`` that declares the same changes up front, it is recorded in
        the state (``state["weights_changes"]``), and a resume on any data-parallel size,
        micro-batch size or worker count continues it bit-exactly. Micro-batches the workers
        made ahead are made again; called after the last sample it changes nothing.
        ``ConfigError``, before anything changes, for a wrong
        number of weights, a negative, NaN or infinite one, all zeros, or a dataset whose
        weights cannot change (what to build instead)."""
        mixture = self._steerable()
        if self._num_sources is None:
            self._num_sources = len(self._data.describe_sources().members)
        checked = _check_weights(weights, self._num_sources)
        start = self.consumed_samples
        if start >= self.plan.total_samples:  # after the last step: nothing left to serve
            return
        same = mixture.change_weights(start, checked)
        self._changes = [c for c in self._changes if c[0] < start] + [(start, checked)]
        if self._pool is not None and not self._pool.closed:
            if same:
                self._pool.change_weights(start, checked)
            else:
                self.close()  # the blend rebuilt a source: workers start again from it

    def _steerable(self) -> Any:
        """The blend's ``MixtureCursors``, or a ``ConfigError`` saying what to build instead."""
        if self._mixture is None:
            if self._data.blend_index() is not None:  # Megatron's own blend, fixed weights
                raise ConfigError(
                    "set_weights on a Megatron-order blend built with mixture_change='refuse':"
                    " its weights are fixed (Megatron's blending arrays)",
                    hint="build it with MegatronDataConfig(mixture_change='continue'),"
                    " or use order='computed'",
                    field="mixture_change",
                )
            raise ConfigError(
                f"set_weights needs a blend of several sources; this loader's dataset is a"
                f" {type(self.dataset).__name__} with fixed sources",
                hint="build a blend (blend=[w1, prefix1, w2, prefix2, ...]) with order='computed',"
                " or with Megatron's order and mixture_change='continue'",
            )
        if self.config.kind != "single":
            raise ConfigError(
                "set_weights with kind='cyclic': the cyclic sampler draws samples out of order,"
                " so a blend's weights cannot change from a point of the run",
                hint="use kind='single' (Megatron's default sampler)",
            )
        return self._mixture

    def restart(self, consumed_samples: int = 0) -> None:
        """Start the next iteration at ``consumed_samples`` (e.g. 0 for every validation pass)."""
        self.consumed_samples = _samples(consumed_samples)

    def close(self) -> None:
        """Stop the worker processes now (they restart on the next iteration). Without it,
        persistent workers stop when the loader is garbage-collected."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @property
    def _iterator(self) -> WorkerPool | None:
        """What torch's DataLoader calls its iterator: frameworks that tear a loader down by
        setting ``loader._iterator = None`` (Lightning does) stop our workers that way too."""
        return self._pool

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        if value is None:
            self.close()

    def metrics(self) -> MetricsReport:
        """Startup, data wait and what was served, per source (see ``accounting.py``): counted by
        this process since the start of the run, continued across a resume. A plain dict, whose
        keys ``report.MetricsReport`` describes."""
        total = self.plan.total_samples
        if self.config.kind == "cyclic":  # its epochs hold only whole groups
            total -= total % self.plan.group
        epoch = self.consumed_samples // total
        out = self._metrics.as_dict(consumed=self.consumed_samples, epoch=epoch)
        # workers replaced, stalls detected, time the loop lost waiting for them (health.py)
        return {**out, "workers": self._health.as_dict()}

    def log_metrics(self, level: int = logging.INFO) -> None:
        """Log a one-line summary of ``metrics()`` (on global rank 0 only)."""
        if self.rank == 0 and logger.isEnabledFor(level):
            logger.log(level, "%s", summary_line(self.metrics()))

    def state_dict(self) -> dict[str, Any]:
        state = LoaderState(
            consumed_samples=self.consumed_samples,
            fingerprint=self.fingerprint,
            micro_batch_size=self.config.micro_batch_size,
            dp_size=self.dp_size,
        ).to_dict()
        state["metrics"] = self._metrics.state_dict()
        state["skips"] = self.ledger.state_dict()
        state["accounting"] = self.ledger.as_dict(self.consumed_samples)
        state["topologies"] = [list(t) for t in self._topologies]
        described = reads(self.dataset)
        if described is not None:  # what a refusal of this state then names
            state["reads"] = described
        if self._mixture is not None and self._mixture_resumable:
            state["mixture"] = self._mixture.mixture_state(self.consumed_samples)
            state["weights_changes"] = [[start, list(w)] for start, w in self._changes]
        return state

    @property
    def _mixture_resumable(self) -> bool:
        """A computed blend under the single sampler: its state holds every source's cursor, and
        a state resumes into a blend of other weights or sources (``resume_mixture``)."""
        return self.config.kind == "single" and self._mixture is not None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved ``consumed_samples``, with the saved metrics counters (a state
        without them, from an older tokenload, keeps this loader's) and the saved topology
        history, this loader's micro-batch size and data-parallel size added from there when they
        differ (``state.topology_history``)."""
        loaded = LoaderState.from_dict(state)
        mixture = state.get("mixture") if self._mixture_resumable else None
        try:
            self._load_state(loaded, state, mixture)
        except ForeignStateError as exc:  # saved for other data or another order: say what this is
            diff = differences(state.get("reads"), reads(self.dataset))
            raise ForeignStateError(exc.message + diff, hint=refusal_hint(self.dataset)) from None

    def _load_state(self, loaded: LoaderState, state: dict[str, Any], mixture: Any) -> None:
        if mixture is None:
            loaded.check(self.fingerprint)
        if self.config.kind == "cyclic":
            loaded.check_topology(
                micro_batch_size=self.config.micro_batch_size, dp_size=self.dp_size
            )
        elif loaded.consumed_samples > self.plan.total_samples:  # cyclic: counts on through epochs
            raise StateError(
                f"loader state consumed_samples {loaded.consumed_samples} is past the end of this"
                f" loader's order of {self.plan.total_samples} samples",
                hint="pass the state saved for this dataset, unchanged (a state from another"
                " dataset size has another fingerprint)",
            )
        history = topology_history(state)
        last, mbs, dp = history[-1]
        # a run on this topology that began between its groups (a loader started at any
        # consumed_samples, as Megatron's sampler starts) continues on it where it stopped
        continuing = (mbs, dp) == (self.config.micro_batch_size, self.dp_size) and not (
            (loaded.consumed_samples - last) % self.plan.group
        )
        if loaded.consumed_samples % self.plan.group and not continuing:
            raise StateError(
                f"consumed_samples {loaded.consumed_samples} is not a multiple of micro_batch_size"
                f" * dp_size = {self.plan.group}, so this topology cannot continue exactly where"
                " the run stopped",
                hint="resume at a global-batch boundary, or choose sizes whose product divides the"
                " global batch",
            )
        topologies = continue_topologies(
            history,
            loaded.consumed_samples,
            self.config.micro_batch_size,
            self.dp_size,
        )
        changes = weights_changes(state) if mixture is not None else []
        changed = "same"
        if mixture is not None and self._mixture is not None:
            if isinstance(mixture, dict) and mixture.get("consumed") != loaded.consumed_samples:
                raise StateError(
                    "the loader state's mixture was saved after"
                    f" {mixture.get('consumed')!r} samples, its consumed_samples is"
                    f" {loaded.consumed_samples}",
                    hint="pass the dict saved from loader.state_dict(), unchanged",
                )
            # the saved run's set_weights (this loader's own undone first), then its chain
            undo = self._changes[0][0] if self._changes else None
            changed = restore_mixture(self._mixture, state, changes, undo)
            self._changes = changes
            self.close()  # workers hold the dataset as it was: the next iteration starts new ones
        if "metrics" in state and changed != "sources":
            self._metrics.load_state_dict(state["metrics"])
        elif "metrics" in state:
            logger.info(
                "the blend's sources changed: the loader's per-source metrics start from zero"
            )
        self.ledger.load_state_dict(state.get("skips") or [], state.get("accounting"))
        self.consumed_samples = loaded.consumed_samples
        self._topologies = topologies


def _check_weights(weights: Any, count: int) -> tuple[float, ...]:
    """``weights`` as floats: ``count`` of them, finite, >= 0, not all 0; else ``ConfigError``."""
    hint = f"pass {count} finite weights >= 0, one per source of the blend, at least one positive"
    try:
        values = tuple(float(w) for w in weights)
    except (TypeError, ValueError):
        raise ConfigError(
            f"set_weights({weights!r}); expected a sequence of {count} numbers", hint=hint
        ) from None
    if len(values) != count:
        raise ConfigError(
            f"set_weights got {len(values)} weights; the blend has {count} sources", hint=hint
        )
    if not all(math.isfinite(w) and w >= 0 for w in values) or not any(values):
        raise ConfigError(
            f"set_weights({list(values)}); expected finite weights >= 0, not all 0", hint=hint
        )
    return values


def _cuda_available() -> bool:
    """Pinning needs a CUDA device (torch's DataLoader likewise skips it without one)."""
    import torch

    return bool(torch.cuda.is_available())  # torch is Any to mypy (not analysed)


class _Default(enum.Enum):
    """A ``build_dataloader`` keyword not given: ``config``'s value, else ``LoaderConfig``'s."""

    DEFAULT = "default"

    def __repr__(self) -> str:
        return "<default>"


_DEFAULT = _Default.DEFAULT
_OPTIONS = frozenset(f.name for f in dataclasses.fields(LoaderConfig))


def build_dataloader(
    dataset: AnyDataset,
    config: LoaderConfig | None = None,
    *,
    consumed_samples: int = 0,
    micro_batch_size: int | _Default = _DEFAULT,
    dp_rank: int | _Default | None = _DEFAULT,
    dp_size: int | _Default | None = _DEFAULT,
    kind: str | _Default = _DEFAULT,
    data_sharding: bool | _Default = _DEFAULT,
    drop_last: bool | _Default = _DEFAULT,
    num_workers: int | _Default = _DEFAULT,
    pin_memory: bool | _Default = _DEFAULT,
    persistent_workers: bool | _Default = _DEFAULT,
    prefetch_factor: int | _Default | None = _DEFAULT,
    multiprocessing_context: str | _Default | None = _DEFAULT,
    shared_memory: bool | _Default = _DEFAULT,
    worker_timeout: float | _Default | None = _DEFAULT,
    max_worker_restarts: int | _Default = _DEFAULT,
    log_metrics_every: int | _Default | None = _DEFAULT,
) -> TokenloadDataLoader:
    """A resumable DataLoader over ``dataset`` for this rank. ``dataset``: a tokenload dataset
    (any ``contract.LoaderDataset``), or a map-style one (``__len__`` with ``__getitems__`` or
    ``__getitem__``). The options are ``LoaderConfig``'s fields (see there), given as ``config``,
    as keywords, or both (a keyword replaces ``config``'s field); an option given neither way
    takes ``LoaderConfig``'s default, and ``micro_batch_size`` has none. Each keyword is typed, so
    a type checker finds a misspelt one (Python raises ``TypeError`` for it); a bad value is a
    ``ConfigError``."""
    given = {k: v for k, v in locals().items() if k in _OPTIONS and v is not _DEFAULT}
    if config is None:
        if "micro_batch_size" not in given:
            raise ConfigError(
                "build_dataloader got no micro_batch_size (samples per micro-batch on each"
                " data-parallel rank)",
                hint="pass micro_batch_size=N, or config=LoaderConfig(micro_batch_size=N, ...)",
            )
        config = LoaderConfig(**given)
    elif not isinstance(config, LoaderConfig):
        raise ConfigError(
            f"build_dataloader's config is a {type(config).__name__}, expected a LoaderConfig"
            " or None",
            hint="pass the options as keywords (micro_batch_size=..., num_workers=...) or as"
            " config=LoaderConfig(...)",
        )
    elif given:
        config = dataclasses.replace(config, **given)
    return TokenloadDataLoader(dataset, config, consumed_samples=consumed_samples)


def _fetch_within(
    budget: float | None, dataset: LoaderDataset, indices: Sequence[int], packed: bool
) -> Any:
    """``fetch`` with object-storage reads retried for ``budget`` seconds, in this process only
    while the loader reads: the rest of the training process keeps its own retry setting."""
    before = read_retry_window()
    retry_reads_for(budget)
    try:
        return fetch(dataset, indices, packed=packed)
    finally:
        retry_reads_for(before)
