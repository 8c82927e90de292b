"""The Ray executor of preprocess (``RayExecutor``): one Ray task per input file and per byte
range of a large file.

The driver (the process that called ``preprocess``) plans the parts, submits them as Ray tasks,
at most ``ray_tasks_in_flight`` at a time, and commits each input file once all its parts are
done; the final outputs are then the parts concatenated in input order: the same bytes as the
local executor, which writes each token once straight into the outputs (``outputs``), so the
bytes do not depend on the executor, the cluster, the worker count or the cut.
What travels: a task's arguments are a small ``PartTask`` (path, byte range, work folder) and
the tokenizer's files as bytes, put in the object store once and loaded once per worker process;
a task reads its own bytes from the path and returns counts, so the object store never holds
input text or tokens. Each task publishes its part files atomically and then its marker, so
Ray's retry of a task whose worker died rewrites the same bytes, and a rerun after a killed
driver reuses every finished part (see ``workdir``). Trade-off: every part is a file in the
work folder, which must be on a filesystem that every node and the driver see, or, for an
``s3://`` output, objects under a work prefix in the bucket (each task uploads its part and then
its marker; the driver downloads the parts one at a time to concatenate them, then publishes).

Live progress: tasks report their running byte/token counts to a small actor; the driver shows
finished counts plus the live ones, so the bar moves during long tasks, over the whole cluster.
This module is the driver; what runs inside the tasks (their body, the actor, the tokenizer's
files unpacked on each node) is ``ray_worker``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..errors import ConfigError, RecordError, StorageError, require
from .config import PreprocessConfig
from .encode import EncodeTask
from .executor import Executor
from .inputs import InputFile
from .parts import PartResult, PartTask
from .progress import Progress
from .ray_worker import _run_part, _Tally, tokenizer_files
from .records import BadRecord
from .sources import byte_ranges
from .summaries import FileSummary, PartSummary, RangeSummary
from .workdir import WorkFolder, range_stem

log = logging.getLogger(__name__)
skip_log = logging.getLogger(__name__.rsplit(".", 1)[0] + ".pipeline.skipped")
_TICK_SECONDS = 0.5
#: Ray reruns a task whose worker process died this many times before the run fails.
MAX_RETRIES = 3


def require_ray() -> ModuleType:
    """The ray module, or MissingExtraError naming tokenload[ray]."""
    return require("ray", "ray", "preprocess with `executor='ray'`")


def connect(ray: Any, config: PreprocessConfig) -> bool:
    """Join the cluster ``config`` or RAY_ADDRESS names, else start a local one of ``workers``
    CPUs; True when this call started the connection (and so must end it)."""
    if ray.is_initialized():
        return False
    address = config.ray_address or os.environ.get("RAY_ADDRESS") or None
    options: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
        "runtime_env": {"env_vars": storage_environment()},
    }
    try:
        if address:
            ray.init(address=address, **options)
        else:
            ray.init(address="local", num_cpus=config.workers, **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"cannot join the Ray cluster at {address!r} ({_first_line(exc)})",
            hint="check `ray_address=` / RAY_ADDRESS (e.g. HEAD_IP:6379, as `ray start --head`"
            " prints) and that `ray status` works from this machine; leave both unset for a local"
            " cluster",
        ) from None
    return True


def _first_line(exc: BaseException) -> str:
    """An exception's first line, or its type's name when it has no text."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def storage_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's object-storage settings (AWS_*, FSSPEC_*, TOKENLOAD_RETRIES and its backoff),
    passed to the tasks so that they read ``s3://`` inputs and write parts under an ``s3://`` work
    prefix on the same endpoint, with the same credentials and retries as the driver."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k.startswith(_FORWARDED)}


_FORWARDED = (
    "AWS_",
    "FSSPEC_",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AZURE_STORAGE_",
    "TOKENLOAD_RETR",
)


# -- the driver -----------------------------------------------------------------------------------
@dataclass
class _FilePlan:
    """One input file still to do: its byte ranges and what each has reported."""

    index: int
    file: InputFile
    spans: list[tuple[int, int]]
    done: dict[int, PartSummary | None] = field(default_factory=dict)
    """What each finished range (or the whole file, number 0) wrote; None: a damaged range."""
    damaged: str | None = None
    examples: list[tuple[int, BadRecord]] = field(default_factory=list)

    @property
    def ranged(self) -> bool:
        return self.spans[0][1] >= 0

    def line_offset(self, k: int) -> int:
        return sum(_lines(self.done.get(j)) for j in range(k))


def _lines(done: PartSummary | None) -> int:
    """Lines of the file up to a finished range's end (0 for a whole file or a damaged range)."""
    return done.lines if isinstance(done, RangeSummary) else 0


