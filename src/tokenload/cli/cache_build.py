"""What ``tokenload prepare-cache`` does with the data once its flags are read, whether they are a
Megatron job's (``cache.py``) or a GPT-NeoX config's (``cache_neox.py``): the token files opened
under a progress bar, the caches built in this one process as rank 0, the files written listed,
the result reported; and the packing flags, which ``explain`` and ``where`` take too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import CacheError, ConfigError
from ..format import TokenFile
from ..format.sequences import unique_prefixes
from ..index import Blend
from ..megatron_args import positive
from ..storage import is_url
from ..storage.upload import list_objects

__all__ = [
    "LAUNCHER_VARS",
    "build_caches",
    "build_here",
    "check_cache_folder",
    "check_packing_flags",
    "listings",
    "open_all",
    "packing_flags",
    "prefixes_of",
    "report_result",
]

#: The launcher variables ``World.detect`` reads: prepare-cache is one process whatever the shell.
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_NODEID",
)


# -- the blend flags both commands share ----------------------------------------------------------
def prefixes_of(blend: Blend | None, per_split: list[Blend | None] | None) -> list[str]:
    blends = [blend] if blend is not None else list(per_split or [])
    return unique_prefixes(b.prefixes if b is not None else None for b in blends)


def _progress(items: list[str], what: str) -> Iterable[str]:
    """A tqdm bar over ``items`` on a terminal; the plain list elsewhere (logs, pipes, tests)."""
    if not sys.stderr.isatty():
        return items
    from tqdm import tqdm

    return tqdm(items, desc=what, unit="prefix", file=sys.stderr)


def open_all(prefixes: list[str], what: str) -> Iterator[tuple[str, TokenFile]]:
    """Each prefix's token file, opened (header read, sizes checked), under a progress bar."""
    for prefix in _progress(prefixes, what):
        token_file = TokenFile(prefix)
        _ = token_file.header  # opens now: a missing or damaged file fails here, named
        yield prefix, token_file


def packing_flags(g: argparse._ArgumentGroup) -> None:
    """``--packing`` and ``--max-documents-per-row``: the job's packing (prepare-cache, explain,
    where)."""
    g.add_argument(
        "--packing",
        choices=("concat", "best-fit"),
        default=None,  # concat (check_packing_flags): None tells the flag was not given
        help="the job's MegatronDataConfig(packing=...): 'best-fit' reads rows of whole"
        " documents (its own plan and caches) instead of Megatron's concatenated samples",
    )
    g.add_argument(
        "--max-documents-per-row",
        type=positive(int),
        default=None,
        metavar="N",
        help="the job's max_documents_per_row (with --packing best-fit)",
    )


def check_packing_flags(args: argparse.Namespace) -> None:
    """A cap on documents per row without packed rows is refused in the flags' words, before
    anything is read or created. The provider's ``--tokenload-packing`` (prepare-cache) is
    ``--packing``."""
    provider = getattr(args, "tokenload_packing", None)
    if args.packing is not None and provider is not None and args.packing != provider:
        raise ConfigError(
            f"--packing {args.packing} and --tokenload-packing {provider} disagree",
            hint="give one of them (--tokenload-packing is the job's, from its command line)",
        )
    args.packing = args.packing or provider or "concat"
    if args.max_documents_per_row is not None and args.packing != "best-fit":
        raise ConfigError(
            f"--max-documents-per-row {args.max_documents_per_row} applies to --packing"
            f" best-fit only; --packing is {args.packing}",
            hint="add --packing best-fit (the job's packing), or drop --max-documents-per-row",
        )


def build_here(config: Any, samples: list[int | None]) -> tuple[Any, Any, Any]:
    from ..datasets import build_datasets

    # one process of rank 0, whatever launcher started it (as Megatron's tool)
    for name in LAUNCHER_VARS:
        os.environ.pop(name, None)
    try:
        return build_datasets(config, samples)
    except CacheError as exc:
        if not exc.message.startswith("cannot write the index cache"):
            raise
        # the library's hint offers an in-memory build: no way out for a command that writes
        raise CacheError(
            exc.message,
            path=exc.path,
            hint="free space on that filesystem, or pass another --data-cache-path (the"
            " training job's, which reads the caches there)",
        ) from None


def check_cache_folder(folder: str) -> None:
    """A local cache folder that exists is a folder; a missing one is made with its parents by
    the build, when it writes the first cache file (so a command that fails first makes none)."""
    if is_url(folder):
        return
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ConfigError(
            f"--data-cache-path {folder!r} is a file, not a folder",
            path=folder,
            hint="pass the training job's cache folder",
        )
    if os.path.isdir(folder):
        return
    above = os.path.dirname(os.path.abspath(folder))  # the folder it would be made in
    while not os.path.exists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    if not os.path.isdir(above) or not os.access(above, os.W_OK | os.X_OK):
        what = "is a file" if not os.path.isdir(above) else "cannot be written"
        raise ConfigError(
            f"cannot write the cache folder {folder!r}: {above!r} {what}; expected a folder"
            " that can be made there",
            path=folder,
            hint="pass a --data-cache-path in a writable folder (the training job's)",
        )


def _listing(folder: str) -> set[str]:
    """Names of the files in ``folder``, local or in object storage."""
    if is_url(folder):
        return {url.rsplit("/", 1)[1] for url in list_objects(folder)}
    try:
        return set(os.listdir(folder))
    except FileNotFoundError:
        return set()


def listings(folders: list[str]) -> set[str]:
    """The files of one folder by name, of several by path."""
    if len(folders) == 1:
        return _listing(folders[0])
    return {os.path.join(f, name) for f in folders for name in _listing(f)}


def report_result(args: argparse.Namespace, result: dict[str, Any], prefixes: int) -> None:
    if args.json:
        print(json.dumps(result))
        return
    print(f"finished: {prefixes} token files, {len(result['files_written'])} files written")
    for name in ("train", "valid", "test"):
        print(f"  {name + ' dataset length':<22}{result[f'{name}_dataset_length']}")


def build_caches(
    config: Any, samples: list[int | None], prefixes: list[str], folder: str | None
) -> tuple[tuple[Any, Any, Any], list[str]]:
    """The token files checked (opened under a progress bar), then the caches of ``config`` for
    ``samples`` built here; the datasets, and the files written in the cache folder (``folder``,
    the job's ``--data-cache-path``; without it, Megatron's folder beside each token file, as the
    job's build)."""
    for _ in open_all(prefixes, "checking token files"):
        pass
    from ..datasets.megatron.built import default_folder

    folders = (
        [folder] if folder is not None else sorted({str(default_folder(None, p)) for p in prefixes})
    )
    if folder is not None:
        check_cache_folder(folder)  # the build makes it when it writes a file
    before = listings(folders)
    datasets = build_here(config, samples)
    return datasets, sorted(listings(folders) - before)
