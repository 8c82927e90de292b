"""Resumable loader state: a few integers plus a fingerprint of data and configuration.

Because global sample k is a pure function of (data, config, k), resuming needs only the number
of samples the whole job has consumed. The fingerprint makes a state saved for other data or
another order fail loudly instead of silently reshuffling. A computed blend's state also holds
its mixture (every source's cursor), which the loader hands to the blend on resume, so its
weights and sources may change between runs (``TokenloadDataLoader.load_state_dict``).

Beside these fields the loader's state dict carries ``"skips"`` (each ``loader.skip``: where, how
many samples, and how many of each source) and ``"accounting"`` (the job's per-source drawn,
skipped and delivered samples, tokens and epochs: ``ledger.py``; informational, recomputed on
load, printed by ``tokenload state``).
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass
from typing import Any

from ..contract import MixtureCursors
from ..errors import StateError

STATE_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class LoaderState:
    """What a checkpoint stores for the data pipeline."""

    consumed_samples: int
    """Samples of the global order consumed by all data-parallel ranks together."""
    fingerprint: str
    """Identity of the dataset, its order and the sampler kind."""
    micro_batch_size: int
    """Micro-batch size when saved (the cyclic sampler resumes only with the same one)."""
    dp_size: int
    """Data-parallel size when saved (the cyclic sampler resumes only on the same one; the
    single sampler resumes on any)."""
    version: int = STATE_VERSION
    """Schema version of this state."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoaderState:
        if not isinstance(data, dict):
            raise StateError(
                f"loader state is a {type(data).__name__}, expected a dict",
                hint="pass loader.state_dict()",
            )
        version = data.get("version")
        if version != STATE_VERSION:
            raise StateError(
                f"loader state version is {version!r}, expected {STATE_VERSION}",
                hint="the checkpoint was written by an incompatible tokenload; resume with the"
                " version that wrote it",
            )
        try:
            fields = {
                k: data[k]
                for k in ("consumed_samples", "fingerprint", "micro_batch_size", "dp_size")
            }
        except KeyError as exc:
            raise StateError(
                f"loader state lacks {exc}", hint="pass the dict saved from loader.state_dict()"
            ) from None
        if not isinstance(fields["fingerprint"], str):
            raise StateError(
                f"loader state fingerprint is {fields['fingerprint']!r}, expected a string",
                hint="pass the dict saved from loader.state_dict(), unchanged",
            )
        for name, least in (("consumed_samples", 0), ("micro_batch_size", 1), ("dp_size", 1)):
            fields[name] = _count(name, fields[name], least)
        return cls(**fields)

    def check_topology(self, *, micro_batch_size: int, dp_size: int) -> None:
        """Raise StateError unless saved with this micro-batch and data-parallel size: the cyclic
        sampler's permutation and epoch length depend on both, so resuming it on another topology
        would repeat some samples and skip others."""
        if (self.micro_batch_size, self.dp_size) != (micro_batch_size, dp_size):
            raise StateError(
                f"loader state was saved by the cyclic sampler at dp_size={self.dp_size},"
                f" micro_batch_size={self.micro_batch_size}; this loader has dp_size={dp_size},"
                f" micro_batch_size={micro_batch_size}, and the cyclic order depends on both",
                hint=f"resume on {self.dp_size} data-parallel ranks with"
                f" micro_batch_size={self.micro_batch_size}, or train with kind='single'"
                " (Megatron's default sampler), which resumes on any topology",
            )

    def check(self, fingerprint: str) -> None:
        """Raise StateError unless this state belongs to data and config with ``fingerprint``."""
        if self.fingerprint != fingerprint:
            raise StateError(
                f"loader state was saved for data/config fingerprint {self.fingerprint}, this"
                f" loader's is {fingerprint}",
                hint="resume with the same token files, sequence length, seed, split and blend as"
                " the saved run, or start the data order from scratch deliberately"
                " (consumed_samples=0)",
            )


def _count(name: str, value: Any, least: int) -> int:
    """``value`` as an int >= ``least``; a string, float or bool is refused, not converted (a
    checkpoint that stores one was written or edited by something else)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise StateError(
            f"loader state {name} is {value!r} ({type(value).__name__}), expected an int",
            hint="pass the dict saved from loader.state_dict(), unchanged",
        )
    if value < least:
        raise StateError(
            f"loader state {name} is {value}, expected {least} or more",
            hint="pass the dict saved from loader.state_dict(), unchanged",
        )
    return int(value)


def weights_changes(state: dict[str, Any]) -> list[tuple[int, tuple[float, ...]]]:
    """A state's ``weights_changes`` (``loader.set_weights``) as (start, weights) pairs."""
    saved = state.get("weights_changes")
    try:
        return [(int(start), tuple(float(w) for w in weights)) for start, weights in saved or []]
    except (TypeError, ValueError):
        raise StateError(
            f"the loader state's weights_changes is {saved!r}; expected [[start, [w, ...]], ...]",
            hint="pass the dict saved from loader.state_dict(), unchanged",
        ) from None


def restore_mixture(
    mixture: MixtureCursors,
    state: dict[str, Any],
    changes: list[tuple[int, tuple[float, ...]]],
    undo_from: int | None = None,
) -> str:
    """Put a blend where the run that saved ``state`` left it: the changes made since its
    build from ``undo_from`` on undone, the saved run's ``set_weights`` ``changes`` applied
    (the blend's schedule is then the saved chain's), and its mixture resumed
    (``resume_mixture``: ``"same"``, ``"weights"`` or ``"sources"``)."""
    if undo_from is not None:
        mixture.change_weights(undo_from, None)
    for start, weights in changes:
        mixture.change_weights(start, weights)
    return mixture.resume_mixture(state["mixture"])
