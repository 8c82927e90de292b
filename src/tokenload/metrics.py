"""Counters and timings that stay small in long runs, exported as plain dicts.

``DurationHistogram`` keeps durations in log-spaced bins (8 per octave, 1 us to about 12 days):
memory is a fixed list of 320 counts whatever the number of steps, adding is O(1) (one log2), two
histograms merge by adding counts, and a state dict is a few sparse integers. A quantile is the
geometric middle of its bin, so it is within about 4.4% of the exact value (clamped to the
observed min and max); count, total, mean, min and max are exact.

``Phases`` records named startup phases (seconds each, in order) for whatever builds data: the
dataset builder can attach one to the datasets it returns, and the loader reports it as part of
its startup.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from .errors import StateError

_PER_OCTAVE = 8
_LOWEST_S = 1e-6
_BINS = 40 * _PER_OCTAVE  # 1 us * 2**40: about 12 days, past any step
_QUANTILES = {"p50_s": 0.50, "p90_s": 0.90, "p99_s": 0.99}


class DurationHistogram:
    """Durations in seconds, summarized with bounded memory."""

    def __init__(self) -> None:
        self.counts = [0] * _BINS
        self.count = 0
        self.total = 0.0
        self.low = math.inf
        self.high = 0.0

    def add(self, seconds: float) -> None:
        """Record one duration (negative ones, from a clock step, count as 0)."""
        seconds = max(seconds, 0.0)
        if seconds <= _LOWEST_S:
            b = 0
        else:
            b = min(int(math.log2(seconds / _LOWEST_S) * _PER_OCTAVE), _BINS - 1)
        self.counts[b] += 1
        self.count += 1
        self.total += seconds
        if seconds > self.high:
            self.high = seconds
        if seconds < self.low:
            self.low = seconds

    def quantile(self, q: float) -> float | None:
        """The duration below which a fraction ``q`` of them lie (None when empty)."""
        if not self.count:
            return None
        rank = q * self.count
        seen = 0
        for b, n in enumerate(self.counts):
            seen += n
            if n and seen >= rank:
                middle: float = _LOWEST_S * 2.0 ** ((b + 0.5) / _PER_OCTAVE)
                return min(max(middle, self.low), self.high)
        return self.high

    def summary(self) -> dict[str, Any]:
        """count, total_s, mean_s, min_s, p50_s, p90_s, p99_s and max_s (None when empty)."""
        empty = not self.count
        out: dict[str, Any] = {
            "count": self.count,
            "total_s": self.total,
            "mean_s": None if empty else self.total / self.count,
            "min_s": None if empty else self.low,
        }
        for name, q in _QUANTILES.items():
            out[name] = self.quantile(q)
        out["max_s"] = None if empty else self.high
        return out

    def state_dict(self) -> dict[str, Any]:
        """Counts by bin (only non-zero bins), plus the exact sums."""
        return {
            "bins": {str(b): n for b, n in enumerate(self.counts) if n},
            "count": self.count,
            "total_s": self.total,
            "min_s": None if not self.count else self.low,
            "max_s": self.high,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from ``state_dict()``; StateError when it is malformed."""
        try:
            counts = [0] * _BINS
            for b, n in state["bins"].items():
                counts[int(b)] = _natural(n)
            count = _natural(state["count"])
            total, high = float(state["total_s"]), float(state["max_s"])
            low = math.inf if state["min_s"] is None else float(state["min_s"])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise StateError(
                f"loader metrics hold a malformed duration histogram ({exc!r})",
                hint="pass the dict saved from loader.state_dict(), unchanged",
            ) from None
        if sum(counts) != count:
            raise StateError(
                f"loader metrics histogram counts sum to {sum(counts)}, expected its count {count}",
                hint="pass the dict saved from loader.state_dict(), unchanged",
            )
        self.counts, self.count, self.total, self.low, self.high = counts, count, total, low, high


class Phases:
    """Named phases of a startup, timed in the order they ran (a phase run twice adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def measure(self, name: str) -> Iterator[None]:
        """Time the ``with`` block as phase ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def as_dict(self) -> dict[str, float]:
        return dict(self.seconds)


def _natural(value: Any) -> int:
    """``value`` as an int >= 0 (bools and strings are refused, not converted)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value
