"""Split strings, split matrices and the sequence range each split takes from a token file.

Megatron turns ``--split "969, 30, 1"`` into three weights, normalizes them with a float64 NumPy
sum, accumulates them left to right with Python float addition starting from the *int* 0, and
cuts every token file into three contiguous ranges of sequences with Python's round-half-even.
Every one of those details reaches the cache hash (the matrix is serialized into the description
JSON) or the sequence ranges, so this module reproduces them operation for operation instead of
computing "the same" numbers some nicer way. The trade-off is readability: the arithmetic is
deliberately naive.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

import numpy as np

from tokenload.errors import ConfigError

__all__ = [
    "SPLIT_NAMES",
    "Bookend",
    "SplitMatrix",
    "normalize",
    "parse_split",
    "split_matrix",
    "split_range",
    "split_ranges",
    "spoofed_split_matrix",
]

SPLIT_NAMES: tuple[str, str, str] = ("train", "valid", "test")
"""The three splits in Megatron's order (``Split.train/valid/test``, values 0/1/2)."""

Bookend = tuple[float, float]
"""``(begin, end)`` fractions of a token file's sequences; the first begin is the int ``0``."""

SplitMatrix = list[Bookend | None]
"""One bookend per split, ``None`` for a split of zero weight."""

_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
SEPARATORS = (",", "/")
"""What separates a split's numbers: Megatron's documented comma, and the slash that Megatron-LM's
legacy parser and GPT-NeoX split on by name (megatron-core reads both the same)."""
_FORM = (
    "up to 3 non-negative numbers (train, valid, test) separated by commas, such as '99,1,0' or"
    " '969, 30, 1' ('/' also separates, as in Megatron: '99/1/0')"
)


def normalize(weights: Sequence[float]) -> list[float]:
    """Return ``weights / sum(weights)`` computed exactly as Megatron's ``normalize``.

    The sum is NumPy's float64 (pairwise) sum and the result is a list of Python floats, so the
    values are bit-identical to Megatron's, which matters because they end up in cache hashes.
    Raises ``ConfigError`` when the weights do not sum to a positive finite number.
    """
    w = np.array(weights, dtype=np.float64)
    total = np.sum(w)
    if not np.isfinite(total) or total <= 0:
        raise ConfigError(
            f"weights {list(weights)} sum to {float(total)}; expected a positive finite sum",
            hint="give at least one positive weight and no inf/nan",
        )
    shares: list[float] = (w / total).tolist()
    return shares


def parse_split(split: str) -> list[float]:
    """Parse a split string (``"99,1,0"``, ``"969, 30, 1"``, ``"99/1/0"``) into 3 weights.

    The weights are normalized (``normalize``), exactly as megatron-core's
    ``parse_and_normalize_split`` does: missing trailing numbers are 0. megatron-core takes every
    run of digits and dots as a number, whatever lies between them; here the numbers must be
    separated by commas (Megatron's documented form, spaces allowed) or by slashes (the legacy
    parser's and GPT-NeoX's other separator), the whole optionally in one pair of quotes
    (Megatron-LM's example scripts pass ``--split '99,1,0'`` with its quotes, which megatron-core
    skips). So every string accepted here is read as megatron-core reads it, and anything else
    (``"abc"``, ``"90;10"``, ``"90 10"``, a negative number, which megatron-core turns into a
    positive one, ``"1e3"``, an empty field) is a ConfigError naming ``split``.
    """
    if not isinstance(split, str):
        raise ConfigError(f"split is {split!r}, expected a string of {_FORM}", field="split")
    if re.search(r"-\s*[.0-9]", split):
        raise ConfigError(
            f"split is {split!r}, a negative number; expected {_FORM}",
            hint="write the split as non-negative numbers, e.g. `split='98,2,0'`",
            field="split",
        )
    text = split.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]  # a quoted string reaches Megatron from its own example scripts
    used = [sep for sep in SEPARATORS if sep in text]
    parts = text.split(used[0]) if len(used) == 1 else [text]
    bad = [p for p in parts if not _NUMBER.fullmatch(p.strip())]
    if bad or len(used) > 1:
        found = "',' and '/' are mixed" if len(used) > 1 else f"{bad[0].strip()!r} is no number"
        raise ConfigError(
            f"split is {split!r}, expected {_FORM}; {found}",
            hint="write it as, e.g., `split='99,1,0'`",
            field="split",
        )
    if len(parts) > len(SPLIT_NAMES):
        raise ConfigError(
            f"split is {split!r}, {len(parts)} numbers; expected at most 3 (train, valid, test)",
            field="split",
        )
    values = [float(p) for p in parts] + [0.0] * (len(SPLIT_NAMES) - len(parts))
    if not 0 < sum(values) < float("inf"):
        raise ConfigError(
            f"split is {split!r}, weights summing to {sum(values)}; expected a positive finite sum",
            hint="give the training split a positive weight, e.g. `split='99,1,0'`",
            field="split",
        )
    return normalize(values)


def split_matrix(split: str) -> SplitMatrix:
    """Return Megatron's split matrix for a split string.

    ``[(0, v0), (v0, v0+v1), (v0+v1, v0+v1+v2)]`` with the first bookend the int ``0`` and later
    ones accumulated by left-to-right Python float addition (``"90/5/5"`` ends at
    ``0.9500000000000001``); a split whose bookend is empty (``end <= begin``) is ``None``.
    """
    vector = parse_split(split)
    expansion: list[float] = [0]
    for v in vector:
        expansion.append(expansion[-1] + v)
    matrix: SplitMatrix = []
    for begin, end in itertools.pairwise(expansion):
        matrix.append(None if end <= begin else (begin, end))
    return matrix


def spoofed_split_matrix(split_index: int) -> SplitMatrix:
    """The matrix Megatron builds with in per-split-blend mode: ``(0.0, 1.0)`` for one split only.

    It selects whole token files; it is used for building and never reaches the cache hash
    (there ``split`` and ``split_matrix`` are ``null``).
    """
    matrix: SplitMatrix = [None] * len(SPLIT_NAMES)
    matrix[split_index] = (0.0, 1.0)
    return matrix


def split_range(bookend: Bookend, num_sequences: int) -> tuple[int, int]:
    """Return the ``[begin, end)`` sequence ids one bookend selects from a file of N sequences.

    ``int(round(fraction * float(N)))`` with Python's round-half-even, as Megatron does.
    """
    n = float(num_sequences)
    return round(bookend[0] * n), round(bookend[1] * n)  # round-half-even, an int


def split_ranges(matrix: SplitMatrix, num_sequences: int) -> list[tuple[int, int] | None]:
    """Apply ``split_range`` to every split of a matrix (``None`` stays ``None``)."""
    if num_sequences < 0:
        raise ConfigError(f"num_sequences is {num_sequences}; expected >= 0")
    return [None if b is None else split_range(b, num_sequences) for b in matrix]
