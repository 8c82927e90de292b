"""Blend specifications: which token-file prefixes are mixed, and with which weights.

Three spellings reach Megatron and all end in the same list parser: the ``--data-path`` list
(``"30 p1 70 p2"`` or ``"p1 p2"``), a ``--data-args-path`` file holding that list separated by
whitespace, and a ``--per-split-data-args-path`` JSON ``{"train": ..., "valid": ..., "test": ...}``.
The list rule: an odd length is prefixes only; an even length is (weight, prefix) pairs when every
weight position parses as a float, and otherwise prefixes only. Megatron checks "all or none"
on a half-consumed iterator, so a list whose first unparsable weight comes after parsable ones
(``["1", "p1", "x", "p2"]``) is accepted as four prefixes; this parser keeps that quirk so the
same command line means the same data, and rejects the other mixed case as Megatron does.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from typing import cast

from tokenload.errors import ConfigError, StorageError
from tokenload.index.splits import SPLIT_NAMES

__all__ = [
    "Blend",
    "distinct_sources",
    "parse_blend",
    "read_data_args_file",
    "read_per_split_data_args",
]


@dataclass(frozen=True, kw_only=True)
class Blend:
    """A list of token-file prefixes and optional weights (Megatron's ``(prefixes, weights)``)."""

    prefixes: tuple[str, ...]
    """Token-file prefixes exactly as given (after ``strip()``); they reach the cache hash."""

    weights: tuple[float, ...] | None = None
    """Raw (unnormalized) positive weights, one per prefix, or ``None`` for an unweighted blend."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefixes", tuple(self.prefixes))
        if not self.prefixes:
            raise ConfigError("blend has no prefixes; expected at least one token-file prefix")
        for p in self.prefixes:
            if not isinstance(p, str) or not p:
                raise ConfigError(f"blend prefix {p!r}; expected a non-empty string")
        if self.weights is None:
            return
        weights = tuple(self.weights)
        object.__setattr__(self, "weights", weights)
        if len(weights) != len(self.prefixes):
            raise ConfigError(
                f"blend has {len(weights)} weights for {len(self.prefixes)} prefixes; "
                "expected one weight per prefix"
            )
        for p, w in zip(self.prefixes, weights):
            if isinstance(w, bool) or not isinstance(w, Real):
                raise ConfigError(f"weight of {p!r} is {w!r}; expected a number")
            if not math.isfinite(w) or w <= 0:
                raise ConfigError(
                    f"weight of {p!r} is {w!r}; expected a positive finite number",
                    hint="drop the prefix from the blend instead of giving it weight 0",
                )

    def to_list(self) -> list[str]:
        """The blend as a ``--data-path`` list (``["30", "p1", ...]`` or ``["p1", ...]``)."""
        if self.weights is None:
            return list(self.prefixes)
        out: list[str] = []
        for w, p in zip(self.weights, self.prefixes):
            out += [repr(float(w)), p]
        return out


def parse_blend(items: Sequence[str] | str | None) -> Blend | None:
    """Parse a ``--data-path`` style list (or a whitespace-separated string) into a ``Blend``.

    ``None`` gives ``None``. Weights are returned raw (Megatron normalizes them later, see
    ``tokenload.index.plan``); prefixes are ``strip()``-ed. Raises ``ConfigError`` for an empty
    list, for weights Megatron would reject, and for non-positive weights.
    """
    if items is None:
        return None
    if isinstance(items, str):
        items = items.split()
    items = list(items)
    if not items:
        raise ConfigError("blend is empty; expected prefixes, or weight/prefix pairs")
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"blend item {item!r} is not a string; expected strings")
    for item in items:  # (a cache's name holds its prefix: one name per token file pair)
        if item.strip().endswith((".bin", ".idx")):
            raise ConfigError(
                f"blend item {item!r} names a file, not a token file's prefix; expected the"
                " prefix (Megatron's --data-path takes prefixes, and index caches are named"
                " after them)",
                hint=f"write {item.strip()[:-4]!r}",
            )
    if len(items) % 2 == 1:
        numbers = [p for p in items if _is_number(p)]
        if numbers:  # Megatron reads them as prefixes too, then fails to open them
            raise ConfigError(
                f"blend {items!r} has an odd number of items, so every item is a prefix,"
                f" {numbers[0]!r} included; expected 'W1 PREFIX1 W2 PREFIX2 ...' or prefixes only",
                hint="give each prefix its weight, or drop the weights",
            )
        return Blend(prefixes=tuple(p.strip() for p in items))
    weights: list[float | None] = []
    for raw in items[0::2]:
        try:
            weights.append(float(raw))
        except ValueError:
            weights.append(None)
    if None in weights:
        first = weights.index(None)
        # Megatron asserts all(...) on the iterator any(...) left behind: only the entries
        # after the first unparsable weight are checked.
        if any(w is not None for w in weights[first + 1 :]):
            raise ConfigError(
                f"blend {items!r} mixes numeric and non-numeric weight positions; expected "
                "all even positions to be weights or the whole list to be prefixes",
                hint="write 'W1 PREFIX1 W2 PREFIX2 ...' or 'PREFIX1 PREFIX2 ...'",
            )
        return Blend(prefixes=tuple(p.strip() for p in items))
    return Blend(
        prefixes=tuple(p.strip() for p in items[1::2]), weights=tuple(cast("list[float]", weights))
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_text(path: str | os.PathLike[str]) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise StorageError(f"cannot read blend file ({exc.strerror})", path=path) from None


def read_data_args_file(path: str | os.PathLike[str]) -> Blend:
    """Read a ``--data-args-path`` file: the blend list separated by any whitespace."""
    blend = parse_blend(_read_text(path).split())
    assert blend is not None
    return blend


def read_per_split_data_args(
    path: str | os.PathLike[str],
) -> tuple[Blend | None, Blend | None, Blend | None]:
    """Read a ``--per-split-data-args-path`` JSON into ``(train, valid, test)`` blends.

    Each value is a list or a whitespace-separated string (or ``null`` for no such split).
    All three keys are required, as in Megatron.
    """
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON ({exc})", path=path) from None
    if not isinstance(data, dict) or any(k not in data for k in SPLIT_NAMES):
        found = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ConfigError(
            f"per-split data args hold {found}; expected an object with keys train, valid, test",
            path=path,
            hint='write {"train": "30 p1 70 p2", "valid": ["p3"], "test": null}',
        )
    out = []
    for key in SPLIT_NAMES:
        value = data[key]
        if value is not None and not isinstance(value, (str, list)):
            raise ConfigError(
                f"'{key}' is {type(value).__name__}; expected a list, a string or null", path=path
            )
        out.append(parse_blend(value))
    return out[0], out[1], out[2]


def distinct_sources(names: Sequence[str]) -> list[str]:
    """Source names with a repeat count appended to the second and later copies of one name (a
    blend may list a prefix twice): each copy keeps its own order, cursor and accounting."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out
