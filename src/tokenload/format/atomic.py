"""Files that appear whole or not at all.

A writer writes under a hidden temporary name in the target folder (same filesystem, so the
final ``os.replace`` is atomic) and renames at the end; a crash or kill leaves only a
``.tmp-*`` file that no reader ever opens.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


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


def write_bytes_atomic(final: str | os.PathLike[str], chunks: list[bytes] | bytes) -> None:
    """Write ``chunks`` to ``final`` atomically (temp file, fsync, rename)."""
    tmp = temp_path(final)
    try:
        with open(tmp, "wb") as f:
            for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(Path(final).parent)
