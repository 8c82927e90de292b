"""Who made a temporary file or folder: this host's name as temporaries record it, and whether
the process that made one has surely exited.

Local temporaries (``format.atomic``: ``.NAME.tmp-HOST-PID-XXXXXXXX``) and staging folders
(``upload``: ``PREFIX@HOST@PID@...``) record their maker, so that a later writer removes a
killed writer's leftovers and never a live one's.
"""

from __future__ import annotations

import os
import re
import socket


def host_name() -> str:
    """This host's name as temporaries record it (letters, digits, '_' and '.')."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


def owner_gone(host: str | None, pid: int) -> bool:
    """Whether the process that made a temporary has surely exited (only knowable on this host)."""
    if host is not None and host != host_name():
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    return False
