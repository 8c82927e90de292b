"""Where a GPT dataset's sequences come from: a token file, or Megatron's mock sequences.

Both expose ``sequence_lengths`` and ``read_pieces(sequences, offsets, lengths)`` (one vectorized
read of many sequence slices, concatenated), which is all the sample layer needs.
"""

from __future__ import annotations

import numpy as np

from ..format.bin import gather_index

MOCK_SEQUENCES = 100_000
MOCK_MAX_LENGTH = 4096


class MockSource:
    """Megatron's ``MockGPTLowLevelDataset`` (``--mock-data``), computed instead of stored.

    100,000 sequences with lengths ``default_rng(0).integers(1, 4096)``; sequence i holds
    ``(arange(len - 1) + 1) % vocab_size`` followed by EOD. Any slice is computed from its
    positions, so reading costs no I/O: the throughput ceiling to compare real data against.
    """

    def __init__(self, vocab_size: int, eod_id: int) -> None:
        self.vocab_size = int(vocab_size)
        self.eod_id = int(eod_id)
        self.sequence_lengths = np.random.default_rng(seed=0).integers(
            low=1, high=MOCK_MAX_LENGTH, size=MOCK_SEQUENCES, dtype=np.int32
        )

    def read_pieces(self, sequences: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, dtype=None) -> np.ndarray:
        sequences = np.asarray(sequences, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        within = gather_index(offsets, lengths)  # position inside each sequence
        last = np.repeat(self.sequence_lengths[sequences].astype(np.int64) - 1, lengths)
        return np.where(within == last, self.eod_id, (within + 1) % self.vocab_size)

    def __reduce__(self):
        return (MockSource, (self.vocab_size, self.eod_id))
