"""Merge token files with the semantics of Megatron-LM's ``tools/merge_datasets.py``.

Inputs are concatenated in the given order (for a folder: every prefix in sorted basename order);
document indices are offset, ``.bin`` bytes copied. The dtype must agree across inputs. The result
is published by ``TokenFileWriter``, so a killed merge leaves no valid-looking output; the hidden
full-size temporaries a killed merge leaves are removed by the next merge into the same prefix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..errors import ConfigError
from .atomic import remove_stale_temporaries
from .idx import prefix_of
from .reader import TokenFile
from .sidecar import Sidecar, read_sidecar, sidecar_path
from .writer import TokenFileWriter


def prefixes_in(folder: str | os.PathLike[str]) -> list[str]:
    """Every token file prefix in ``folder``, sorted by basename; every .idx needs its .bin."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(
            f"--input {str(folder)!r} is not a folder",
            hint="pass a folder holding PREFIX.bin/PREFIX.idx pairs, or list the prefixes explicitly",
        )
    stems: dict[str, set[str]] = {}
    for entry in folder.iterdir():
        if entry.suffix in (".bin", ".idx") and not entry.name.startswith("."):
            stems.setdefault(entry.stem, set()).add(entry.suffix)
    unpaired = sorted(s + next(iter(exts)) for s, exts in stems.items() if len(exts) != 2)
    if unpaired:
        raise ConfigError(
            f"{len(unpaired)} file(s) without their pair in {str(folder)!r}: {', '.join(unpaired[:5])}",
            hint="every PREFIX.bin needs its PREFIX.idx and the reverse; remove or complete them",
        )
    if not stems:
        raise ConfigError(
            f"no .bin/.idx pairs in {str(folder)!r}",
            hint="point --input at the folder holding the token files to merge",
        )
    return [str(folder / stem) for stem in sorted(stems)]


def merge_token_files(prefixes: Sequence[str], output_prefix: str | os.PathLike[str]) -> Sidecar:
    """Concatenate ``prefixes`` into ``output_prefix``; returns the new sidecar."""
    if not prefixes:
        raise ConfigError("nothing to merge", hint="give at least one input prefix")
    files = [TokenFile(p, mode="pread") for p in prefixes]
    dtypes = {}
    for f in files:  # opened one at a time (thousands of shards must not exhaust file handles)
        dtypes[f.prefix] = f.dtype
        f.close()
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{p} ({d})" for p, d in dtypes.items())
        raise ConfigError(
            f"inputs have different token dtypes: {listing}",
            hint="merge only files made with the same tokenizer; Megatron's merge refuses them too",
        )
    out = prefix_of(output_prefix)
    if any(os.path.abspath(f.prefix) == os.path.abspath(out) for f in files):
        raise ConfigError(
            f"output prefix {out!r} is also an input",
            hint="choose an --output-prefix outside the inputs",
        )
    for final in (out + ".bin", out + ".idx", sidecar_path(out)):
        remove_stale_temporaries(final)
    with TokenFileWriter(out, files[0].dtype, tokenizer=_common_tokenizer([f.prefix for f in files])) as writer:
        for f in files:
            writer.append(f)
            f.close()
        return writer.finalize()


def _common_tokenizer(prefixes: Sequence[str]) -> dict | None:
    """The tokenizer identity shared by every input's sidecar, if they all have the same one."""
    identities = []
    for p in prefixes:
        sidecar = read_sidecar(p)
        identities.append(None if sidecar is None else sidecar.tokenizer)
    first = identities[0]
    return first if all(i == first for i in identities) else None
