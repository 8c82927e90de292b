"""Who this process is: rank, local rank, world size, node. The only module that touches
torch.distributed, and only when it is already imported and initialized (never imports torch).

Resolution order: an initialized ``torch.distributed`` process group, then the launcher's
environment (torchrun's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE, SLURM's SLURM_PROCID/
SLURM_NTASKS/SLURM_LOCALID), then a single process.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    """Global rank."""
    world_size: int = 1
    """Number of processes."""
    local_rank: int = 0
    """Rank within this node."""
    local_world_size: int = 1
    """Processes on this node."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank {self.rank} is outside [0, {self.world_size})",
                hint="check RANK/WORLD_SIZE set by the launcher",
            )

    @property
    def node(self) -> int:
        """Index of this node (ranks are laid out node by node)."""
        return self.rank // max(self.local_world_size, 1)

    @classmethod
    def detect(cls) -> "World":
        """The world of this process (torch.distributed, then launcher env, then single)."""
        env = os.environ
        local_rank = _int_env("LOCAL_RANK", "SLURM_LOCALID", default=0)
        local_world = _int_env("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", default=1)
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return cls(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank,
                       local_world_size=local_world)
        if "RANK" in env or "SLURM_PROCID" in env:
            return cls(
                rank=_int_env("RANK", "SLURM_PROCID", default=0),
                world_size=_int_env("WORLD_SIZE", "SLURM_NTASKS", default=1),
                local_rank=local_rank,
                local_world_size=local_world,
            )
        return cls()


def _int_env(*names: str, default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value.split("(")[0])
            except ValueError:
                raise ConfigError(f"{name}={value!r} is not an integer", hint=f"fix or unset {name}") from None
    return default
