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
import logging
import re
from collections.abc import Sequence

import numpy as np

from tokenload.errors import ConfigError

logger = logging.getLogger(__name__)

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

_NUMBER = re.compile(r"[.0-9]+")
"""megatron-core's reading of a split string: every run of ASCII digits and dots is a number,
whatever lies between them."""
_PLAIN = re.compile(r"[0-9.,/:\s'\"]*")
"""Characters whose reading needs no warning: numbers, separators, spaces, quotes."""
_FORM = (
    "up to 3 non-negative numbers (train, valid, test) such as '99,1,0' or '969, 30, 1'"
    " (megatron-core reads every run of digits and dots as a number, whatever separates them)"
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
    """Parse a split string (``"99,1,0"``, ``"969, 30, 1"``, ``"99 1"``, ``"99/1"``) into 3
    weights exactly as megatron-core 0.19.2's ``parse_and_normalize_split`` does.

    Every run of ASCII digits and dots is a number (``float`` of it), whatever lies between the
    runs; missing trailing numbers are 0; the weights are normalized (``normalize``). So
    ``"99:1"``, ``"99 1 0"`` and ``"'99,1,0'"`` (with the quotes Megatron-LM's example scripts
    pass) are ``[0.99, 0.01, 0.0]``, and so is what megatron-core reads the same way: ``"-1,2"``
    is ``[1, 2]`` and ``"1e3"`` is ``[1, 3]`` (a warning says so when a character other than
    digits, dots, separators, spaces and quotes is skipped). Where megatron-core raises (a run
    ``float`` cannot read such as ``"1.2.3"``, more than 3 numbers) or builds nothing it can use
    (weights summing to 0, as for ``""`` or ``"abc"``, whose NaN fractions make its builder
    raise; or to infinity, which it turns into no split at all), a ConfigError naming
    ``split``.
    """
    if not isinstance(split, str):
        raise ConfigError(f"split is {split!r}, expected a string of {_FORM}", field="split")
    runs = _NUMBER.findall(split)
    values = []
    for run in runs:
        try:
            values.append(float(run))
        except ValueError:
            raise ConfigError(
                f"split is {split!r}, expected {_FORM}; {run!r} is no number (megatron-core's"
                " float() refuses it)",
                hint="write it as, e.g., `split='99,1,0'`",
                field="split",
            ) from None
    if len(values) > len(SPLIT_NAMES):
        raise ConfigError(
            f"split is {split!r}, {len(values)} numbers; expected at most 3 (train, valid, test;"
            " megatron-core asserts it)",
            hint="write it as, e.g., `split='99,1,0'`",
            field="split",
        )
    values += [0.0] * (len(SPLIT_NAMES) - len(values))
    with np.errstate(over="ignore"):
        total = float(np.sum(np.array(values, dtype=np.float64)))
    if not 0 < total < float("inf"):
        outcome = (
            "its fractions would all be 0 and it would build no split"
            if total > 0
            else "its fractions would be NaN, and its build fails"
        )
        raise ConfigError(
            f"split is {split!r}, read as the weights {values} summing to {total}; expected a"
            f" positive finite sum (megatron-core: {outcome})",
            hint="give the training split a positive weight, e.g. `split='99,1,0'`",
            field="split",
        )
    if not _PLAIN.fullmatch(split):
        _warn_skipped(split, tuple(values))
    return normalize(values)


def _warn_skipped(split: str, values: tuple[float, ...]) -> None:
    """What megatron-core's reading skipped."""
    skipped = sorted(set(_PLAIN.sub("", _NUMBER.sub("", split))))
    logger.warning(
        "split %r is read as megatron-core reads it, the weights %s: %s between the numbers"
        " is skipped (a '-' is no sign, an 'e' no exponent); write the split as numbers"
        " separated by commas, e.g. '99,1,0'",
        split,
        list(values),
        ", ".join(repr(c) for c in skipped),
    )


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
