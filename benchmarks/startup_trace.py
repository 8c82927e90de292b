"""Count one rank's filesystem operations of the data phase from its strace log.

The worker attaches ``strace -f -y -p PID`` (``STRACE_ARGS``) to itself just before the data
phase and detaches it just after, so the imports run untraced; ``-y`` prints the path of every
file descriptor argument, so reads, writes, fstats and maps are attributed to files without
keeping an fd table. The data phase is the part of the log between the worker's two marker stat
calls. Only operations on paths under the benchmark's data folder count (the token
files and every cache folder: what a shared filesystem would serve); imports of Python modules
that happen during the phase are left out (they hit the local software install).
"""

from __future__ import annotations

import re
from collections import Counter

TRACED = (
    "%file,read,pread64,readv,preadv,write,pwrite64,writev,fstat,mmap,getdents64"
)
STRACE_ARGS = ["strace", "-f", "-y", "-qq", "-s", "0", "-e", f"trace={TRACED}"]

BEGIN, END = "@@startup-bench-begin@@", "@@startup-bench-end@@"
OPENS = {"open", "openat", "openat2", "creat"}
STATS = {"stat", "lstat", "newfstatat", "statx", "access", "faccessat", "faccessat2", "readlink",
         "readlinkat", "fstatat64"}
READS = {"read", "pread64", "readv", "preadv", "preadv2"}
WRITES = {"write", "pwrite64", "writev", "pwritev", "pwritev2"}
RENAMES = {"rename", "renameat", "renameat2"}
OTHER_META = {"unlink", "unlinkat", "mkdir", "mkdirat", "getdents64", "rmdir", "chmod", "fchmodat",
              "utimensat", "link", "linkat", "symlink", "symlinkat"}
WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT")

_LINE = re.compile(r"^(\d+)\s+(.*)$")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FD_PATH = re.compile(r"^\s*-?\d+<([^>]*)>")


def _calls(lines):
    """(name, args, return text) per completed syscall, resumed calls joined to their start."""
    pending: dict[str, str] = {}
    for raw in lines:
        m = _LINE.match(raw.rstrip("\n"))
        if not m:
            continue
        pid, body = m.groups()
        if body.startswith("+++") or body.startswith("---"):
            continue
        if body.endswith("<unfinished ...>"):
            pending[pid] = body[: -len("<unfinished ...>")]
            continue
        if body.startswith("<... "):
            name = body[5:].split(" resumed>", 1)[0]
            start = pending.pop(pid, name + "(")
            body = start + body.split(" resumed>", 1)[1]
        paren = body.find("(")
        if paren <= 0:
            continue
        name = body[:paren]
        head, sep, ret = body.rpartition(") = ")
        if not sep:
            head, ret = body, "?"
        yield name, head[paren + 1:], ret.strip()


_RET = re.compile(r"^(-?\d+|0x[0-9a-f]+)")


def _ret(ret: str) -> int:
    m = _RET.match(ret)
    return int(m.group(1), 0) if m else -1


def phase_counts(log_path: str, root: str) -> dict:
    """Operations under ``root`` between the markers: opens, path stats, fstats, reads, writes,
    renames, other metadata calls, maps, and the files written (renamed-onto or written and not
    renamed away, i.e. final names, not temporaries)."""
    counts: Counter = Counter()
    written: set[str] = set()
    renamed_from: set[str] = set()
    inside = False
    with open(log_path, errors="replace") as f:
        for name, args, ret in _calls(f):
            if BEGIN in args:
                inside = True
                continue
            if END in args:
                break
            if not inside:
                continue
            _count(name, args, ret, root, counts, written, renamed_from)
    return {**counts, "written": sorted(written - renamed_from)}


def _count(name, args, ret, root, counts, written, renamed_from) -> None:
    paths = _QUOTED.findall(args)
    fd = _FD_PATH.match(args)
    fd_path = fd.group(1) if fd else ""
    if name in OPENS:
        if paths and paths[0].startswith(root):
            counts["opens"] += 1
            if _ret(ret) < 0:
                counts["opens_failed"] += 1
            elif any(flag in args for flag in WRITE_FLAGS):
                counts["opens_for_writing"] += 1
                written.add(paths[0])
    elif name in STATS:
        path = paths[0] if paths else ""
        if path == "" and fd_path.startswith(root):
            counts["fstats"] += 1
        elif path.startswith(root):
            counts["stats"] += 1
    elif name == "fstat":
        if fd_path.startswith(root):
            counts["fstats"] += 1
    elif name in READS:
        if fd_path.startswith(root):
            counts["reads"] += 1
            counts["bytes_read"] += max(_ret(ret), 0)
    elif name in WRITES:
        if fd_path.startswith(root):
            counts["writes"] += 1
            counts["bytes_written"] += max(_ret(ret), 0)
            written.add(fd_path)
    elif name in RENAMES:
        if len(paths) >= 2 and paths[1].startswith(root):
            counts["renames"] += 1
            renamed_from.add(paths[0])
            written.add(paths[1])
    elif name in OTHER_META:
        if (paths and paths[0].startswith(root)) or fd_path.startswith(root):
            counts["other_meta"] += 1
    elif name == "mmap":
        if root in args:
            counts["maps"] += 1
