"""Files that appear whole or not at all.

A writer writes under a hidden temporary name in the target folder (same filesystem, so the
final ``os.replace`` is atomic) and renames at the end; a crash or kill leaves only a
``.tmp-*`` file that no reader ever opens.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import BinaryIO, Callable


def temp_path(final: str | os.PathLike[str]) -> Path:
    """A unique temporary name beside ``final``."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


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


def write_atomic(final: str | os.PathLike[str], write: Callable[[BinaryIO], object], *, fsync_folder: bool = True) -> None:
    """Write ``final`` atomically: ``write(f)`` into a temporary file beside it, fsync, rename.

    ``fsync_folder=False`` leaves the folder's fsync to the caller (one for many files)."""
    tmp = temp_path(final)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync_folder:
        fsync_dir(Path(final).parent)


def write_bytes_atomic(final: str | os.PathLike[str], chunks: list[bytes] | bytes) -> None:
    """Write ``chunks`` to ``final`` atomically (temp file, fsync, rename)."""

    def write(f: BinaryIO) -> None:
        for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
            f.write(chunk)

    write_atomic(final, write)
