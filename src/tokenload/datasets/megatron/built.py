"""What a Megatron-order build makes of each dataset (its manifest entry and identifiers) and
where a prefix's caches go: shared by the builder and the packed rows' builder."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...caches import default_cache_dir
from ...storage import is_url, local_folder

__all__ = ["BuiltDataset", "BuiltMember", "built_member", "default_folder", "placeless"]


@dataclass(frozen=True)
class BuiltDataset:
    """A dataset the build made, with its build-manifest entry (None when no cache backs it)."""

    dataset: Any
    entry: dict[str, Any] | None


@dataclass(frozen=True)
class BuiltMember(BuiltDataset):
    """A per-prefix (mid-level) dataset, with Megatron's unique identifiers (its cache's
    description), of which a blend's identifiers are made."""

    identifiers: OrderedDict[str, Any]


def built_member(
    dataset: Any, entry: dict[str, Any] | None, uid: OrderedDict[str, Any], **fields: Any
) -> BuiltMember:
    """A per-prefix dataset and its manifest entry (None when no cache backs it), completed with
    ``fields`` (kind, prefix, length, samples per epoch, identity, token file facts, ...)."""
    if entry is not None:
        entry.update(fields)
    return BuiltMember(dataset, entry, uid)


def default_folder(path_to_cache: str | None, prefix: str | None) -> str | None:
    """Where a prefix's index caches go: ``path_to_cache``, else Megatron's folder beside the
    token file (a URL's is local, beside its index copy: never a folder named 's3:')."""
    if path_to_cache is not None or prefix is None:
        return path_to_cache
    return default_cache_dir(local_folder(prefix) if is_url(prefix) else prefix)


def placeless(uid: Mapping[str, Any]) -> OrderedDict[str, Any]:
    """Megatron's identifiers without the token file's path: with the files' content facts,
    the identity of a dataset that still holds after the files move."""
    out = OrderedDict(uid)
    if "dataset_path" in out:
        out["dataset_path"] = None
    return out
