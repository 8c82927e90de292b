"""The build manifest: one JSON file per configuration that makes a cache hit one open.

A process that loads index caches dataset by dataset opens, per dataset, Megatron's description,
the tokenload sidecar and three ``.npy`` headers, and stats and hashes every token file: for a
blend of 100 prefixes, hundreds of metadata operations on every rank. The writer of a complete
build therefore also writes ``{md5}-tokenload-build.json`` into ``path_to_cache``, named by the
md5 of everything that decides the build (``manifest_key``: the blends as given, split, sizes,
sequence length, seed, tokenizer identity, the flags Megatron's hash forgets). It lists, per
split and dataset, the cache file names, the length, the arrays' shapes and xxh3-64 digests,
the identity (for the fingerprint) and the token file's content facts.

A loading rank reads it once and builds its datasets from it without opening anything else: the
lengths come from it, the ``.npy`` arrays are mapped on first use in the process that reads
(a loader worker) and their data verified there against the manifest's digests (what the
sidecar records, carried here: a sidecar lost or damaged since does not leave an array
unchecked, and no sidecar is read), and the token file's facts are compared where the file
opens anyway (``sources.stale_facts``). A manifest of version 1 (no digests) is ignored: the
caches are then checked one by one, as ``auto`` checks them. It is written last, atomically,
after every cache file it names, so a build killed part way leaves no manifest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...caches import jsontext
from ...caches.files import write_failure
from ...caches.names import BLENDED_ARRAYS, GPT_ARRAYS, PACKED_ARRAYS
from ...errors import CacheError
from ...format.atomic import write_atomic
from ...index import Blend
from ...storage import is_url
from ...storage.upload import copy_or_none, upload_bytes
from ..config import MegatronOptions, SupportsTyped
from .packed import PLAN_IDENTITY

__all__ = [
    "MANIFEST_FORMAT",
    "ManifestFile",
    "manifest_key",
    "manifest_path",
    "read_manifest",
    "write_manifest",
]

logger = logging.getLogger(__name__)

MANIFEST_FORMAT = "tokenload-build-manifest"
MANIFEST_VERSION = 2  # 2: each entry carries its arrays' digests


@dataclass(frozen=True)
class ManifestFile:
    """One build's manifest: its path (``manifest_path``) and the key it is written for."""

    path: str
    key: dict[str, Any]


def manifest_key(config: SupportsTyped, sizes: Sequence[int | None]) -> dict[str, Any]:
    """Everything that decides which datasets a build makes and their indices (not the item
    layout, the read mode or the policies), in JSON form, from ``config``'s typed records (a
    ``MegatronDataConfig`` converts; the builder passes its own)."""
    data, order = config.typed()
    tokenizer = order.tokenizer if isinstance(order, MegatronOptions) else None
    return {
        "blend": _items(data.blend),
        "blend_per_split": None
        if data.blend_per_split is None
        else [_items(b) for b in data.blend_per_split],
        "split": data.split,
        "sizes": list(sizes),
        "sequence_length": data.sequence_length,
        "random_seed": data.random_seed,
        "tokenizer": None if tokenizer is None else dict(tokenizer),
        "add_extra_token": data.add_extra_token,
        "drop_last_partial_validation_sequence": data.drop_last_partial_validation_sequence,
        "mid_level_dataset_surplus": data.mid_level_dataset_surplus,
        "mock": [data.source.vocab_size, data.source.eod_id] if data.mock else None,
        # packed rows are other datasets (a key only when asked: earlier manifests still match),
        # made by this code's rules (a manifest of plans laid out another way is never found)
        **(
            {"packing": [data.packing, data.max_documents_per_row, *PLAN_IDENTITY]}
            if data.packing != "concat"
            else {}
        ),
    }


def _items(blend: Blend | None) -> dict[str, Any] | None:
    """A blend in one spelling whatever it was given as (``["30", "p"]``, ``"30 p"``, a
    ``Blend``): prefixes as given, weights as floats."""
    if blend is None:
        return None
    return {
        "prefixes": list(blend.prefixes),
        "weights": None if blend.weights is None else [float(w) for w in blend.weights],
    }


