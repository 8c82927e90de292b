"""A blend whose weights and sources may change mid-run, with no sample repeated or skipped.

Every source (keyed by an identity string, e.g. its prefix, split and data fingerprint) has its
own window order, ``window_order.WindowOrder`` keyed by ``source_seed(seed, identity)``, and its
own *cursor*: the number of its samples served so far, over all epochs and all mixtures. The
source's sample c is window ``order.epoch_windows(c mod n, c // n)``: when a source runs out
(c reaches a multiple of n) its next epoch starts, with a key of its own, and nothing else
changes.

A ``Mixture`` is one phase of a run: from global sample ``start`` on, ``interleave.Interleave``
decides which source serves each global sample, and the source serves its next cursor:
global sample k (k >= start) is the ``cursor = base[d] + i``-th sample of source d, where
``(d, i) = interleave(k - start)`` and ``base`` holds the cursors at ``start``. A pure function
of k: ranks and workers may split the global samples any way they like.

Changing the mixture: ``Mixture.state(consumed)`` records the cursors after ``consumed`` global
samples (a ``MixtureState``, JSON-able, kept with the loader's state); ``resume(state, ...)``
starts a new phase at ``consumed`` from those cursors, with other weights, added sources
(cursor 0) or removed ones (their cursors are carried along, so a source added back continues
too). Since each source's cursors are served in increasing order across phases, the samples of
a source are its permutations' positions 0, 1, 2, ... in turn: within an epoch none repeats and
none is skipped. The new weights hold, with the interleave's bound, from the first sample of
the new phase.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError, StateError
from .interleave import DEFAULT_PERIOD, Interleave
from .window_order import WindowOrder, _rings, keyed_windows, source_seed

__all__ = ["Draws", "Mixture", "MixtureState", "resume"]


@dataclass(frozen=True, kw_only=True)
class MixtureState:
    """Where every source stands after ``consumed`` global samples."""

    consumed: int
    """Global samples served (all ranks), the first global sample of the next phase."""
    cursors: Mapping[str, int] = field(default_factory=dict)
    """Samples served from each source identity, all epochs and phases included."""
    windows: Mapping[str, int] = field(default_factory=dict)
    """Windows per epoch of each source when its cursor was recorded (a changed source is an
    error)."""

    def to_dict(self) -> dict[str, Any]:
        sources = {s: {"cursor": c, "windows": self.windows[s]} for s, c in self.cursors.items()}
        return {"consumed": self.consumed, "sources": sources}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MixtureState:
        """The state ``to_dict`` wrote; a ``StateError`` for anything else."""
        try:
            consumed = int(data["consumed"])
            sources = {
                str(s): (int(v["cursor"]), int(v["windows"])) for s, v in data["sources"].items()
            }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(
                f"mixture state is malformed ({type(exc).__name__}: {exc}); expected consumed and"
                " sources",
                hint="pass the dictionary MixtureState.to_dict() wrote",
            ) from None
        if consumed < 0 or any(c < 0 or w < 1 for c, w in sources.values()):
            raise StateError(
                f"mixture state has a negative count or a source without windows: {dict(data)}"
            )
        cursors = {s: c for s, (c, _) in sources.items()}
        return cls(
            consumed=consumed, cursors=cursors, windows={s: w for s, (_, w) in sources.items()}
        )


class Draws(NamedTuple):
    """What global samples read: the source (index into the mixture's sources), the source's
    sample number (its cursor, all epochs) and the window of the source's split."""

    source: np.ndarray
    cursor: np.ndarray
    window: np.ndarray


class Mixture:
    """One phase of a blend: global samples ``k >= start`` -> (source, cursor, window)."""

    def __init__(
        self,
        sources: Sequence[str],
        weights: Sequence[float],
        num_windows: Sequence[int],
        *,
        seed: int,
        start: int = 0,
        state: MixtureState | None = None,
        period: int = DEFAULT_PERIOD,
        block_size: int | None = None,
        interleave: Interleave | None = None,
    ) -> None:
        self.sources = tuple(str(s) for s in sources)
        if len(set(self.sources)) != len(self.sources) or not (
            len(self.sources) == len(weights) == len(num_windows)
        ):
            raise ConfigError(
                f"{len(self.sources)} source identities ({len(set(self.sources))} distinct),"
                f" {len(weights)} weights and {len(num_windows)} window counts; expected one"
                " distinct identity, weight and count per source"
            )
        self.start = int(start)
        if interleave is None:
            interleave = Interleave(weights, period=period)
        self.interleave = interleave
        self.orders = [
            WindowOrder(int(n), source_seed(seed, s), block_size=block_size)
            for s, n in zip(self.sources, num_windows)
        ]
        prior = state or MixtureState(consumed=self.start)
        if prior.consumed != self.start:
            raise StateError(
                f"the state was saved after {prior.consumed} samples; this phase starts at"
                f" {self.start}"
            )
        for s, order in zip(self.sources, self.orders):
            if s in prior.windows and prior.windows[s] != order.num_windows:
                raise StateError(
                    f"source {s!r} had {prior.windows[s]} windows per epoch when the state was"
                    f" saved, now {order.num_windows}",
                    hint=(
                        "a source's data or sequence length changed; give it a new identity to"
                        " restart it at cursor 0"
                    ),
                )
        self.base = np.array([int(prior.cursors.get(s, 0)) for s in self.sources], dtype=np.int64)
        self._windows = np.array([o.num_windows for o in self.orders], dtype=np.int64)
        self._seeds = np.array([o.seed for o in self.orders], dtype=np.uint64)
        self.block_size = block_size
        self._rings = _rings(self._windows.astype(np.uint64))
        self.carried = {
            s: (c, prior.windows[s]) for s, c in prior.cursors.items() if s not in self.sources
        }

    def draw(self, samples: np.ndarray) -> Draws:
        """Source, cursor and window of every global sample (each ``>= start``), vectorized:
        one call of the keyed permutation for all sources and epochs (``keyed_windows`` takes a
        domain and a key per element), so the cost does not grow with the number of sources."""
        k = np.asarray(samples, dtype=np.int64).ravel()
        if k.size and int(k.min()) < self.start:
            raise IndexError(f"global samples of this phase start at {self.start}")
        return self._draw(k)

    def _draw(self, k: np.ndarray, bounds: tuple[int, int] | None = None) -> Draws:
        """``draw`` of int64 samples the caller knows to be ``>= start``; ``bounds``: their
        least and greatest, when the caller has them."""
        if bounds is None:
            source, i = self.interleave(k - self.start)
        else:
            source, i = self.interleave.lookup(
                k - self.start, bounds[0] - self.start, bounds[1] - self.start
            )
        cursor = self.base[source] + i
        if self._windows.size == 1:
            windows, seeds, rings = self._windows, self._seeds, self._rings
        else:
            windows, seeds = self._windows[source], self._seeds[source]
            rings = (self._rings[0][source], self._rings[1][source])
        epoch, position = np.divmod(cursor, windows)
        window = keyed_windows(position, epoch, windows, seeds, self.block_size, rings=rings)
        return Draws(source, cursor, window)

    def state(self, consumed: int) -> MixtureState:
        """The cursors after ``consumed`` global samples (``>= start``), for a later ``resume``."""
        if consumed < self.start:
            raise ValueError(f"consumed is {consumed}; this phase starts at {self.start}")
        now = self.base + self.interleave.consumed(consumed - self.start)
        cursors = {s: c for s, (c, _) in self.carried.items()}
        windows = {s: w for s, (_, w) in self.carried.items()}
        for s, c, order in zip(self.sources, now.tolist(), self.orders):
            cursors[s], windows[s] = c, order.num_windows
        return MixtureState(consumed=int(consumed), cursors=cursors, windows=windows)


def resume(
    state: MixtureState,
    sources: Sequence[str],
    weights: Sequence[float],
    num_windows: Sequence[int],
    *,
    seed: int,
    period: int = DEFAULT_PERIOD,
    block_size: int | None = None,
) -> Mixture:
    """A new phase from ``state.consumed`` on: every source continues at its recorded cursor."""
    return Mixture(
        sources,
        weights,
        num_windows,
        seed=seed,
        start=state.consumed,
        state=state,
        period=period,
        block_size=block_size,
    )
