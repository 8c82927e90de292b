"""A sample corpus that needs no download: the running Python's standard library source files.

Every ``.py`` file under the standard library folder (site-packages, dist-packages and caches
excluded), walked in sorted order, becomes one JSONL record ``{"text": ..., "path": ...}``
(``path`` relative to the library folder). The same Python version gives the same bytes.
``max_bytes`` stops before the file would exceed it; ``min_bytes`` repeats the pass (records
then carry ``"pass": k``) until it is reached, for throughput tests that need a bigger input.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import ConfigError
from ..format.atomic import require_folder, write_atomic

_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class CorpusSummary:
    """What ``write_stdlib_corpus`` wrote."""

    path: str
    documents: int
    bytes: int
    source_files: int


def stdlib_sources(root: str | None = None) -> Iterator[tuple[str, str]]:
    """(relative path, text) of each UTF-8 ``.py`` file of the standard library, in sorted order."""
    root = root or sysconfig.get_paths()["stdlib"]
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _EXCLUDED_DIRS and not d.startswith("."))
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (UnicodeDecodeError, OSError):  # a few test files are deliberately not UTF-8
                continue
            yield os.path.relpath(path, root), text


def write_stdlib_corpus(
    output: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    min_bytes: int | None = None,
    root: str | None = None,
) -> CorpusSummary:
    """Write the standard library as JSONL to ``output`` (atomically); returns what was written."""
    import json

    if max_bytes is not None and min_bytes is not None and min_bytes > max_bytes:
        raise ConfigError(
            f"min size {min_bytes} exceeds max size {max_bytes}",
            hint="lower `min_bytes=` or raise `max_bytes=`",
        )
    output = os.fspath(output)
    require_folder(output)
    documents = written = sources = 0

    def write(f: BinaryIO) -> None:
        nonlocal documents, written, sources
        kept: list[tuple[str, str]] = []  # the sources, read once, when more passes may follow
        for k in range(1 << 30):
            added = False
            for rel, text in stdlib_sources(root) if k == 0 else kept:
                if k == 0 and min_bytes is not None:
                    kept.append((rel, text))
                record = (
                    {"text": text, "path": rel}
                    if k == 0
                    else {"text": text, "path": rel, "pass": k}
                )
                line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
                if max_bytes is not None and written + len(line) > max_bytes:
                    break
                f.write(line)
                written += len(line)
                documents += 1
                added = True
                sources += k == 0
            else:
                if added and min_bytes is not None and written < min_bytes:
                    continue
            break

    write_atomic(output, write)
    return CorpusSummary(path=output, documents=documents, bytes=written, source_files=sources)
