"""Hugging Face datasets as preprocess inputs: dataset folders on disk and in-memory objects.

Folders (``--input DIR``), read with pyarrow alone (the ``datasets`` package is not needed):

* ``Dataset.save_to_disk`` output (``state.json``, ``dataset_info.json``, ``data-*.arrow``): its
  Arrow stream files in the order ``state.json`` lists them. A ``DatasetDict`` folder
  (``dataset_dict.json``) holds one such folder per split; which split to read is the user's
  choice, so passing the dict folder itself is an error naming its splits.
* A Hub snapshot on disk (a dataset card ``README.md`` opening with YAML front matter, or the
  ``.cache/huggingface`` folder of ``hf download --local-dir``): its data files, without the card
  and the metadata files. Each file belongs to the split its path names, by the Hub's naming
  convention (a ``train``/``validation``/``test`` word, or a synonym, in the path; no word:
  train). A snapshot holding several splits is an error naming each split's glob, so that test
  data never goes into training data by accident.

Objects (``PreprocessConfig(inputs=(ds,))``): a ``datasets.Dataset`` is cut into row ranges of
about ``piece_bytes``; each piece is one "input file" of the pipeline (its own part, reused by a
resumed run), named by the dataset's fingerprint, so a rerun of the same job in a new process
resumes. An ``IterableDataset`` is written with exactly the rows its own iteration yields, in
that order: it is read through that iteration, as one piece, so every transform applies (take,
skip, shuffle, filter, map, interleave_datasets, set_epoch, split_dataset_by_node, a loaded
state). Only a dataset provably without a transform (its example iterable is a plain source:
files or a generator, at epoch 0, not split by node) is cut into its shards, whose concatenation
in order is then that iteration; anything unknown is read through the iteration. The name of a
piece is a hash of the ``IterableDataset``'s description (datasets' hasher), so a rerun resumes
and a killed run, which restarts an unfinished piece from its first row, writes the same bytes.
Rows are read in the training process's order: the output equals the same rows written as JSONL.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from ..errors import ConfigError

log = logging.getLogger(__name__)

DATASET_FORMAT = "dataset"
"""The format of a piece of an in-memory dataset object."""
_METADATA = {
    "readme.md",
    "dataset_infos.json",
    "dataset_info.json",
    "state.json",
    "dataset_dict.json",
    ".gitattributes",
}
_SPLIT_WORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_ITER_ROWS = 64  # rows per batch drawn from an IterableDataset (batches are then regrouped)


def is_dataset_object(value: Any) -> bool:
    """Whether ``value`` is a ``datasets.Dataset`` or ``IterableDataset`` (without importing
    ``datasets`` when the caller never made one)."""
    return any(
        c.__module__.startswith("datasets.") and c.__name__ in ("Dataset", "IterableDataset")
        for c in type(value).__mro__
    )


# -- folders -----------------------------------------------------------------------------------


def saved_dataset_files(folder: str) -> list[str] | None:
    """The Arrow files of a ``save_to_disk`` folder in the dataset's order; None when ``folder``
    is not one. A ``DatasetDict`` folder raises ConfigError naming its splits."""
    dict_file = os.path.join(folder, "dataset_dict.json")
    if os.path.isfile(dict_file):
        splits = _json(dict_file).get("splits") or sorted(
            d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d))
        )
        raise ConfigError(
            f"this is a Hugging Face DatasetDict with splits {', '.join(splits)}",
            path=folder,
            hint=f"pass one split's folder, e.g. `inputs={os.path.join(folder, splits[0])!r}`"
            if splits
            else "pass one split's folder",
        )
    state = os.path.join(folder, "state.json")
    if not os.path.isfile(state):
        return None
    names = [entry.get("filename") for entry in _json(state).get("_data_files") or []]
    if not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f"{state!r} lists no data files",
            path=state,
            hint="expected a folder written by datasets' save_to_disk (state.json names its"
            " .arrow files); rewrite it with Dataset.save_to_disk",
        )
    files = [os.path.join(folder, n) for n in names]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise ConfigError(
            f"the saved dataset lacks {len(missing)} of its {len(files)} data files",
            path=missing[0],
            hint="copy the whole save_to_disk folder, or save the dataset again",
        )
    return files


def _json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot read the dataset's metadata ({exc})",
            path=path,
            hint="the file should be the JSON that datasets wrote; save the dataset again",
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path!r} holds a {type(data).__name__}, expected an object", path=path)
    return data


def is_hub_snapshot(folder: str) -> bool:
    """A dataset repository's files on disk: a card with YAML front matter, or the cache folder
    ``hf download --local-dir`` leaves."""
    if os.path.isdir(os.path.join(folder, ".cache", "huggingface")):
        return True
    try:
        with open(os.path.join(folder, "README.md"), "rb") as f:
            return f.readline().rstrip() == b"---"
    except OSError:
        return False


def snapshot_files(folder: str, found: list[str]) -> list[str]:
    """The data files among ``found`` (a Hub snapshot's files), which must hold one split."""
    data = [p for p in found if os.path.basename(p).lower() not in _METADATA]
    by_split: dict[str, list[str]] = {}
    for path in data:
        by_split.setdefault(split_of(os.path.relpath(path, folder)), []).append(path)
    if len(by_split) > 1:
        by_split = {s: by_split[s] for s in _SPLIT_WORDS if s in by_split}
        choices = "; ".join(f"{s}: `inputs={_glob_for(paths)!r}`" for s, paths in by_split.items())
        raise ConfigError(
            f"this Hugging Face dataset holds the splits {', '.join(by_split)}",
            path=folder,
            hint=f"pass one split's files ({choices})",
        )
    if not data:
        raise ConfigError(f"the dataset folder {folder!r} holds no data files", path=folder)
    return data


def split_of(relpath: str) -> str:
    """The split a data file belongs to by the Hub's naming convention (first split word in the
    path, directories first; none: train)."""
    for word in re.split(r"[-._ /\\0-9]+", relpath.lower()):
        for split, words in _SPLIT_WORDS.items():
            if word in words:
                return split
    return "train"


def _glob_for(paths: list[str]) -> str:
    """A glob naming ``paths`` (one file: itself): their common folder and name prefix."""
    if len(paths) == 1:
        return paths[0]
    parent = os.path.commonpath(paths)
    names = [os.path.relpath(p, parent) for p in paths]
    prefix = os.path.commonprefix(names)  # noqa: RUF071 (a name prefix, by characters: 'train-0000')
    return os.path.join(parent, prefix + "*") if prefix else parent


# -- in-memory objects --------------------------------------------------------------------------


class RowRange:
    """Rows [start, stop) of a ``datasets.Dataset``."""

    def __init__(self, dataset: Any, start: int, stop: int) -> None:
        self.dataset, self.start, self.stop = dataset, start, stop

    def tables(self, chunk_bytes: int, columns: tuple[str, ...]) -> Iterator[tuple[int, Any]]:
        """(first row, 1-based; a pyarrow Table or a missing-column description) per chunk."""
        names = list(self.dataset.column_names)
        if any(c not in names for c in columns):
            step = 4096
            for a in range(self.start, self.stop, step):
                yield a + 1, {"rows": min(step, self.stop - a), "names": sorted(names)}
            return
        view = self.dataset.select_columns(list(columns)).with_format("arrow")
        rows_total = max(1, view.data.num_rows)
        row_bytes = max(1.0, view.data.nbytes / rows_total)
        step = max(1, int(chunk_bytes / row_bytes))
        for a in range(self.start, self.stop, step):
            yield a + 1, view[a : min(a + step, self.stop)]


class Shard:
    """Shard ``index`` of ``count`` of an untransformed ``IterableDataset`` (``reads_as_shards``),
    or, with ``count`` 0, the whole of any ``IterableDataset`` read through its own iteration."""

    def __init__(self, dataset: Any, index: int, count: int) -> None:
        self.dataset, self.index, self.count = dataset, index, count

    def tables(self, chunk_bytes: int, columns: tuple[str, ...]) -> Iterator[tuple[int, Any]]:
        pa = _pyarrow()
        held: list[Any]
        first, held, held_bytes = 1, [], 0
        for table, names in self._batches(columns):
            if any(c not in names for c in columns):
                if held:
                    yield first, pa.concat_tables(held)
                    first += sum(t.num_rows for t in held)
                    held, held_bytes = [], 0
                yield first, {"rows": table.num_rows, "names": sorted(names)}
                first += table.num_rows
                continue
            table = table.select(list(columns))
            held.append(table)
            held_bytes += table.nbytes
            if held_bytes >= chunk_bytes:
                yield first, pa.concat_tables(held)
                first += sum(t.num_rows for t in held)
                held, held_bytes = [], 0
        if held:
            yield first, pa.concat_tables(held)

    def _batches(self, columns: tuple[str, ...]) -> Iterator[tuple[Any, list[str]]]:
        """(an Arrow table of up to ``_ITER_ROWS`` rows, the rows' column names), in the order
        the rows are read."""
        if self.count:
            part = self.dataset.shard(self.count, self.index).with_format("arrow")
            return ((t, t.column_names) for t in part.iter(batch_size=_ITER_ROWS))
        state = getattr(self.dataset, "_starting_state_dict", None)
        if state is not None:
            return self._loaded_rows(state, columns)
        # the dataset's own iteration: an Arrow view of the same example iterable at the
        # dataset's epoch (``with_format`` makes a dataset at epoch 0)
        view = self.dataset.with_format("arrow")
        view.set_epoch(self.dataset.epoch)
        return ((t, t.column_names) for t in view.iter(batch_size=_ITER_ROWS))

    def _loaded_rows(
        self, state: dict[str, Any], columns: tuple[str, ...]
    ) -> Iterator[tuple[Any, list[str]]]:
        """A dataset resumed from a state (``load_state_dict``): its rows one by one, as
        ``for row in ds`` yields them (datasets' batched iteration does not resume that state:
        it yields nothing), in Arrow tables of the requested columns."""
        pa = _pyarrow()
        view = self.dataset.with_format(None)
        view.set_epoch(self.dataset.epoch)
        view.load_state_dict(state)
        rows = iter(view)
        while batch := list(itertools.islice(rows, _ITER_ROWS)):
            names = list(dict.fromkeys(name for row in batch for name in row))
            present = [c for c in columns if all(c in row for row in batch)]
            table = pa.table({c: [row[c] for row in batch] for c in present})
            if not present:  # no column to carry the row count
                table = pa.table({"_": [None] * len(batch)})
            yield table, [n for n in names if n in present or n not in columns]


_SOURCE_ITERABLES = ("ExamplesIterable", "ArrowExamplesIterable")
"""datasets' example iterables that only read a source (files, or a generator over its
arguments), in the order of their shards: the only ones ``reads_as_shards`` accepts."""


def reads_as_shards(obj: Any) -> bool:
    """Whether the shards of the ``IterableDataset`` ``obj``, concatenated in order, are provably
    the rows its own iteration yields: its example iterable is a plain source (no take, skip,
    shuffle, filter, map, interleave or any other transform wraps it), at epoch 0 (a later epoch
    reorders the shards), not split by node and without a loaded state. Anything else, or a
    ``datasets`` whose internals differ from what is checked here, is False: the dataset is read
    through its own iteration, which is always right."""
    try:
        kind = type(obj._ex_iterable)
        return (
            kind.__module__ == "datasets.iterable_dataset"
            and kind.__name__ in _SOURCE_ITERABLES
            and int(obj.epoch) == 0
            and obj._distributed is None
            and getattr(obj, "_shuffling", None) is None  # datasets < 3 kept a shuffle here
            and getattr(obj, "_starting_state_dict", None) is None
        )
    except Exception:  # a changed internal: unsure, so the iteration
        return False


def _pyarrow() -> ModuleType:
    from ..errors import require

    return require("pyarrow", "hf", "reading Hugging Face datasets")


def object_pieces(obj: Any, piece_bytes: int) -> list[tuple[str, int | None, str, Any]]:
    """(name, estimated bytes, stamp, piece) for each piece of a dataset object, in row order."""
    if hasattr(obj, "n_shards") and not hasattr(obj, "__len__"):  # IterableDataset
        identity = _iterable_identity(obj)
        if not reads_as_shards(obj):
            return [(f"hf-iterable:{identity}:rows", None, identity, Shard(obj, 0, 0))]
        count = max(1, int(obj.n_shards))
        return [
            (
                f"hf-iterable:{identity}:shard-{i:05d}-of-{count:05d}",
                None,
                identity,
                Shard(obj, i, count),
            )
            for i in range(count)
        ]
    fingerprint = getattr(obj, "_fingerprint", None) or uuid.uuid4().hex
    rows = len(obj)
    total = int(obj.data.nbytes) if rows else 0
    pieces = max(1, -(-total // piece_bytes))
    step = max(1, -(-rows // pieces))
    out: list[tuple[str, int | None, str, Any]] = []
    for a in range(0, rows, step):
        b = min(a + step, rows)
        out.append(
            (
                f"hf-dataset:{fingerprint}:rows-{a}-{b}",
                total * (b - a) // rows,
                fingerprint,
                RowRange(obj, a, b),
            )
        )
    if not out:
        out.append((f"hf-dataset:{fingerprint}:rows-0-0", 0, fingerprint, RowRange(obj, 0, 0)))
    return out


def _iterable_identity(obj: Any) -> str:
    """A hash of what the IterableDataset reads and does (datasets' own hasher over its example
    iterable, with the epoch, the split by node and a loaded state, which change its rows too); a
    random one, and so no resume, when it cannot be hashed."""
    try:
        from datasets.fingerprint import Hasher

        digest: str = Hasher.hash(
            (
                obj._ex_iterable,
                int(obj.epoch),
                getattr(obj, "_distributed", None),
                getattr(obj, "_starting_state_dict", None),
            )
        )
        return digest
    except Exception as exc:  # an unpicklable generator, a changed internal
        log.info("this IterableDataset cannot be hashed (%s): a rerun starts it again", exc)
        return uuid.uuid4().hex
