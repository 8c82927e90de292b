"""The doctor's measuring tools, each usable on its own: opens and stats of a block
(``count_io``), the slow-storage rehearsal (``SlowReads``, ``READ_DELAY_ENV``), the loader's
samples/s and per-step data wait (``loader_rate``), random-window read rates per read mode
(``window_read_rate``) and a token file's content digest (``content_digest``).

Kept apart from the checks (``checks.py``), which judge what these measure against thresholds.

``READ_DELAY_ENV`` (``TOKENLOAD_DOCTOR_READ_DELAY_MS``) is a rehearsal hook: every batch read of
the doctor's loaders on the data then sleeps that long first, as on slow storage, so that the
steady-state findings can be seen (and tested) on a fast disk.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from ..errors import ConfigError
from .report import DoctorConfig

if TYPE_CHECKING:
    from ..loader.report import WorkersReport

READ_DELAY_ENV = "TOKENLOAD_DOCTOR_READ_DELAY_MS"
#: Files up to this size are digested whole; larger ones by sampled chunks.
FULL_DIGEST_BYTES = 1 << 30
_CHUNK = 1 << 20


# -- measuring opens and stats ---------------------------------------------------------------------
class _IOCount:
    opens = 0
    stats = 0
    active = False
    hooked = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _IOCount.active and event == "open":
        _IOCount.opens += 1


@contextmanager
def count_io() -> Iterator[type[_IOCount]]:
    """Count opens (audit hook) and ``os.stat`` calls made inside the block, in this process."""
    if not _IOCount.hooked:
        sys.addaudithook(_audit)  # permanent by design; counts only while active
        _IOCount.hooked = True
    real_stat = os.stat

    def stat(*args: Any, **kwargs: Any) -> os.stat_result:
        _IOCount.stats += 1
        return real_stat(*args, **kwargs)

    _IOCount.opens = _IOCount.stats = 0
    _IOCount.active, os.stat = True, stat
    try:
        yield _IOCount
    finally:
        _IOCount.active, os.stat = False, real_stat


# -- the slow-storage rehearsal --------------------------------------------------------------------
class SlowReads:
    """A dataset whose batch reads sleep ``delay_s`` first (``READ_DELAY_ENV``)."""

    def __init__(self, dataset: Any, delay_s: float) -> None:
        self.dataset, self.delay_s = dataset, delay_s

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Any) -> Any:
        time.sleep(self.delay_s)
        return self.dataset.__getitems__(indices)

    def read_batch(self, indices: Any) -> Any:
        time.sleep(self.delay_s)
        return self.dataset.read_batch(indices)

    def finish_batch(self, raw: Any, alloc: Any) -> Any:
        return self.dataset.finish_batch(raw, alloc)

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # unpickling: not set yet
            raise AttributeError(name)
        return getattr(self.dataset, name)


def read_delay() -> float:
    """Seconds each batch read sleeps in the rehearsal (``READ_DELAY_ENV``; 0: none)."""
    text = os.environ.get(READ_DELAY_ENV)
    if not text:
        return 0.0
    try:
        return max(float(text), 0.0) / 1e3
    except ValueError:
        raise ConfigError(
            f"{READ_DELAY_ENV} is {text!r}, expected milliseconds",
            hint=f"unset {READ_DELAY_ENV} or give a number",
        ) from None


def loader_rate(
    dataset: Any,
    config: DoctorConfig,
    workers: int = 0,
    step_s: float = 0.0,
    health: list[WorkersReport] | None = None,
) -> tuple[float, list[float]]:
    """(samples/s of the training loop, the data wait of each step) over ``config.steps`` steps;
    ``health`` receives the loader's ``metrics()["workers"]`` (workers replaced, stalls)."""
    from ..loader import build_dataloader

    loader = build_dataloader(
        dataset, micro_batch_size=config.micro_batch_size, num_workers=workers, dp_rank=0, dp_size=1
    )
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
        if health is not None:
            health.append(loader.metrics()["workers"])
        loader.close()
    served = (len(waits) - 1) * config.micro_batch_size
    return (served / elapsed if elapsed > 0 and served > 0 else 0.0), waits


def window_read_rate(
    prefix: str, mode: str, window: int, reads: int = 64, batch: int = 8, seed: int = 0
) -> float:
    """Training windows per second read at random places of ``prefix``'s ``.bin`` in ``mode``
    (the places drawn with ``seed``)."""
    from ..format import TokenFile

    source = TokenFile(prefix, mode=mode)
    total = source.num_tokens
    if total <= window:
        return math.inf
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, total - window, size=reads, dtype=np.int64)
    lengths = np.full(batch, window, dtype=np.int64)
    source.read_spans(starts[:1], lengths[:1])  # open (and map) outside the timing
    start = time.perf_counter()
    for i in range(0, reads, batch):
        source.read_spans(starts[i : i + batch], lengths[: len(starts[i : i + batch])])
    seconds = time.perf_counter() - start
    source.close()
    return reads / seconds if seconds > 0 else math.inf


# -- files -----------------------------------------------------------------------------------------
def file_size(path: str) -> int:
    """``path``'s size in bytes, 0 when it cannot be read (a missing copy is judged elsewhere)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def content_digest(prefix: str) -> str:
    """xxh3-128 of a token file's ``.idx`` and ``.bin`` (sampled chunks past 1 GiB)."""
    h = xxhash.xxh3_128()
    for path in (prefix + ".idx", prefix + ".bin"):
        size = file_size(path)
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