def manifest_path(folder: str, key: dict[str, Any]) -> str:
    """``{folder}/{md5 of the key}-tokenload-build.json``."""
    text = json.dumps(key, separators=(",", ":"))
    digest = hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()
    return os.path.join(folder, f"{digest}-tokenload-build.json")


def read_manifest(path: str, key: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's splits when the file exists and belongs to ``key``, else None (one open;
    no existence probe; in object storage one HEAD, and a download when the node has no copy yet).
    A damaged manifest is None too: the caches are then checked one by one."""
    try:
        local = _local(path)
        if local is None:
            return None
        with open(local, "rb") as f:
            data = jsontext.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable build manifest %s: %s", path, exc)
        return None
    if (
        not isinstance(data, dict)
        or data.get("format") != MANIFEST_FORMAT
        or data.get("version") != MANIFEST_VERSION
    ):
        logger.warning("ignoring build manifest %s of another format or version", path)
        return None
    if data.get("key") != jsontext.plain_copy(key):
        logger.warning("ignoring build manifest %s written for another configuration", path)
        return None
    if not all(_digested(e) for e in data.get("splits") or () if e is not None):
        logger.warning("ignoring build manifest %s: an array without its digest", path)
        return None
    if not all(_named(e) for e in data.get("splits") or () if e is not None):
        logger.warning(
            "ignoring build manifest %s: a cache with other arrays than its kind's", path
        )
        return None
    return data


_ARRAYS = {"gpt": set(GPT_ARRAYS), "blended": set(BLENDED_ARRAYS), "packed": set(PACKED_ARRAYS)}


def _named(entry: Any) -> bool:
    """Whether a manifest entry (and each member of a blend's) lists exactly the arrays this code
    reads for its kind: one written by a version that laid them out otherwise is not used (the
    caches are then checked one by one, and a missing one is reported as such)."""
    wanted = _ARRAYS.get(str(entry.get("kind"))) if isinstance(entry, dict) else None
    if wanted is None or set(entry.get("arrays") or ()) != wanted:
        return False
    return all(_named(m) for m in entry.get("members") or ())


def _digested(entry: Any) -> bool:
    """Whether a manifest entry (and each member of a blend's) names a digest for every array:
    an array is never served unchecked from a manifest."""
    if not isinstance(entry, dict):
        return False
    arrays, digests = entry.get("arrays"), entry.get("digests")
    if not isinstance(arrays, dict) or not isinstance(digests, dict):
        return False
    if not all(isinstance(digests.get(name), str) for name in arrays):
        return False
    return all(_digested(m) for m in entry.get("members") or ())


def _local(path: str) -> str | None:
    """A local path to read ``path`` from: itself, or the node's copy of an object (None when the
    object does not exist)."""
    return copy_or_none(path) if is_url(path) else path


def write_manifest(
    path: str,
    key: dict[str, Any],
    splits: list[Any],
    write: Callable[[str, bytes], None] | None = None,
) -> None:
    """Write the manifest atomically unless an identical one is there (one writer, idempotent);
    in object storage with one PUT, after the caches it names were uploaded. ``write(path,
    data)``: how a local manifest is put in place (default ``write_atomic``; a build's cache
    writer puts it in place after every cache it names, ``CacheWriter.write_last``)."""
    data = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "key": key, "splits": splits}
    text = jsontext.dumps(data, indent=1).encode()
    try:
        local = _local(path)
        if local is not None:
            with open(local, "rb") as f:
                if f.read() == text:
                    return
    except OSError:
        pass
    if is_url(path):
        upload_bytes(text, path)  # one PUT: whole or absent
        return
    try:
        if write is None:
            write_atomic(path, lambda f: f.write(text))
        else:
            write(path, text)
    except OSError as exc:
        raise CacheError(
            f"cannot write the build manifest ({write_failure(exc, path)}); expected a writable"
            " folder with room for it",
            path=path,
            hint="point path_to_cache (`--data-cache-path`) at a writable folder every rank can"
            " read",
        ) from None
