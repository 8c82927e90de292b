"""Merge token files with the semantics of Megatron-LM's ``tools/merge_datasets.py``, and convert
GPT-NeoX's files (legacy TNTIDX, swapped float codes, no document boundaries) to megatron-core's.

Inputs are concatenated in the given order (for a folder: every prefix in sorted basename order);
document indices are offset, ``.bin`` bytes copied. The dtype must agree across inputs. The result
is published by ``TokenFileWriter``, so a killed merge leaves no valid-looking output; the hidden
full-size temporaries a killed merge leaves are removed by the next merge into the same prefix.
Inputs and output may be object-storage URLs (``s3://``): an input's ``.bin`` is downloaded to a
local temporary folder while it is copied, and an output is written in a local staging folder
and published when complete, its index last (``storage.upload``).
Converting is a merge of one input: whatever the input's format, the writer writes megatron-core's
MMIDIDX bytes for the same documents.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .atomic import remove_stale_temporaries, require_folder
from .idx import DtypeCodes, prefix_of
from .reader import TokenFile
from .sidecar import Sidecar, read_sidecar, sidecar_path
from .writer import TokenFileWriter


def prefixes_in(folder: str | os.PathLike[str]) -> list[str]:
    """Every token file prefix in ``folder`` (local, or a folder of objects such as
    ``s3://bucket/path``), sorted by basename; every .idx needs its .bin."""
    names, join = _listing(os.fspath(folder))
    stems: dict[str, set[str]] = {}
    for name in names:
        stem, suffix = os.path.splitext(name)
        if suffix in (".bin", ".idx") and not name.startswith("."):
            stems.setdefault(stem, set()).add(suffix)
    unpaired = sorted(s + next(iter(exts)) for s, exts in stems.items() if len(exts) != 2)
    if unpaired:
        raise ConfigError(
            f"{len(unpaired)} file(s) without their pair in {str(folder)!r}: "
            f"{', '.join(unpaired[:5])}",
            hint="every PREFIX.bin needs its PREFIX.idx and the reverse; remove or complete them",
        )
    if not stems:
        raise ConfigError(
            f"no .bin/.idx pairs in {str(folder)!r}",
            hint="name the folder that holds the token files to merge",
        )
    return [join(stem) for stem in sorted(stems)]


def _listing(folder: str) -> tuple[list[str], Callable[[str], str]]:
    """The file names in ``folder`` and how to make a path of one of them."""
    if is_url(folder):
        from ..storage.upload import list_objects

        base = folder.rstrip("/")
        names = [url.rsplit("/", 1)[1] for url in list_objects(base)]
        if not names:
            raise ConfigError(
                f"folder {folder!r} holds no objects",
                hint="check the URL of the folder holding PREFIX.bin/PREFIX.idx pairs",
            )
        return names, lambda stem: f"{base}/{stem}"
    if not os.path.isdir(folder):
        raise ConfigError(
            f"{folder!r} is not a folder",
            hint="pass a folder holding PREFIX.bin/PREFIX.idx pairs, or list the prefixes "
            "explicitly",
        )
    return os.listdir(folder), lambda stem: str(Path(folder) / stem)


def merge_token_files(
    prefixes: Sequence[str],
    output_prefix: str | os.PathLike[str],
    *,
    dtype_codes: DtypeCodes = "auto",
) -> Sidecar:
    """Concatenate ``prefixes`` into ``output_prefix``; returns the new sidecar."""
    if not prefixes:
        raise ConfigError("nothing to merge", hint="give at least one input prefix")
    files = [TokenFile(p, mode="pread", dtype_codes=dtype_codes) for p in prefixes]
    return _write(files, output_prefix, dtype_codes=dtype_codes)


def convert_token_file(
    prefix: str | os.PathLike[str],
    output_prefix: str | os.PathLike[str],
    *,
    dtype_codes: DtypeCodes = "auto",
) -> Sidecar:
    """Rewrite one token file as megatron-core's MMIDIDX: the bytes megatron-core's
    ``IndexedDatasetBuilder`` writes for the same documents, in the same dtype (for a float file,
    under megatron-core's dtype code). A legacy TNTIDX index, GPT-NeoX's float codes and its
    boundary-less ``document_indices == [0]`` (one document per sequence) all come out as
    megatron-core reads them. The sidecar's ``metadata.converted_from`` records the source."""
    source = TokenFile(prefix, mode="pread", dtype_codes=dtype_codes, allow_float=True)
    header = source.header
    origin = {
        "prefix": source.prefix,
        "index_format": header.index_format,
        "dtype_code": header.code,
        "documents_from_sequences": source.documents_from_sequences,
    }
    return _write([source], output_prefix, {"converted_from": origin}, dtype_codes)


def _write(
    files: list[TokenFile],
    output_prefix: str | os.PathLike[str],
    metadata: dict[str, Any] | None = None,
    dtype_codes: DtypeCodes = "auto",
) -> Sidecar:
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
    out = prefix_of(os.fspath(output_prefix))
    if not is_url(out):
        require_folder(out)  # before any work: '' or 'dir/' would write hidden '.bin' files
    if any(_same_place(f.prefix, out) for f in files):
        raise ConfigError(
            f"output prefix {out!r} is also an input",
            hint="choose an `output_prefix=` outside the inputs",
        )
    from ..storage.upload import fetched_prefix, staged_prefix

    tokenizer = _common_tokenizer([f.prefix for f in files])
    with staged_prefix(out) as local:  # an object-storage output: made locally, then published
        for final in (local + ".bin", local + ".idx", sidecar_path(local)):
            remove_stale_temporaries(final)
        with TokenFileWriter(
            local, files[0].dtype, tokenizer=tokenizer, metadata=metadata
        ) as writer:
            for f in files:
                if is_url(f.prefix):  # the writer copies .bin from a local file
                    with fetched_prefix(f.prefix) as copy:
                        writer.append(
                            TokenFile(
                                copy,
                                mode="pread",
                                dtype_codes=dtype_codes,
                                allow_float=f.allow_float,
                            )
                        )
                else:
                    writer.append(f)
                f.close()
            sidecar = writer.finalize()
    return sidecar


def is_url(path: str) -> bool:
    return "://" in path


def _same_place(a: str, b: str) -> bool:
    return a == b if is_url(a) or is_url(b) else os.path.abspath(a) == os.path.abspath(b)


def _common_tokenizer(prefixes: Sequence[str]) -> dict[str, Any] | None:
    """The tokenizer identity shared by every input's sidecar, if they all have the same one."""
    identities = []
    for p in prefixes:
        sidecar = read_sidecar(p)  # an object's sidecar is read from the bucket
        identities.append(None if sidecar is None else sidecar.tokenizer)
    first = identities[0]
    return first if all(i == first for i in identities) else None
