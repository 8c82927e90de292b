"""The work folder that makes preprocess resumable: one committed part per input file.

``{prefix}.tokenload-work/`` beside the output holds ``job.json`` (what the job is: tokenizer
identity, keys, rules, the file list) and, per finished input file i, the token files
``{i:06d}_{key}`` plus a marker ``{i:06d}.done`` written atomically after them. A restarted job
with the same ``job.json`` reuses every part whose marker exists and whose input file still has
the recorded size and modification time, and redoes the rest. The final outputs are the parts
concatenated in input order, so they are the same bytes whether or not the job was interrupted.
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
        """Create the folder, or check an existing one belongs to this job (or wipe it)."""
        job_file = self.root / _JOB
        if self.root.exists() and not resume:
            shutil.rmtree(self.root)
        if job_file.exists():
            try:
                old = json.loads(job_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                old = None
            if old != self.job:
                changed = sorted(
                    k
                    for k in set(self.job) | set(old or {})
                    if (old or {}).get(k) != self.job.get(k)
                )
                raise ConfigError(
                    f"the work folder {str(self.root)!r} belongs to an interrupted job with"
                    f" different settings (differs in: {', '.join(changed) or 'format'})",
                    hint="rerun with the original settings to resume it, or pass --no-resume"
                    " to start over",
                )
            self._remove_temporaries()
            return
        self.root.mkdir(exist_ok=True)
        write_bytes_atomic(
            job_file, (json.dumps(self.job, indent=1, sort_keys=True) + "\n").encode()
        )

    def part(self, index: int, key: str) -> str:
        """Token file prefix of input file ``index``'s part for ``key``."""
        return str(self.root / f"{index:06d}_{key}")

    def _marker(self, index: int) -> Path:
        return self.root / f"{index:06d}.done"

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
            part = self.part(index, key)
            if not (os.path.isfile(part + ".bin") and os.path.isfile(part + ".idx")):
                return None
        return summary

    def commit(self, index: int, summary: dict[str, Any]) -> None:
        """Mark input file ``index`` finished (its part files are already published)."""
        write_bytes_atomic(
            self._marker(index), (json.dumps(summary, sort_keys=True) + "\n").encode()
        )

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _remove_temporaries(self) -> None:
        """Temporary files of a killed run (``.NAME.tmp-PID-XXXX``) are never reused."""
        for entry in self.root.iterdir():
            if entry.name.startswith(".") and ".tmp-" in entry.name:
                entry.unlink(missing_ok=True)