class RayExecutor(Executor):
    """Tasks on a Ray cluster (``config.executor == "ray"``): joins the cluster ``config`` names
    (or starts a local one, ended after the run) and drives the tasks (see the module docstring)."""

    def __init__(self, config: PreprocessConfig, encode: EncodeTask) -> None:
        self.config, self.encode = config, encode

    def run(
        self, work: WorkFolder, todo: Sequence[tuple[int, InputFile]], bar: Progress
    ) -> dict[int, FileSummary]:
        ray = require_ray()
        started = connect(ray, self.config)
        try:
            driver = _Driver(ray, self.config, self.encode, work, todo, bar)
            driver.run()
            return driver.summaries
        finally:
            if started:
                ray.shutdown()


class _Driver:
    def __init__(
        self,
        ray: Any,
        config: PreprocessConfig,
        encode: EncodeTask,
        work: WorkFolder,
        todo: Sequence[tuple[int, InputFile]],
        bar: Progress,
    ) -> None:
        self.ray, self.config, self.encode, self.work = ray, config, encode, work
        self.bar = bar
        self.summaries: dict[int, FileSummary] = {}
        self.plans = {i: _FilePlan(i, f, byte_ranges(f, config.range_bytes)) for i, f in todo}
        self.queue: list[tuple[int, int]] = []
        for plan in self.plans.values():
            for k, span in enumerate(plan.spans):
                done = (
                    work.range_finished(plan.index, k, plan.file, span, config.json_keys)
                    if plan.ranged
                    else None
                )
                if done is not None:
                    plan.done[k] = done
                else:
                    self.queue.append((plan.index, k))
        self.queue.reverse()  # popped from the end, in input order
        self.errors: list[tuple[tuple[int, int], Exception | BadRecord]] = []
        self._shown = 0.0

    def run(self) -> None:
        ray = self.ray
        for plan in list(self.plans.values()):
            if len(plan.done) == len(plan.spans):
                self._commit(plan)
        if not self.queue:
            return
        task_fn = ray.remote(num_cpus=self.config.ray_cpus_per_task, max_retries=MAX_RETRIES)(
            _run_part
        )
        tally = [ray.remote(num_cpus=0)(_Tally).remote()]
        files = (
            tokenizer_files(self.encode.tokenizer) if self.encode.tokenizer.kind != "byte" else {}
        )
        shipped = [ray.put(files)]
        limit = self.config.ray_tasks_in_flight or self._default_in_flight()
        ranged = [p for p in self.plans.values() if p.ranged]
        log.info(
            "ray: %d task(s) for %d input file(s) (%d split into %d byte ranges),"
            " at most %d in flight",
            len(self.queue),
            len(self.plans),
            len(ranged),
            sum(len(p.spans) for p in ranged),
            limit,
        )
        pending: dict[Any, tuple[int, int]] = {}
        try:
            while pending or (self.queue and not self.errors):
                while self.queue and len(pending) < limit and not self.errors:
                    index, k = self.queue.pop()
                    pending[task_fn.remote(self._task(index, k), shipped, tally)] = (index, k)
                ready = self._wait(pending, tally)
                if not ready:
                    continue
                finished = []
                for ref in ready:
                    where = pending.pop(ref)
                    finished.append(f"{where[0]}.{where[1]}")
                    self._take(where, self._result(ref, where))
                if tally:
                    tally[0].forget.remote(finished)
                if self.errors:
                    self._cancel_after(pending)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        if self.errors:
            raise self._first_error()

    def _wait(self, pending: dict[Any, tuple[int, int]], tally: list[Any]) -> list[Any]:
        """The finished tasks: waits for one (at most a tick), then takes every other finished
        one; shows the live counts about every tick."""
        ray = self.ray
        refs = list(pending)
        ready: list[Any]
        ready, rest = ray.wait(refs, num_returns=1, timeout=_TICK_SECONDS)
        if ready and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        if time.monotonic() - self._shown >= _TICK_SECONDS:
            self._show_live(tally)
            self._shown = time.monotonic()
        return ready

    def _default_in_flight(self) -> int:
        cpus = self.ray.cluster_resources().get("CPU", 1)
        return max(1, int(2 * cpus / self.config.ray_cpus_per_task))

    def _task(self, index: int, k: int) -> PartTask:
        plan = self.plans[index]
        return PartTask(
            index=index,
            k=k,
            file=plan.file,
            span=plan.spans[k],
            root=self.work.location,
            stem=range_stem(index, k) if plan.ranged else f"{index:06d}",
            encode=self.encode,
            chunk_bytes=self.config.chunk_bytes,
        )

    def _result(self, ref: Any, where: tuple[int, int]) -> PartResult | None:
        try:
            result: PartResult | None = self.ray.get(ref)
            return result
        except self.ray.exceptions.TaskCancelledError:
            return None
        except self.ray.exceptions.RayError as exc:
            path = self.plans[where[0]].file.path
            self.errors.append(
                (
                    where,
                    StorageError(
                        f"a Ray task failed {MAX_RETRIES + 1} times ({type(exc).__name__}:"
                        f" {str(exc).strip().splitlines()[0] if str(exc).strip() else ''})",
                        path=path,
                        hint="check the cluster (`ray status`, node memory and disks); rerun"
                        " the same command: finished parts are kept",
                    ),
                )
            )
            return None

    def _take(self, where: tuple[int, int], result: PartResult | None) -> None:
        """Record one finished task; commit its file when every range is in."""
        if result is None:
            return
        plan = self.plans[where[0]]
        error = result.failure if result.failure is not None else result.error
        if error is not None:
            self.errors.append((where, error))
            return
        if result.summary is None:  # damaged: strict, or a byte range (the file decides)
            plan.damaged = result.damaged
            if self.encode.strict:
                self.errors.append((where, _damaged_error(plan)))
                return
            plan.done[where[1]] = None
        else:
            plan.done[where[1]] = result.summary
            if result.damaged is not None:  # a whole file, skip mode: committed empty
                skip_log.warning("skipped %s: unreadable: %s", plan.file.path, result.damaged)
        self.bar.add(
            documents=result.summary.documents if result.summary else 0,
            tokens=result.tokens,
            input_bytes=result.input_bytes,
        )
        plan.examples.extend((where[1], e) for e in result.examples)
        if len(plan.done) == len(plan.spans):
            self._commit(plan)

    def _first_error(self) -> Exception:
        """The error first in input order, a bad record with its line in the file (every earlier
        range has finished by now, so its line offset is known)."""
        (index, k), error = min(self.errors, key=lambda e: e[0])
        if isinstance(error, BadRecord):
            return error.shifted(self.plans[index].line_offset(k)).error()
        return error

    def _commit(self, plan: _FilePlan) -> None:
        """All parts of the file are in: log its skipped records with file line numbers, write
        its ``.done`` (ranged files; a whole file's task wrote its own) and count it."""
        for k, example in sorted(plan.examples, key=lambda e: (e[0], e[1].line)):
            skip_log.warning("skipped %s", example.shifted(plan.line_offset(k)))
        if not plan.ranged:
            whole = plan.done[0]
            assert isinstance(whole, FileSummary)  # a whole file's task made and marked it
            self.summaries[plan.index] = whole
        else:
            self.summaries[plan.index] = summary = _file_summary(plan, self.config.json_keys)
            if plan.damaged is not None:
                skip_log.warning("skipped %s: unreadable: %s", plan.file.path, plan.damaged)
            self.work.commit(plan.index, summary)
        self.bar.file_done()

    def _cancel_after(self, pending: dict[Any, tuple[int, int]]) -> None:
        """After an error: cancel the tasks later in input order than it (earlier ones finish,
        so the error reported is the first in input order, as with one machine)."""
        first = min(e[0] for e in self.errors)
        for ref, where in pending.items():
            if where > first:
                self.ray.cancel(ref)

    def _show_live(self, tally: list[Any]) -> None:
        """Best effort: the bar still counts every finished task if the actor is unavailable
        (seen under load on 2 cores: an actor cancelled before it started)."""
        if not tally:
            return
        try:
            live = self.ray.get(tally[0].total.remote(), timeout=_TICK_SECONDS)
        except self.ray.exceptions.GetTimeoutError:
            return
        except self.ray.exceptions.RayError as exc:
            log.debug("live progress off: %s", str(exc).splitlines()[0])
            tally.clear()
            return
        self.bar.live(*live)


