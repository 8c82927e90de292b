"""The requirements that `.ci/megatron-venv.sh` installs beside torch and megatron-core, which it
installs with --no-deps: tokenload's own (pyproject.toml), then those of each distribution named
on the command line, less CUDA's libraries (nvidia-*, cuda-*), torch itself and optional extras.
triton stays: megatron-core imports it unguarded (megatron.core.transformer.moe.ops.paged_stash,
reached from `import megatron.core`). One per line, for pip.

Usage: python .ci/megatron_deps.py DIST...   (run by the venv's Python, from the repository root)
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import requires

import tomllib
from pip._vendor.packaging.requirements import Requirement

SKIP = re.compile(r"^(nvidia|cuda|torch$)", re.I)


def main(dists: list[str]) -> None:
    with open("pyproject.toml", "rb") as f:
        out = list(tomllib.load(f)["project"]["dependencies"])
    for dist in dists:
        for line in requires(dist) or []:
            req = Requirement(line)
            if SKIP.match(req.name) or (req.marker and not req.marker.evaluate({"extra": ""})):
                continue
            out.append(str(req))
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
