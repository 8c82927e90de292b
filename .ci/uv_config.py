"""uv's configuration for the package sources that pip's configuration names on this machine.

uv reads neither pip.conf nor PIP_* variables. This reads pip's effective configuration (`pip
config list`: its files, then PIP_* variables over them) and writes, as a uv.toml, the indexes
(index-url, extra-index-url) and find-links folders that pip would search, with pip's way of
choosing among them: the best version found in any of them (uv's `unsafe-best-match`; uv's own
default takes a package from the first index that has it). It prints the constraint files that
pip's configuration names (pip applies them to every install; uv takes them from
UV_CONSTRAINT), space-separated, on one line (empty if none).

Usage: python .ci/uv_config.py OUT.toml   (run by the Python whose pip the venvs would use)
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

#: pip's option -> (uv.toml's key, whether it holds a list)
KEYS = {
    "index-url": ("index-url", False),
    "extra-index-url": ("extra-index-url", True),
    "find-links": ("find-links", True),
}


def pip_config() -> dict[str, list[str]]:
    """pip's value of each option that matters here, as pip's install command would see it:
    a PIP_* variable over the [install] section over the [global] one."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True, check=False).stdout
    rank = {"global": 0, "install": 1, ":env:": 2}
    found: dict[str, tuple[int, list[str]]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if not sep or section not in rank:
            continue
        words = [w for part in shlex.split(value) for w in part.split()]
        if name not in found or rank[section] >= found[name][0]:
            found[name] = (rank[section], words)
    return {name: words for name, (_, words) in found.items()}


def main(path: str) -> None:
    config = pip_config()
    lines = ["# written by .ci/uv_config.py from pip's configuration (pip config list)",
             'index-strategy = "unsafe-best-match"']
    for option, (key, many) in KEYS.items():
        words = config.get(option, [])
        if words:
            lines.append(f"{key} = {json.dumps(words if many else words[0])}")
    tmp = Path(path + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)  # the background build and .ci/run may write it at the same time
    print(" ".join(config.get("constraint", [])))


if __name__ == "__main__":
    main(sys.argv[1])
