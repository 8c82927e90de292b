"""Build policies: which process of a job builds, writes, loads or waits for the index caches.

``build_datasets`` runs on every rank. Each rank takes one ``Role`` from the policy and its place
in the ``World`` (``resolve``):

* ``WRITE``: check the cache, build what is missing or stale and write it atomically;
* ``CHECK``: check the cache and load it on a hit; on a miss build in memory and write nothing;
* ``READ``: load only; a cache that is missing or stale is one ``CacheError`` (``missing_cache``),
  never a build;
* ``MEMORY``: build in memory; no cache file is read or written.

Whatever the policy, at most one process of a job writes a cache file (one per node for the
node-local folders of ``local-rank0``), and only ``rank0`` and ``local-rank0`` call a collective:
one barrier per ``build_datasets`` call, after the writer's build and before the readers' loads.
"""

from __future__ import annotations

import enum
import json
import os
import shlex
from collections.abc import Sequence
from typing import NamedTuple

from ...distributed import World
from ...errors import CacheError
from ...index import Blend
from ..config import BUILD_POLICIES, MegatronOptions, SupportsTyped

__all__ = ["BUILD_POLICIES", "PolicyRole", "Role", "missing_cache", "prepare_command", "resolve"]


class Role(str, enum.Enum):
    """What one process does with the caches (see the module docstring)."""

    WRITE = "write"
    CHECK = "check"
    READ = "read"
    MEMORY = "memory"


class PolicyRole(NamedTuple):
    """This process's part in a build policy."""

    role: Role
    barrier: bool
    """Whether the policy calls its one barrier (``rank0``, ``local-rank0``)."""


def resolve(policy: str, world: World, cache: str) -> PolicyRole:
    """This process's role and whether the policy needs the one barrier.

    ``cache="off"`` (no cache I/O at all) makes every policy a build in memory, with no barrier:
    there is nothing to wait for."""
    if cache == "off" or policy == "every-rank":
        return PolicyRole(Role.MEMORY, False)
    if policy == "none":
        return PolicyRole(Role.READ, False)
    if policy == "auto":
        return PolicyRole((Role.WRITE if world.rank == 0 else Role.CHECK), False)
    if world.world_size == 1:
        return PolicyRole(Role.WRITE, False)
    writer = world.rank == 0 if policy == "rank0" else world.local_rank == 0
    return PolicyRole((Role.WRITE if writer else Role.READ), True)


def missing_cache(
    policy: str,
    missing: Sequence[str],
    folders: Sequence[str],
    command: str,
    near: Sequence[str] = (),
) -> CacheError:
    """The error of a ``READ`` role that found caches missing or stale: every file (or reason),
    the caches beside them that nearly match (``near``: ``near_miss.near_misses``), and the
    command that makes them."""
    shown = list(missing[:8]) + ([f"... {len(missing) - 8} more"] if len(missing) > 8 else [])
    after = (
        ""
        if policy == "none"
        else " after the writer's build (is the cache folder shared by every rank that reads it?)"
    )
    places = sorted(set(folders))
    local = [f for f in places if f and "://" not in f]  # (stat'ed on this error path only)
    absent = [f for f in local if not os.path.exists(f)]
    files = [f for f in local if os.path.exists(f) and not os.path.isdir(f)]
    if absent or files:  # a mistyped cache folder reads as caches missing: say what was found
        what = "; ".join(
            [f"the cache folder {f} does not exist" for f in absent]
            + [f"{f} is a file, not a folder" for f in files]
        )
        every = "all " if len(absent) + len(files) == len(places) else ""
        found = f"{what}, so {every}{len(missing)} are"
        check = "check the path of that cache folder; if it is right, "
    else:
        found, check = f"{len(missing)} are", ""
    nearly = ""
    if near:  # one value written otherwise names other files: say which, before "prepare"
        nearly = f". Nearly matching: {'; '.join(near[:3])}"
        check = check or (
            "if the job meant the values of a cache found here, give them as it was prepared; else "
        )
    return CacheError(
        f"build_policy={policy!r} loads index caches only, and {found} missing or stale"
        f"{after}: {'; '.join(shown)}; expected complete caches in {', '.join(places)}{nearly}",
        hint=f"{check}build them first, in one process, with: {command}  (or use"
        " build_policy='auto')",
    )


