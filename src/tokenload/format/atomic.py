"""Files that appear whole or not at all.

A writer writes under a hidden temporary name in the target folder (same filesystem, so the
final ``os.replace`` is atomic) and renames at the end; a crash or kill leaves only a
``.NAME.tmp-HOST-PID-XXXXXXXX`` file that no reader ever opens. The host and process id in the
name let a later writer of the same file tell a killed writer's leftovers from a live one's.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ..storage.os_errors import write_error
from ..storage.owners import host_name, owner_gone

logger = logging.getLogger(__name__)

#: A leftover not modified for this long is stale even when its owner cannot be checked (a
#: writer on another host of a shared filesystem).
STALE_AFTER_S = 24 * 3600

_TEMP = re.compile(
    r"^\.(?P<name>.+)\.tmp-(?:(?P<host>[A-Za-z0-9_.]+)-)?(?P<pid>\d+)-(?P<token>[0-9a-f]{8})"
    r"(?P<ready>\.ready)?$"
)
#: A complete, fsynced temporary of a replacement in progress (``ready_path``).
READY = ".ready"
#: A replacement whose writer cannot be checked (another host) and whose ready marker has not
#: changed for this long is finished by the next reader: a publish takes milliseconds.
PUBLISH_STALL_S = 60.0
#: How long a reader waits for a live writer to finish its publish before giving up.
PUBLISH_WAIT_S = 5.0
#: errnos that can only come from writing, so a write callback's OSError with one is our write's
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


def temp_path(final: str | os.PathLike[str]) -> Path:
    """A unique temporary name beside ``final`` that records this host and process."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{host_name()}-{os.getpid()}-{secrets.token_hex(4)}")


def remove_stale_temporaries(
    final: str | os.PathLike[str], *, now: float | None = None
) -> list[Path]:
    """Delete the temporaries of ``final`` that killed writers left; returns what was removed.

    A temporary is stale when its writer process is gone (same host) or it has not been modified
    for ``STALE_AFTER_S``. A live writer's temporary is never touched, so two writers of the same
    file do not destroy each other's work (the later rename still wins)."""
    final = Path(final)
    now = time.time() if now is None else now
    removed = []
    for path in final.parent.glob(f".{glob.escape(final.name)}.tmp-*"):
        match = _TEMP.match(path.name)
        if match is None or match["name"] != final.name:
            continue
        try:
            old = now - path.stat().st_mtime > STALE_AFTER_S
        except FileNotFoundError:
            continue
        if old or owner_gone(match["host"], int(match["pid"])):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # the write that follows reports an unwritable folder itself
                logger.warning("cannot remove the stale temporary %s: %s", path, exc.strerror)
                continue
            removed.append(path)
    if removed:
        logger.info(
            "removed %d temporary file(s) of %s left by killed writers", len(removed), final
        )
    return removed


def require_folder(final: str | os.PathLike[str]) -> None:
    """Raise ConfigError unless ``final`` names a file (not ``''`` or ``dir/``, which would write
    hidden ``.bin``/``.idx`` files) in a folder that exists. Every command writes only into an
    existing folder, so a mistyped path creates nothing."""
    from ..errors import ConfigError

    text = os.fspath(final)
    if os.path.basename(text) in ("", ".", ".."):
        raise ConfigError(
            f"output {text!r} names a folder, not a file",
            path=text or None,
            hint="end the output with a file name, e.g. data/corpus (writes data/corpus.bin)",
        )
    require_existing_folder(Path(text).parent, text)


def require_existing_folder(folder: str | os.PathLike[str], path: str | None = None) -> None:
    """Raise ConfigError unless ``folder``, where an output goes, exists."""
    from ..errors import ConfigError

    if not Path(folder).is_dir():
        raise ConfigError(
            f"output folder {os.fspath(folder)!r} does not exist",
            path=path or os.fspath(folder),
            hint="create the folder first (mkdir -p) or choose another output path",
        )


