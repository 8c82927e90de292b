"""The work folder that makes preprocess resumable: one committed part per input file.

``{prefix}.tokenload-work/`` beside the output holds ``job.json`` (what the job is: tokenizer
identity, keys, rules, the file list) and, per finished input file i, the token files
``{i:06d}_{key}`` plus a marker ``{i:06d}.done`` written atomically after them. The Ray executor
splits a large file into byte ranges, each a task with its own part ``{i:06d}.{k:05d}_{key}`` and
marker ``{i:06d}.{k:05d}.range`` (written by the task, so a driver killed after the task finished
keeps it); the file's ``.done`` then lists its parts. A restarted job
with the same ``job.json`` reuses every part whose marker exists and whose input file still has
the recorded size and modification time, and redoes the rest. The final outputs are the parts
concatenated in input order, so they are the same bytes whether or not the job was interrupted.

``job.json`` is written before any part and deleted after every other file, so parts are never
seen without the job that made them; a folder lacking it is wiped, not reused (otherwise a run
killed during cleanup would hand its parts to the next run, even one with another tokenizer).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..format.atomic import write_bytes_atomic
from .sources import WORK_SUFFIX, InputFile

log = logging.getLogger(__name__)

_JOB = "job.json"


class WorkDir:
    """The work folder of one job (one shard)."""

    def __init__(self, prefix: str, job: dict[str, Any]) -> None:
        self.root = Path(prefix + WORK_SUFFIX)
        self.job = job

    def open(self, resume: bool) -> None:
        """Create the folder, or check an existing one belongs to this job (or wipe it).

        Only a ``job.json`` vouches for the parts beside it: a folder without one (a kill during
        the final cleanup, or a run killed before it wrote one) is wiped, never reused."""
        if self.root.exists():
            old = self._recorded_job()
            if not resume or old is None:
                if old is None:
                    log.info("discarding %s: no job.json vouches for its parts", self.root)
                self._wipe()
            elif old != self.job:
                raise self._other_job(old)
            else:
                self.remove_temporaries()
                return
        self.root.mkdir()
        write_bytes_atomic(
            self.root / _JOB, (json.dumps(self.job, indent=1, sort_keys=True) + "\n").encode()
        )

    def _recorded_job(self) -> dict[str, Any] | None:
        try:
            job = json.loads((self.root / _JOB).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return job if isinstance(job, dict) else None

    def _other_job(self, old: dict[str, Any]) -> ConfigError:
        changed = sorted(k for k in set(self.job) | set(old) if old.get(k) != self.job.get(k))
        done = len(list(self.root.glob("*.done")))
        earlier = ""
        if "inputs" in changed and isinstance(old.get("inputs"), list) and old["inputs"]:
            earlier = f"; its inputs were {old['inputs'][0]!r}" + (
                f" and {len(old['inputs']) - 1} more" if len(old["inputs"]) > 1 else ""
            )
        return ConfigError(
            f"an earlier run on this output prefix stopped before it finished (an error or a kill)"
            f" and left {done} finished input file(s) in {str(self.root)!r} for a resume, but its"
            f" settings differ from this run's (differs in: {', '.join(changed)}){earlier}",
            hint="pass --restart (resume=False) to discard that work and start over, or rerun the earlier"
            " command to resume it",
        )

    def part(self, index: int, key: str) -> str:
        """Token file prefix of input file ``index``'s part for ``key``."""
        return str(self.root / f"{index:06d}_{key}")

    def parts(self, index: int, summary: dict[str, Any], key: str) -> list[str]:
        """Token file prefixes of finished input file ``index`` for ``key``, in input order."""
        return [str(self.root / f"{stem}_{key}") for stem in summary.get("parts", [f"{index:06d}"])]

    def _marker(self, index: int) -> Path:
        return self.root / f"{index:06d}.done"

    def range_finished(
        self, index: int, k: int, file: InputFile, span: tuple[int, int], keys: tuple[str, ...]
    ) -> dict[str, Any] | None:
        """The summary of byte range ``k`` of input file ``index`` if a task finished it for the
        file as it is now and for the same cut, else None."""
        stem = range_stem(index, k)
        try:
            summary = json.loads((self.root / f"{stem}.range").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if (summary.get("path"), summary.get("stamp"), summary.get("range")) != (
            file.path, file.stamp, list(span)
        ):
            return None
        for key in keys:
            part = str(self.root / f"{stem}_{key}")
            if not (os.path.isfile(part + ".bin") and os.path.isfile(part + ".idx")):
                return None
        return summary

    def finished(self, index: int, file: InputFile, keys: tuple[str, ...]) -> dict[str, Any] | None:
        """The summary of a committed part that is still valid for ``file``, else None."""
        try:
            summary = json.loads(self._marker(index).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if summary.get("path") != file.path or summary.get("stamp") != file.stamp:
            log.info("input %s changed since its part was written; redoing it", file.path)
            return None
        for key in keys:
            for part in self.parts(index, summary, key):
                if not (os.path.isfile(part + ".bin") and os.path.isfile(part + ".idx")):
                    return None
        return summary

    def commit(self, index: int, summary: dict[str, Any]) -> None:
        """Mark input file ``index`` finished (its part files are already published)."""
        write_marker(self.root, f"{index:06d}.done", summary)

    def committed(self) -> int:
        """How many input files and byte ranges have a finished part (what a resume would reuse)."""
        return len(list(self.root.glob("*.done"))) + len(list(self.root.glob("*.range")))

    def remove(self) -> None:
        """Delete the folder, ``job.json`` last: a kill at any point leaves either a folder that
        ``job.json`` still vouches for, or one without it, which ``open`` wipes."""
        if not self.root.exists():
            return
        order = lambda e: (e.name == _JOB, not e.name.endswith((".done", ".range")))  # noqa: E731
        for entry in sorted(self.root.iterdir(), key=order):
            _delete(entry)
        self.root.rmdir()

    def _wipe(self) -> None:
        """Delete everything, vouched-for ``job.json`` first so no reader trusts what remains."""
        (self.root / _JOB).unlink(missing_ok=True)
        shutil.rmtree(self.root)

    def remove_temporaries(self) -> None:
        """Temporary files of a killed run (``.NAME.tmp-PID-XXXX``) are never reused."""
        for entry in self.root.iterdir():
            if entry.name.startswith(".") and ".tmp-" in entry.name:
                entry.unlink(missing_ok=True)


def range_stem(index: int, k: int) -> str:
    """Name stem of byte range ``k`` of input file ``index`` in the work folder."""
    return f"{index:06d}.{k:05d}"


def write_marker(root: str | Path, name: str, summary: dict[str, Any]) -> None:
    """Mark a file (``.done``) or byte range (``.range``) finished, atomically, after its parts
    are published; a Ray task writes its own, so a killed driver loses no finished task."""
    write_bytes_atomic(Path(root) / name, (json.dumps(summary, sort_keys=True) + "\n").encode())


def _delete(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)
