"""Caches a loading rank did not find, and the ones beside them that nearly match.

Under ``build_policy="none"`` (or a rank that only loads) a cache is found by the hash of its
description: one value written otherwise (the prefix relative instead of absolute, packing left
out, another sample count) names other files, and the job sees every cache as missing. On that
error path only, the cache folder's descriptions of the same split are read and the closest one
is named with the values it differs in, so that the user changes the value rather than
preparing caches for a job they did not mean."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["near_misses"]

_SUFFIX = "-description.txt"
_MOST_READ = 200
"""Descriptions read per folder at most (each a few hundred bytes): a bounded error path."""
_MOST_DIFFERENT = 3
"""A cache that differs in more values than this is no near miss."""


def near_misses(wanted: Sequence[tuple[str, str]]) -> list[str]:
    """For each ``(folder, description)`` a loading rank missed: the cache of the same split in
    that folder whose description differs in the fewest values (at most ``_MOST_DIFFERENT``),
    as a sentence naming them; none for a folder in object storage or one that cannot be read."""
    notes: list[str] = []
    listings: dict[str, list[str]] = {}
    for folder, description in wanted:
        if "://" in folder:
            continue
        try:
            want = json.loads(description)
        except ValueError:
            continue
        if folder not in listings:
            try:
                listings[folder] = sorted(os.listdir(folder))
            except OSError:
                listings[folder] = []
        note = _closest(folder, listings[folder], want)
        if note is not None and note not in notes:
            notes.append(note)
    return notes


def _closest(folder: str, names: list[str], want: dict[str, Any]) -> str | None:
    split = want.get("index_split")
    best: tuple[list[str], str, dict[str, Any]] | None = None
    candidates = [n for n in names if n.endswith(f"-{split}{_SUFFIX}")][:_MOST_READ]
    for name in candidates:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                have = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(have, dict):
            continue
        differ = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        if differ and (best is None or len(differ) < len(best[0])):
            best = (differ, name[: -len(_SUFFIX)], have)
    if best is None or len(best[0]) > _MOST_DIFFERENT:
        return None
    differ, name, have = best
    values = ", ".join(
        f"{k} {_shown(have.get(k))} (this job: {_shown(want.get(k))})" for k in differ
    )
    note = f"{folder} holds {name}, which differs from this job's only in {values}"
    if "dataset_path" in differ:
        note += (
            "; caches are named by each prefix as written (relative or absolute, with or"
            " without './'): write it as it was prepared"
        )
    if "class" in differ and {have.get("class"), want.get("class")} == {
        "GPTDataset",
        "PackedGPTDataset",
    }:
        note += "; PackedGPTDataset caches are packing='best-fit' (--packing best-fit)"
    return note


def _shown(value: Any) -> str:
    """A description value in a few words (a packing record or a tokenizer in one line)."""
    if value is None:
        return "none"
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 120 else text[:117] + "..."