def _file_summary(plan: _FilePlan, keys: tuple[str, ...]) -> FileSummary:
    """The ``.done`` summary of a file done in byte ranges: sums, and its parts in order."""
    if plan.damaged is not None:  # skip mode: the file counts as one unreadable file, no part
        return FileSummary(
            path=plan.file.path,
            stamp=plan.file.stamp,
            documents=0,
            tokens={key: 0 for key in keys},
            skipped={"unreadable_file": 1},
            parts=(),
        )
    ranges = [plan.done[k] for k in range(len(plan.spans))]
    tokens: Counter[str] = Counter({key: 0 for key in keys})
    skipped: Counter[str] = Counter()
    documents = 0
    for done in ranges:
        assert done is not None  # a damaged range marks the file damaged
        tokens.update(done.tokens)
        skipped.update(done.skipped)
        documents += done.documents
    return FileSummary(
        path=plan.file.path,
        stamp=plan.file.stamp,
        documents=documents,
        tokens=dict(tokens),
        skipped=dict(sorted(skipped.items())),
        parts=tuple(range_stem(plan.index, k) for k in range(len(plan.spans))),
    )


def _damaged_error(plan: _FilePlan) -> RecordError:
    return RecordError(
        f"cannot read the file to its end: {plan.damaged}",
        path=plan.file.path,
        hint="replace the damaged file, or pass `on_bad_record='skip'` to skip it",
    )
