"""The work folder that makes preprocess resumable: one committed record per input file.

``{prefix}.tokenload-work/`` beside the output holds ``job.json`` (what the job is: tokenizer
identity, keys, rules, the file list) and, per finished input file i, a marker ``{i:06d}.done``
written atomically after the files it vouches for. What those are depends on the executor:

* The local executor (``pool``) writes each token once: straight into the output being written,
  ``output_{key}.bin.partial`` in this folder (one per key, in input order; not a valid name, so
  nothing looks like an output before the end), and per finished file only that file's index,
  ``{i:06d}_{key}.idx`` (a Megatron ``.idx`` of the file's documents). Its marker records where
  the file's tokens start in the output (``offsets``); the output is flushed and fsynced before
  the index and the marker are written, so a marker's tokens are on disk. A resume keeps the
  leading files whose markers and indexes agree with the output's length (cutting off whatever a
  killed run wrote after them) and continues from there (``outputs.OutputStreams``). At the end
  the output is moved to its real name by the usual publish (``.idx`` last: the commit point).
* The Ray executor (``cluster``) splits a large file into byte ranges, each a task with its own
  part ``{i:06d}.{k:05d}_{key}`` (``.bin`` + ``.idx``) and marker ``{i:06d}.{k:05d}.range``
  (written by the task, so a driver killed after the task finished keeps it); the file's
  ``.done`` then lists its parts, and the final outputs are the parts concatenated in input
  order (``outputs``). An older local run's marker, listing no parts and no offsets, names the
  one part ``{i:06d}_{key}``.

A restarted job with the same ``job.json`` reuses every file whose marker exists and whose input
file still has the recorded size, modification and change times and inode (a file edited
in place, even with its modification time set back, has another change time), and redoes the
rest, so the outputs are
the same bytes whether or not the job was interrupted. Either executor can resume the other's
folder: the local one copies a file's parts into its output (and a local file that a resume
cannot keep in place, one after a file being redone, is first copied out into a part of its
own); Ray's redoes files that have no parts.

With an object-storage output (``s3://``) and the Ray executor the work folder is a work prefix
in the bucket, ``{prefix}.tokenload-work/`` with the same names (``RemoteWorkDir``): nodes of a
cluster share no folder, so each Ray task makes its part in a local temporary folder, uploads
the part files and then its marker object (one PUT each, visible whole or not at all), and the
driver downloads the parts one at a time to concatenate them. The marker is the last object of
a part, so a part with a marker is complete, as in a local folder. (The local executor stages an
``s3://`` output in a local folder and keeps its work folder there.)

``job.json`` is written before any part and deleted after every other file, so parts are never
seen without the job that made them; a folder lacking it is wiped, not reused (otherwise a run
killed during cleanup would hand its parts to the next run, even one with another tokenizer).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..format.atomic import write_bytes_atomic
from ..storage.remote import is_url
from ..storage.upload import (
    fetched_prefix,
    list_objects,
    read_object,
    read_objects,
    remove_folder,
    remove_objects,
    upload_bytes,
)
from .inputs import WORK_SUFFIX, InputFile
from .summaries import FileSummary, PartSummary, RangeSummary

log = logging.getLogger(__name__)

_JOB = "job.json"
_MARKERS = (".done", ".range")


class WorkFolder:
    """What a work folder does, over four primitives its two kinds (a local folder, a prefix
    in object storage) implement: list the names, read one, write one atomically, delete some."""

    location: str

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job

    # -- primitives ---------------------------------------------------------------------------
    def exists(self) -> bool:
        raise NotImplementedError

    def _names(self) -> set[str]:
        raise NotImplementedError

    def _read(self, name: str) -> bytes | None:
        raise NotImplementedError

    def _write(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def _delete(self, names: list[str]) -> None:
        raise NotImplementedError

    def _create(self) -> None:
        """Make the (empty) folder before ``job.json`` is written into it."""

    def _has_part(self, stem_key: str) -> bool:
        raise NotImplementedError

    def remove_temporaries(self) -> None:
        """Temporary files of a killed run (local folders only: an upload is whole or absent)."""

    def release(self) -> None:
        """Let go of the folder, whatever became of it (a local folder's lock)."""

    # -- the work folder ----------------------------------------------------------------------
    def open(self, resume: bool) -> None:
        """Create the folder, or check an existing one belongs to this job (or wipe it).

        Only a ``job.json`` vouches for the parts beside it: a folder without one (a kill during
        the final cleanup, or a run killed before it wrote one) is wiped, never reused."""
        if self.exists():
            old = self._recorded_job()
            if not resume or old is None:
                if old is None:
                    log.info("discarding %s: no job.json vouches for its parts", self.location)
                self._wipe()
            elif old != self.job:
                raise self._other_job(old)
            else:
                self.remove_temporaries()
                return
        self._create()
        self._write(_JOB, (json.dumps(self.job, indent=1, sort_keys=True) + "\n").encode())

    def _recorded_job(self) -> dict[str, Any] | None:
        try:
            job = json.loads(self._read(_JOB) or b"")
        except ValueError:
            return None
        return job if isinstance(job, dict) else None

    def _other_job(self, old: dict[str, Any]) -> ConfigError:
        changed = sorted(k for k in set(self.job) | set(old) if old.get(k) != self.job.get(k))
        done = sum(name.endswith(".done") for name in self._names())
        earlier = ""
        if "inputs" in changed and isinstance(old.get("inputs"), list) and old["inputs"]:
            earlier = f"; its inputs were {old['inputs'][0]!r}" + (
                f" and {len(old['inputs']) - 1} more" if len(old["inputs"]) > 1 else ""
            )
        return ConfigError(
            f"an earlier run on this output prefix stopped before it finished (an error or a kill)"
            f" and left {done} finished input file(s) in {self.location!r} for a resume, but its"
            f" settings differ from this run's (differs in: {', '.join(changed)}){earlier}",
            hint="pass `resume=False` to discard that work and start over, or rerun the earlier"
            " command to resume it",
        )

    def part(self, index: int, key: str) -> str:
        """Token file prefix of input file ``index``'s part for ``key``."""
        return f"{self.location}/{index:06d}_{key}"

    def parts(self, index: int, summary: FileSummary, key: str) -> list[str]:
        """Token file prefixes of finished input file ``index`` for ``key``, in input order."""
        return [f"{self.location}/{stem}_{key}" for stem in _stems(index, summary)]

    def readable(self, part: str) -> contextlib.AbstractContextManager[str]:
        """A local token file prefix holding ``part``'s bytes while the block runs."""
        return fetched_prefix(part)

    def _summary(self, name: str) -> dict[str, Any] | None:
        try:
            summary = json.loads(self._read(name) or b"")
        except ValueError:
            return None
        return summary if isinstance(summary, dict) else None

    def range_finished(
        self, index: int, k: int, file: InputFile, span: tuple[int, int], keys: tuple[str, ...]
    ) -> RangeSummary | None:
        """The summary of byte range ``k`` of input file ``index`` if a task finished it for the
        file as it is now and for the same cut, else None."""
        stem = range_stem(index, k)
        data = self._summary(f"{stem}.range")
        if data is None or (data.get("path"), data.get("stamp"), data.get("range")) != (
            file.path,
            file.stamp,
            list(span),
        ):
            return None
        if not all(self._has_part(f"{stem}_{key}") for key in keys):
            return None
        return RangeSummary.from_json(data)

    def marker(self, index: int, file: InputFile) -> FileSummary | None:
        """The ``.done`` marker of input file ``index`` if it was written for ``file`` as it is
        now, else None (whatever else the marker vouches for is not checked here)."""
        data = self._summary(f"{index:06d}.done")
        if data is None:
            return None
        if data.get("path") != file.path or data.get("stamp") != file.stamp:
            log.info("input %s changed since it was encoded; redoing it", file.path)
            return None
        return FileSummary.from_json(data)

    def finished(self, index: int, file: InputFile, keys: tuple[str, ...]) -> FileSummary | None:
        """The summary of a committed part that is still valid for ``file``, else None (also
        for a file whose tokens are in the local executor's output: it has no part)."""
        summary = self.marker(index, file)
        if summary is None or summary.offsets is not None:
            return None
        if not all(
            self._has_part(f"{stem}_{key}") for stem in _stems(index, summary) for key in keys
        ):
            return None
        return summary

    def commit(self, index: int, summary: FileSummary) -> None:
        """Mark input file ``index`` finished (its part files are already published)."""
        write_marker(self.location, f"{index:06d}.done", summary)

    def uncommit(self, indexes: list[int]) -> None:
        """Remove the ``.done`` markers of these input files (those that have one)."""
        names = self._names()
        self._delete([n for n in (f"{i:06d}.done" for i in indexes) if n in names])

    def committed(self) -> int:
        """How many input files and byte ranges have a finished part (what a resume would reuse)."""
        return sum(name.endswith(_MARKERS) for name in self._names())

    def remove(self) -> None:
        """Delete the folder: markers, then parts, then ``job.json``: a kill at any point leaves
        either a folder that ``job.json`` still vouches for, or one without it, which ``open``
        wipes."""
        if not self.exists():
            return
        names = self._names()
        markers = sorted(n for n in names if n.endswith(_MARKERS))
        rest = sorted(n for n in names if n != _JOB and not n.endswith(_MARKERS))
        self._delete(markers)
        self._delete(rest)
        self._delete([_JOB])

    def _wipe(self) -> None:
        """Delete everything, vouched-for ``job.json`` first so no reader trusts what remains."""
        self._delete([_JOB])
        self._delete(sorted(self._names()))


class WorkDir(WorkFolder):
    """The work folder of one job (one shard) on a local (or shared) filesystem."""

    def __init__(self, prefix: str, job: dict[str, Any]) -> None:
        super().__init__(job)
        self.root = Path(prefix + WORK_SUFFIX)
        self.location = str(self.root)
        self._lock: int | None = None

    def open(self, resume: bool) -> None:
        """``WorkFolder.open``, once this process holds the folder: a second run writing the
        same output (its work folder in use: the lock a running process holds) is refused
        before it reads or touches anything of the first one's."""
        self._hold()
        super().open(resume)

    @property
    def _lock_path(self) -> Path:
        return self.root.parent / f".{self.root.name}.lock"  # beside the folder it guards

    def _hold(self) -> None:
        path = self._lock_path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:  # a folder that takes no file: the outputs' write will say why
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):  # a filesystem without locks
                log.info("cannot lock %s (%s): running without the lock", path, exc.strerror)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                return
            raise ConfigError(
                f"another tokenload preprocess is writing this output: its work folder"
                f" {self.location} is in use (locked by a running process)",
                path=self.location,
                hint="wait for that run to end, or write to another output prefix",
            ) from None
        self._lock = fd

    def release(self) -> None:
        """Let go of the folder (its lock file goes: nothing is left beside the output)."""
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self._lock_path)
        os.close(self._lock)
        self._lock = None

    def exists(self) -> bool:
        return self.root.exists()

    def _names(self) -> set[str]:
        return {entry.name for entry in self.root.iterdir()} if self.root.is_dir() else set()

    def _read(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except OSError:
            return None

    def _write(self, name: str, data: bytes) -> None:
        write_bytes_atomic(self.root / name, data)

    def _create(self) -> None:
        self.root.mkdir()

    def _delete(self, names: list[str]) -> None:
        for name in names:
            _delete(self.root / name)

    def _wipe(self) -> None:
        (self.root / _JOB).unlink(missing_ok=True)
        shutil.rmtree(self.root)

    def remove(self) -> None:
        super().remove()
        if self.root.exists():
            self.root.rmdir()
        self.release()

    def _has_part(self, stem_key: str) -> bool:
        part = self.root / stem_key
        return os.path.isfile(f"{part}.bin") and os.path.isfile(f"{part}.idx")

    def output(self, key: str) -> Path:
        """The output for ``key`` being written once (the local executor's), until it is
        published under its real name."""
        return self.root / f"output_{key}.bin.partial"

    def index(self, index: int, key: str) -> Path:
        """The ``.idx`` of input file ``index``'s documents for ``key`` (with the tokens in the
        output being written once, or in the ``.bin`` beside it for a part)."""
        return self.root / f"{index:06d}_{key}.idx"

    def write(self, name: str, chunks: list[bytes]) -> None:
        """Write ``name`` in the folder atomically (fsynced, then renamed)."""
        write_bytes_atomic(self.root / name, chunks)

    def readable(self, part: str) -> contextlib.AbstractContextManager[str]:
        return contextlib.nullcontext(part)

    def remove_temporaries(self) -> None:
        """Temporary files of a killed run (``.NAME.tmp-PID-XXXX``) are never reused."""
        for entry in self.root.iterdir():
            if entry.name.startswith(".") and ".tmp-" in entry.name:
                entry.unlink(missing_ok=True)


class RemoteWorkDir(WorkFolder):
    """The work prefix of one job in object storage: ``{prefix}.tokenload-work/`` in the bucket.

    What is there is listed once when the job opens it (and its markers read in one concurrent
    batch), since a resume asks about every part and a request per question would cost a round
    trip each; ``committed`` and ``remove`` list again."""

    def __init__(self, prefix: str, job: dict[str, Any]) -> None:
        super().__init__(job)
        self.location = prefix + WORK_SUFFIX
        self._seen: set[str] = set()
        self._markers: dict[str, bytes] = {}

    def exists(self) -> bool:
        return bool(self._names())

    def _names(self) -> set[str]:
        return {url.rsplit("/", 1)[1] for url in list_objects(self.location)}

    def open(self, resume: bool) -> None:
        super().open(resume)
        self._seen = self._names()
        markers = [
            f"{self.location}/{name}" for name in sorted(self._seen) if name.endswith(_MARKERS)
        ]
        self._markers = {url.rsplit("/", 1)[1]: data for url, data in read_objects(markers).items()}

    def _read(self, name: str) -> bytes | None:
        if name in self._markers:
            return self._markers[name]
        return read_object(f"{self.location}/{name}")

    def _write(self, name: str, data: bytes) -> None:
        upload_bytes(data, f"{self.location}/{name}")

    def _delete(self, names: list[str]) -> None:
        remove_objects([f"{self.location}/{name}" for name in names])

    def _has_part(self, stem_key: str) -> bool:
        return {f"{stem_key}.bin", f"{stem_key}.idx"} <= self._seen

    def remove(self) -> None:
        super().remove()
        remove_folder(self.location)


def open_workdir(prefix: str, job: dict[str, Any], remote: bool) -> WorkFolder:
    """The work folder of the job writing ``prefix``: a work prefix in object storage when
    ``remote`` (its parts are made where no folder is shared), else a folder beside ``prefix``."""
    return RemoteWorkDir(prefix, job) if remote else WorkDir(prefix, job)


def range_stem(index: int, k: int) -> str:
    """Name stem of byte range ``k`` of input file ``index`` in the work folder."""
    return f"{index:06d}.{k:05d}"


def write_marker(root: str | Path, name: str, summary: PartSummary) -> None:
    """Mark a file (``.done``) or byte range (``.range``) finished, atomically, after its parts
    are published; a Ray task writes its own, so a killed driver loses no finished task. Under a
    work prefix in object storage the marker is one PUT (whole or absent)."""
    data = (json.dumps(summary.to_json(), sort_keys=True) + "\n").encode()
    if is_url(str(root)):
        upload_bytes(data, f"{root}/{name}")
    else:
        write_bytes_atomic(Path(root) / name, data)


def _stems(index: int, summary: FileSummary) -> tuple[str, ...]:
    """Name stems of finished input file ``index``'s parts (the one named after the file's number
    when the marker lists none)."""
    return (f"{index:06d}",) if summary.parts is None else summary.parts


def _delete(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)
