"""The folders where a loader's workers share packed plans (``datasets.computed.shared_plans``):
one per loader, in shared memory where there is some, removed when its workers stop.

A training process killed outright (SIGKILL, the OOM killer, a preempted node) runs no clean-up,
and its folder, a few MB of shared memory per packed source, would stay until the machine
restarts. So each folder holds a lock file that its loader's process keeps locked (``flock``,
released by the kernel when the process and the workers it forked are gone), and every loader
that makes a folder first removes the folders whose lock nobody holds. The lock file appears
under its name only once locked (made under another name, locked, then renamed), so a folder
being made is never taken for an abandoned one; a folder without one (another tool's, or one
being made) is left alone, as is one whose lock cannot be opened (another user's).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from typing import Any, NamedTuple

__all__ = ["PREFIX", "PlanFolder", "make_plan_folder", "remove_plan_folder", "sweep"]

PREFIX = "tokenload-plans-"
_OWNER = "owner.lock"


class PlanFolder(NamedTuple):
    path: str
    owner: int
    """The descriptor holding the folder's lock (inherited by forked workers)."""


def _base() -> str | None:
    """``/dev/shm`` when it can be written, else None (the temporary folder)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def make_plan_folder(dataset: Any) -> PlanFolder | None:
    """A new, locked plans folder for ``dataset``'s workers after removing abandoned ones; None
    when the dataset shares no plan (only packed rows of the computed order do) or no folder
    can be made (each worker then plans alone)."""
    if getattr(dataset, "share_plans", None) is None or not dataset.describe_sources().packed:
        return None
    base = _base()
    sweep(base or tempfile.gettempdir())
    try:
        path = tempfile.mkdtemp(prefix=PREFIX, dir=base)
    except OSError:
        return None
    making = os.path.join(path, f".{_OWNER}")
    try:
        fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(making, os.path.join(path, _OWNER))
    except OSError:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        return None
    return PlanFolder(path, fd)


def remove_plan_folder(folder: PlanFolder | None) -> None:
    """Remove a loader's plans folder, then let go of its lock."""
    if folder is None:
        return
    shutil.rmtree(folder.path, ignore_errors=True)
    try:
        os.close(folder.owner)
    except OSError:
        pass


def sweep(base: str) -> list[str]:
    """Remove the plans folders in ``base`` whose lock nobody holds (their loader's process and
    its workers are gone); the folders removed."""
    try:
        names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(base, name)
        try:
            fd = os.open(os.path.join(path, _OWNER), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # none (being made, or not ours), or not ours to open
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its loader is alive
            os.close(fd)
            continue
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
        removed.append(path)
    return removed
