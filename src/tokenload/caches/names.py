"""Cache identity and file names, compatible with Megatron's index cache in both directions.

Identity: Megatron describes a dataset by an ordered JSON object (``json.dumps(indent=4)``,
floats by ``repr``, ASCII), hashes it with md5, and names four files after the hash, the class
and the split: ``{md5}-{Class}-{split}-description.txt`` and ``...-{array}.npy``. A cache hit
for Megatron is "all four files exist". The identity functions here reproduce the JSON byte for
byte; the tokenizer identity is taken verbatim from the caller (it is whatever Megatron's
tokenizer object reports, and recomputing it would tie tokenload to one Megatron release).

Writing, loading and checking the files is ``tokenload.caches.files``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import jsontext

__all__ = [
    "BLENDED_ARRAYS",
    "CACHE_FILE_NAME",
    "GPT_ARRAYS",
    "CacheFiles",
    "blended_identifiers",
    "default_cache_dir",
    "describe",
    "description_hash",
    "gpt_identifiers",
    "segment_identifiers",
]

GPT_ARRAYS: tuple[str, ...] = ("document_index", "sample_index", "shuffle_index")
"""The arrays of a ``GPTDataset`` / ``MockGPTDataset`` cache."""

BLENDED_ARRAYS: tuple[str, ...] = ("dataset_index", "dataset_sample_index")
"""The arrays of a ``BlendedDataset`` cache."""

PACKED_ARRAYS: tuple[str, ...] = ("row_index", "piece_index", "piece_part")
"""The arrays of a ``PackedGPTDataset`` cache (tokenload's packed rows; Megatron has none)."""

CACHE_FILE_NAME = re.compile(
    r"^[0-9a-f]{32}-(?:[A-Za-z]+-(?:train|valid|test)-(?:description\.txt|tokenload\.json|"
    r"[a-z_]+\.npy)|tokenload-build\.json)$"
)
"""The names of a cache folder's files: each cache's (``CacheFiles``) and build manifests."""


def gpt_identifiers(
    *,
    dataset_path: str | None,
    num_samples: int | None,
    index_split: str,
    random_seed: int,
    sequence_length: int,
    split: str | None,
    split_matrix: Sequence[Sequence[float] | None] | None,
    tokenizer: Mapping[str, Any] | None,
    class_name: str = "GPTDataset",
) -> OrderedDict[str, Any]:
    """Megatron's ``unique_identifiers`` of a GPT dataset, in its field order.

    ``dataset_path`` is the prefix exactly as in the blend (``None`` for mock data),
    ``num_samples`` the *requested* count (``None`` for one epoch), ``split``/``split_matrix``
    the config's (``None`` in per-split-blend mode), ``tokenizer`` the tokenizer's identity
    mapping verbatim (e.g. ``{"class": ..., "tokenizer_path": ..., ...}``).
    """
    uid: OrderedDict[str, Any] = OrderedDict()
    uid["class"] = class_name
    uid["dataset_path"] = dataset_path
    uid["num_samples"] = num_samples
    uid["index_split"] = index_split
    uid["random_seed"] = random_seed
    uid["sequence_length"] = sequence_length
    uid["split"] = split
    uid["split_matrix"] = (
        None if split_matrix is None else [None if b is None else list(b) for b in split_matrix]
    )
    uid["tokenizer"] = None if tokenizer is None else OrderedDict(tokenizer)
    return uid


def blended_identifiers(
    *,
    datasets: Sequence[Mapping[str, Any]],
    split: str,
    weights: Sequence[float] | Sequence[int],
    size: int | None,
) -> OrderedDict[str, Any]:
    """Megatron's ``unique_identifiers`` of a ``BlendedDataset``.

    ``datasets`` are the mid-level datasets' identifiers; ``weights``/``size`` as the blend is
    built with (``plan.resolve_blend``): normalized floats with a size, or the integer lengths
    with ``size=None`` for the exhaustive blend.
    """
    uid: OrderedDict[str, Any] = OrderedDict()
    uid["class"] = "BlendedDataset"
    uid["datasets"] = [OrderedDict(d) for d in datasets]
    uid["split"] = split
    uid["weights"] = list(weights)
    uid["size"] = size
    return uid


def segment_identifiers(
    *, split: str, entries: Sequence[tuple[Sequence[float], int]]
) -> OrderedDict[str, Any]:
    """The identifiers of a weights schedule's blending arrays (tokenload's, never Megatron's:
    no ``datasets``): per entry, Megatron's greedy over its ``weights`` for its ``size`` samples,
    the entries one after another. The greedy depends on nothing else, and every segment of an
    entry is a prefix of the entry's arrays. Named and written as a ``BlendedDataset`` cache
    (its two arrays)."""
    uid: OrderedDict[str, Any] = OrderedDict()
    uid["class"] = "BlendedDataset"
    uid["tokenload"] = "weights_schedule: Megatron's blending greedy per entry, one after another"
    uid["split"] = split
    uid["weights"] = [list(w) for w, _ in entries]
    uid["sizes"] = [int(n) for _, n in entries]
    return uid


def describe(identifiers: Mapping[str, Any]) -> str:
    """The description text: ``json.dumps(identifiers, indent=4)`` (floats by repr, ASCII), made
    by ``jsontext.dumps`` (the same bytes, faster)."""
    return jsontext.dumps(identifiers, indent=4)


def description_hash(description: str) -> str:
    """md5 hex digest of the description's UTF-8 bytes (the cache key)."""
    return hashlib.md5(description.encode("utf-8"), usedforsecurity=False).hexdigest()


def default_cache_dir(prefix: str, class_name: str = "GPTDataset") -> str:
    """Megatron's cache folder when none is configured: ``{prefix}/cache/{Class}_indices``.

    It is a folder literally named like the prefix (next to ``prefix.bin``). Mock datasets and
    blended datasets have no default: Megatron builds them in memory.
    """
    return os.path.join(prefix, "cache", f"{class_name}_indices")


@dataclass(frozen=True, kw_only=True)
class CacheFiles:
    """The file names of one dataset's cache."""

    directory: str
    """Cache folder."""

    hash: str
    """md5 of the description."""

    class_name: str
    """``GPTDataset``, ``MockGPTDataset``, ``BlendedDataset``, ..."""

    split: str
    """``train``, ``valid`` or ``test``."""

    arrays: tuple[str, ...]
    """Array names (``GPT_ARRAYS`` or ``BLENDED_ARRAYS``)."""

    @classmethod
    def of(
        cls,
        directory: str | os.PathLike[str],
        identifiers: Mapping[str, Any],
        description: str | None = None,
    ) -> CacheFiles:
        """The files of a dataset with these identifiers (GPT-like or ``BlendedDataset``);
        ``description``: ``describe(identifiers)`` when the caller has it already."""
        class_name = identifiers["class"]
        blended = class_name == "BlendedDataset"
        text = describe(identifiers) if description is None else description
        return cls(
            directory=os.fspath(directory),
            hash=description_hash(text),
            class_name=class_name,
            split=identifiers["split" if blended else "index_split"],
            arrays=BLENDED_ARRAYS
            if blended
            else PACKED_ARRAYS
            if class_name == "PackedGPTDataset"
            else GPT_ARRAYS,
        )

    def path(self, suffix: str) -> str:
        """``{directory}/{hash}-{Class}-{split}-{suffix}``."""
        return os.path.join(self.directory, f"{self.hash}-{self.class_name}-{self.split}-{suffix}")

    @property
    def description(self) -> str:
        """Path of Megatron's description file (the JSON text, no trailing newline)."""
        return self.path("description.txt")

    def array(self, name: str) -> str:
        """Path of one array's ``.npy`` file (``name`` from ``arrays``)."""
        return self.path(f"{name}.npy")

    @property
    def sidecar(self) -> str:
        """Path of tokenload's sidecar (Megatron ignores it)."""
        return self.path("tokenload.json")

    @property
    def megatron_files(self) -> tuple[str, ...]:
        """The files whose presence is Megatron's cache hit."""
        return (self.description, *(self.array(a) for a in self.arrays))
