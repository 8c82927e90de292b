"""Files that appear whole or not at all.

A writer writes under a hidden temporary name in the target folder (same filesystem, so the
final ``os.replace`` is atomic) and renames at the end; a crash or kill leaves only a
``.tmp-*`` file that no reader ever opens.
"""

from __future__ import annotations

import glob
import os
import secrets
from pathlib import Path
from typing import BinaryIO, Callable


def temp_path(final: str | os.PathLike[str]) -> Path:
    """A unique temporary name beside ``final``."""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def require_folder(final: str | os.PathLike[str]) -> None:
    """Raise ConfigError unless the folder that will hold ``final`` exists."""
    from ..errors import ConfigError

    folder = Path(final).parent
    if not folder.is_dir():
        raise ConfigError(
            f"output folder {str(folder)!r} does not exist",
            path=os.fspath(final),
            hint="create the folder first or choose another --output-prefix",
        )


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