def ready_path(tmp: Path, final: str | os.PathLike[str]) -> Path:
    """The name under which a complete temporary of ``final`` waits for its publish: the
    temporary ``tmp``'s host, process and token (those of the replacement's ``.bin``), plus
    ``.ready``. A reader that finds no ``.idx`` finishes a replacement whose files are all ready
    (``finish_publish``)."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{tmp.name.rsplit('.tmp-', 1)[1]}{READY}")


def finish_publish(idx_final: str | os.PathLike[str], *, wait_s: float = PUBLISH_WAIT_S) -> bool:
    """Finish a replacement of ``PREFIX.idx``/``.bin``/``.json`` that a writer began (its old
    ``.idx`` is gone, its new files are all complete: the ``.idx`` as ``ready_path``) and return
    True once ``idx_final`` exists; False when no replacement is under way.

    A live writer on this host is waited for (``wait_s``); a writer that is gone (killed), or one
    on another host whose ready ``.idx`` has not changed for ``PUBLISH_STALL_S``, is rolled
    forward here: the new ``.bin`` (unless already in place), then the new ``.idx`` (the commit),
    then the sidecar, each by one rename that another finisher may have done already. So a
    reader of a replaced output finds the old pair or the new one, never a loss of both."""
    final = Path(idx_final)
    markers = sorted(
        final.parent.glob(f".{glob.escape(final.name)}.tmp-*{READY}"),
        key=lambda p: _mtime(p) or 0.0,
    )
    if not markers:
        return final.exists()
    marker = markers[-1]
    match = _TEMP.match(marker.name)
    if match is None:
        return final.exists()
    deadline = time.monotonic() + wait_s
    host, pid = match["host"], int(match["pid"])
    while not owner_gone(host, pid) and time.time() - (_mtime(marker) or 0.0) < PUBLISH_STALL_S:
        if final.exists() or not marker.exists():
            return final.exists()
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    suffix = marker.name[len(f".{final.name}.tmp-") : -len(READY)]
    stem = final.with_suffix("")
    bin_final, json_final = stem.with_name(stem.name + ".bin"), stem.with_name(stem.name + ".json")
    moves = (
        (bin_final.with_name(f".{bin_final.name}.tmp-{suffix}"), bin_final),
        (marker, final),
        (json_final.with_name(f".{json_final.name}.tmp-{suffix}{READY}"), json_final),
    )
    for src, dst in moves:
        try:
            os.replace(src, dst)
        except FileNotFoundError:
            continue  # moved already: by the writer before it was killed, or by another reader
    fsync_dir(final.parent)
    logger.warning("finished the replacement of %s that a killed writer left half published", stem)
    return final.exists()


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def remove_temporaries(prefix: str | os.PathLike[str]) -> None:
    """Delete the temporaries that killed writers left for ``prefix``'s files (``prefix.*``).

    Only for a caller that owns ``prefix``: a writer still running on it would lose its file."""
    prefix = Path(prefix)
    for stale in prefix.parent.glob(f".{glob.escape(prefix.name)}.*.tmp-*"):
        stale.unlink(missing_ok=True)


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make renames inside ``folder`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_temp(final: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """``write(f)`` into a new temporary beside ``final``, fsynced; returns its path.

    A full disk, a read-only filesystem or a folder this user may not write raises StorageError
    and leaves no temporary behind."""
    tmp = temp_path(final)
    try:
        f = create_temp(tmp, final)
        try:
            try:
                write(f)
            except OSError as exc:
                if exc.errno in _WRITE_ERRNOS:
                    raise write_error(exc, final, "the file") from None
                raise
            sync_file(f, final)
        except BaseException:
            close_quietly(f)
            raise
        f.close()
    except BaseException:
        discard(tmp)
        raise
    return tmp


def write_atomic(
    final: str | os.PathLike[str], write: Callable[[BinaryIO], object], *, fsync_folder: bool = True
) -> None:
    """Write ``final`` atomically: ``write(f)`` into a temporary file beside it, fsync, rename.

    Failures are StorageErrors that leave no temporary behind (see ``write_temp``).
    ``fsync_folder=False`` leaves the folder's fsync to the caller (one for many files)."""
    tmp = write_temp(final, write)
    try:
        replace(tmp, final)
    except BaseException:
        discard(tmp)
        raise
    if fsync_folder:
        fsync_dir(Path(final).parent)


def create_temp(tmp: Path, final: str | os.PathLike[str]) -> BinaryIO:
    """Open the temporary ``tmp`` of ``final`` for writing; StorageError when that is refused."""
    try:
        return open(tmp, "wb")
    except OSError as exc:
        raise write_error(exc, final, "the file") from None


def sync_file(f: BinaryIO, final: str | os.PathLike[str]) -> None:
    """Flush and fsync ``f``: where a full disk shows up for buffered or delayed writes."""
    try:
        f.flush()
        os.fsync(f.fileno())
    except OSError as exc:
        raise write_error(exc, final, "the file") from None


def replace(tmp: str | os.PathLike[str], final: str | os.PathLike[str]) -> None:
    """``os.replace`` with a StorageError naming ``final`` on failure."""
    try:
        os.replace(tmp, final)
    except OSError as exc:
        raise write_error(exc, final, "the file") from None


def close_quietly(f: BinaryIO) -> None:
    """Close ``f`` after a failure; a second error (the unflushed buffer on a full disk) is moot."""
    try:
        f.close()
    except OSError:
        pass


def discard(path: str | os.PathLike[str]) -> None:
    """Remove a temporary, ignoring a failure (the original error matters more)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def write_bytes_atomic(final: str | os.PathLike[str], chunks: list[bytes] | bytes) -> None:
    """Write ``chunks`` to ``final`` atomically (temp file, fsync, rename)."""

    def write(f: BinaryIO) -> None:
        for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
            f.write(chunk)

    write_atomic(final, write)
