"""Resumable loader state: a few integers plus a fingerprint of data and configuration.

Because global sample k is a pure function of (data, config, k), resuming needs only the number
of samples the whole job has consumed. The fingerprint makes a state saved for other data or
another order fail loudly instead of silently reshuffling.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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
    """Micro-batch size when saved (informational; resume may change the topology)."""
    dp_size: int
    """Data-parallel size when saved (informational)."""
    version: int = STATE_VERSION
    """Schema version of this state."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LoaderState":
        if not isinstance(data, dict):
            raise StateError(f"loader state is a {type(data).__name__}, expected a dict", hint="pass loader.state_dict()")
        version = data.get("version")
        if version != STATE_VERSION:
            raise StateError(
                f"loader state version is {version!r}, expected {STATE_VERSION}",
                hint="the checkpoint was written by an incompatible tokenload; resume with the version that wrote it",
            )
        try:
            return cls(**{k: data[k] for k in ("consumed_samples", "fingerprint", "micro_batch_size", "dp_size")})
        except KeyError as exc:
            raise StateError(f"loader state lacks {exc}", hint="pass the dict saved from loader.state_dict()") from None

    def check(self, fingerprint: str) -> None:
        """Raise StateError unless this state belongs to data and config with ``fingerprint``."""
        if self.fingerprint != fingerprint:
            raise StateError(
                f"loader state was saved for data/config fingerprint {self.fingerprint}, this loader's is {fingerprint}",
                hint="resume with the same token files, sequence length, seed, split and blend as the saved run,"
                " or start the data order from scratch deliberately (consumed_samples=0)",
            )
