"""Who this process is: rank, local rank, world size, node. The only module that touches
torch.distributed, and only when it is already imported and initialized (never imports torch,
never initialises a process group).

Resolution order: an initialized ``torch.distributed`` process group, then the launcher's
environment (torchrun's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK, SLURM's
SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NODEID), then a single process.

``barrier`` is the one collective tokenload ever calls (the ``rank0`` and ``local-rank0`` build
policies, once per ``build_datasets``); it refuses to run without a process group rather than
let ranks race past each other.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

__all__ = ["World", "barrier", "int_env", "process_group"]


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
    node_rank: int | None = None
    """Index of this node as the launcher numbers it (torchrun's GROUP_RANK, SLURM_NODEID);
    None when the launcher does not say."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank {self.rank} is outside [0, {self.world_size})",
                hint="check RANK/WORLD_SIZE set by the launcher",
            )

    @property
    def node(self) -> int:
        """Index of this node: the launcher's when given, else from the rank (ranks laid out
        node by node)."""
        if self.node_rank is not None:
            return self.node_rank
        return self.rank // max(self.local_world_size, 1)

    @classmethod
    def detect(cls) -> World:
        """The world of this process (torch.distributed, then launcher env, then single)."""
        env = os.environ
        local = {
            "local_rank": int_env("LOCAL_RANK", "SLURM_LOCALID", default=0),
            "local_world_size": int_env("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", default=1),
            "node_rank": int_env("GROUP_RANK", "SLURM_NODEID", default=None),
        }
        dist = process_group()
        if dist is not None:
            return cls(rank=dist.get_rank(), world_size=dist.get_world_size(), **local)
        if "RANK" in env or "SLURM_PROCID" in env:
            return cls(
                rank=int_env("RANK", "SLURM_PROCID", default=0),
                world_size=int_env("WORLD_SIZE", "SLURM_NTASKS", default=1),
                **local,
            )
        return cls()


def process_group() -> Any | None:
    """The ``torch.distributed`` module when a process group is initialised, else None (torch is
    never imported here: a process that has not imported it has no group)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def barrier(world: World, why: str) -> None:
    """Wait for every rank (``torch.distributed.barrier``); nothing in a single process.
    ``why`` names what needs it, for the error when no process group is initialised."""
    if world.world_size == 1:
        return
    dist = process_group()
    if dist is None:
        raise ConfigError(
            f"{why} needs torch.distributed initialised ({world.world_size} ranks, no process "
            "group); tokenload never initialises one itself",
            hint="call torch.distributed.init_process_group before build_datasets, or use "
            "build_policy='auto' or 'none' (no collective)",
        )
    dist.barrier()


def int_env(*names: str, default: int | None) -> Any:
    """The first of the environment variables ``names`` that is set, as an int (a SLURM value
    such as ``2(x4)`` read up to its bracket), else ``default``; ``ConfigError`` if not a number."""
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value.split("(")[0])
            except ValueError:
                raise ConfigError(
                    f"{name}={value!r} is not an integer", hint=f"fix or unset {name}"
                ) from None
    return default