def prepare_command(config: SupportsTyped, sizes: Sequence[int | None]) -> str:
    """The ``tokenload prepare-cache`` command line that writes exactly the caches of ``config``
    (its typed records: a ``MegatronDataConfig`` converts) for these sample counts: in
    Megatron's flag names where its arithmetic reaches them (a global batch of 1, so that
    iterations are samples: train = T, valid = (T // interval + 1) x eval_iters, test =
    eval_iters; ``--full-validation`` for one epoch of valid), else with the counts given
    outright (``--train-valid-test-num-samples``)."""
    data, order = config.typed()
    options = order if isinstance(order, MegatronOptions) else MegatronOptions()
    args = ["tokenload", "prepare-cache"]
    if data.blend is not None:
        args += ["--data-path", *_blend_items(data.blend)]
    elif data.blend_per_split is not None:
        for flag, blend in zip(
            ("--train-data-path", "--valid-data-path", "--test-data-path"), data.blend_per_split
        ):
            if blend is not None:
                args += [flag, *_blend_items(blend)]
    if data.split is not None and data.blend is not None:
        args += ["--split", data.split]  # as written: it is part of the caches' names
    args += ["--seq-length", str(data.sequence_length), "--seed", str(data.random_seed)]
    if options.path_to_cache is not None:
        args += ["--data-cache-path", options.path_to_cache]
    args += _length_flags(sizes)
    if options.tokenizer is not None:
        args += ["--tokenizer-identity", json.dumps(dict(options.tokenizer), separators=(",", ":"))]
    if not data.add_extra_token:
        args.append("--no-add-extra-token")
    if not data.drop_last_partial_validation_sequence:
        args.append("--no-drop-last-partial-validation-sequence")
    if data.mid_level_dataset_surplus != 0.005:
        args += ["--mid-level-dataset-surplus", repr(data.mid_level_dataset_surplus)]
    if options.schedule is not None:
        entries = [[s, list(ws)] for s, ws in options.schedule]
        args += ["--weights-schedule", json.dumps(entries, separators=(",", ":"))]
    if data.packing != "concat":
        args += ["--packing", data.packing]
        if data.max_documents_per_row is not None:
            args += ["--max-documents-per-row", str(data.max_documents_per_row)]
    folder = options.path_to_cache
    if folder is not None and "://" not in folder and not os.path.isdir(folder):
        return f"mkdir -p {shlex.quote(folder)} && {shlex.join(args)}"  # commands make no folder
    return shlex.join(args)


def _blend_items(blend: Blend) -> list[str]:
    """A blend as ``--data-path`` items: weights as short as they read (``2`` for 2.0)."""
    if blend.weights is None:
        return list(blend.prefixes)
    return [x for w, p in zip(blend.weights, blend.prefixes) for x in (_number(w), p)]


def _number(weight: float) -> str:
    return str(int(weight)) if float(weight).is_integer() else repr(float(weight))


def _length_flags(sizes: Sequence[int | None]) -> list[str]:
    """Flags that give exactly these sample counts: Megatron's length flags with a global batch
    of 1 when its arithmetic reaches them, else tokenload's ``--train-valid-test-num-samples``
    (``epoch`` for a split of one epoch, which no Megatron flag but ``--full-validation`` says)."""
    train, valid, test = ([*list(sizes), None, None, None])[:3]
    flags = _megatron_length_flags(train, valid, test)
    if flags is not None:
        return flags
    return [
        "--train-valid-test-num-samples",
        *("epoch" if n is None else str(n) for n in (train, valid, test)),
    ]


def _megatron_length_flags(
    train: int | None, valid: int | None, test: int | None
) -> list[str] | None:
    if train is None or test is None:
        return None
    flags = ["--global-batch-size", "1", "--train-samples", str(train), "--eval-iters", str(test)]
    if valid is None:
        return [*flags, "--full-validation"]
    if not valid and not test:
        return [*flags, "--eval-interval", "1"]
    interval = _eval_interval(train, valid, test)
    return None if interval is None else [*flags, "--eval-interval", str(interval)]


def _eval_interval(train: int, valid: int, test: int) -> int | None:
    """An interval I with ``(train // I + 1) * test == valid``, or None."""
    if test == 0 or valid % test:
        return None
    evals = valid // test - 1  # train // I must equal this
    if evals < 0:
        return None
    if evals == 0:
        return train + 1
    interval = train // evals
    return interval if interval > 0 and train // interval == evals else None
