"""Windows of a split's token stream, and the document pieces each window covers: no index.

A split of a token file is a contiguous range of sequences ``[begin, end)`` (Megatron's split
semantics, ``splits.split_range``). Its sequences are stored back to back in ``.bin`` (the
pointers are the exclusive cumulative sum of the lengths, which ``verify`` checks), so the split
is one contiguous token stream of T tokens starting at file token ``pointers[begin] / itemsize``.

Window w covers stream tokens ``[w*S, w*S + S + x)`` (x = 1 with the extra token), so
neighbouring windows overlap by the x token exactly like Megatron's samples. A sample needs all
S + x tokens, as Megatron's drop-last count does, so an epoch has ``n = (T - x) // S`` windows
(0 when ``T < S + x``); the ``T - x - n*S < S`` tokens after the last window are not read in
that epoch. Megatron's separate final epoch joins an epoch's tail to the next epoch's head
(documents are shuffled per epoch); windows over a fixed stream cannot, so the tail (less than
one sample per split) is the price of needing no index.

Reading a window is one span of ``.bin``. Document boundaries (pieces ``(sequence, offset,
length)``, the shape ``GPTDataset._pieces`` returns) come from a binary search of the window's
first and last token over the pointers. NumPy's ``searchsorted`` copies an unaligned array
whole before searching (measured: 0.54 s for 50M pointers) and the ``.idx`` pointers are never
8-byte aligned (34-byte header + 4 bytes per length), so the search here is a vectorized
bisection: ``log2(N)`` gathers of one element per window, no copy, 34 steps for 10^10 sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["WindowGrid", "search_right", "window_pieces"]


@dataclass(frozen=True, kw_only=True)
class WindowGrid:
    """The windows of one split: where its stream starts in the file and how it is cut."""

    first_token: int
    """File token (``.bin`` position in tokens) where the split's first sequence begins."""
    num_tokens: int
    """T, tokens of the split's sequences."""
    sequence_length: int
    """S, the stride between windows and the tokens of a sample's input."""
    extra: int = 1
    """x, tokens read past S (1 with Megatron's add_extra_token_to_sequence)."""

    def __post_init__(self) -> None:
        if self.sequence_length < 1:
            raise ConfigError(f"sequence_length is {self.sequence_length}; expected >= 1")
        if self.extra not in (0, 1):
            raise ConfigError(f"extra is {self.extra}; expected 0 or 1")
        if self.num_tokens < 0 or self.first_token < 0:
            raise ConfigError(
                f"a split of {self.num_tokens} tokens at {self.first_token}; expected both >= 0"
            )

    @classmethod
    def from_pointers(
        cls,
        pointers: np.ndarray,
        lengths: np.ndarray,
        itemsize: int,
        begin: int,
        end: int,
        sequence_length: int,
        extra: int = 1,
    ) -> WindowGrid:
        """The grid of the sequences ``[begin, end)``; reads three entries, whatever the file's
        size.

        ``pointers`` are byte offsets (``TokenFile.sequence_pointers``; a mock source passes the
        exclusive cumulative sum of its lengths with ``itemsize=1``).
        """
        if not 0 <= begin <= end <= len(lengths):
            raise ConfigError(
                f"sequence range [{begin}, {end}) outside a file of {len(lengths)} sequences"
            )
        if begin == end:
            return cls(first_token=0, num_tokens=0, sequence_length=sequence_length, extra=extra)
        first = int(pointers[begin]) // itemsize
        stop = int(pointers[end - 1]) // itemsize + int(lengths[end - 1])
        return cls(
            first_token=first, num_tokens=stop - first, sequence_length=sequence_length, extra=extra
        )

    @property
    def window(self) -> int:
        """Tokens read per window, S + x."""
        return self.sequence_length + self.extra

    @property
    def num_windows(self) -> int:
        """Windows per epoch: every w with ``w*S + S + x <= T``."""
        return max(self.num_tokens - self.extra, 0) // self.sequence_length

    def starts(self, windows: np.ndarray) -> np.ndarray:
        """int64 file token where each window begins (one ``.bin`` span of ``self.window`` each)."""
        w = np.asarray(windows, dtype=np.int64)
        if w.size and (int(w.min()) < 0 or int(w.max()) >= self.num_windows):
            raise IndexError(f"windows must lie in [0, {self.num_windows})")
        return w * self.sequence_length + self.first_token


def search_right(sorted_values: np.ndarray, targets: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """For each target, the number of ``sorted_values[lo:hi]`` entries ``<= target``, plus lo.

    ``np.searchsorted(sorted_values[lo:hi], targets, "right") + lo`` without copying the array:
    each of ``log2(hi - lo)`` steps gathers one element per target.
    """
    t = np.asarray(targets, dtype=np.int64)
    low = np.full(t.shape, lo, dtype=np.int64)
    high = np.full(t.shape, hi, dtype=np.int64)
    active = np.flatnonzero(low < high)
    while active.size:
        a, b = low[active], high[active]
        mid = (a + b) >> 1
        right = sorted_values[mid] <= t[active]
        low[active] = np.where(right, mid + 1, a)
        high[active] = np.where(right, b, mid)
        active = active[low[active] < high[active]]
    return low


def window_pieces(
    grid: WindowGrid,
    windows: np.ndarray,
    pointers: np.ndarray,
    lengths: np.ndarray,
    itemsize: int,
    begin: int,
    end: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The sequences each window touches, as ``GPTDataset._pieces`` returns them.

    Returns ``(sequences, first, piece_lengths, first_offsets)``: the flat list of sequences
    (each window's, in stream order, empty sequences in between included as 0-length pieces), the
    flat index of each window's first piece, every piece's length, and the offset of each first
    piece in its sequence (later pieces start at 0). Piece lengths of a window sum to S + x.
    """
    first_tok = grid.starts(windows).ravel()
    last_tok = first_tok + (grid.window - 1)
    # The sequence holding a token: the last one starting at or before it (empty ones start at
    # the same pointer as their successor, so "right" skips them).
    found = search_right(pointers, np.concatenate([first_tok, last_tok]) * itemsize, begin, end) - 1
    b, e = found[: first_tok.size], found[first_tok.size :]
    n_pieces = e - b + 1
    ends = n_pieces.cumsum()
    first = ends - n_pieces
    seqs = np.arange(int(ends[-1]) if ends.size else 0, dtype=np.int64) + (b - first).repeat(
        n_pieces
    )
    piece_lengths = lengths[seqs].astype(np.int64)
    last = ends - 1
    piece_lengths[last] = last_tok + 1 - pointers[e] // itemsize
    first_offsets = first_tok - pointers[b] // itemsize
    piece_lengths[first] -= first_offsets
    return seqs, first, piece_lengths, first_offsets
