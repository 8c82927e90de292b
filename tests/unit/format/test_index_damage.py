"""Damage to an ``.idx`` that stays in range and passes every O(1) check of an open: two swapped
sequence lengths, one pointer moved by 4 bytes, a dtype code changed to another type of the same
width. Each is a ``FormatError`` naming the ``.idx`` (and the sequence) in every read mode and
through every read path, never other tokens: the per-read check ``pointer[i + 1] - pointer[i] ==
length[i] * itemsize`` and the sidecar's dtype against the header's."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import FormatError
from tokenload.format import ReadMode, TokenFile

LENGTHS = [5, 9, 3, 12, 7, 4, 10, 6]
N = len(LENGTHS)


@pytest.fixture
def prefix(tmp_path):
    rng = np.random.default_rng(3)
    # tokens above 32767: an int16 reading of them is negative (the dtype case)
    return write_documents(tmp_path / "d", [rng.integers(30000, 65000, n) for n in LENGTHS])


def _config(prefix: str, mode) -> MegatronDataConfig:
    return MegatronDataConfig(sequence_length=8, blend=[prefix], split="100,0,0", cache="off",
                              read_mode=mode)


def _patch(prefix: str, offset: int, packed: bytes) -> None:
    with open(prefix + ".idx", "r+b") as f:
        f.seek(offset)
        f.write(packed)


def _swap_lengths(prefix: str) -> int:
    """Lengths of sequences 1 and 2 swapped (9 and 3): sizes and sums unchanged."""
    _patch(prefix, 34 + 4, struct.pack("<ii", LENGTHS[2], LENGTHS[1]))
    return 1


def _move_pointer(prefix: str) -> int:
    """Sequence 3's pointer moved by 4 bytes (2 tokens): still inside the .bin."""
    at = 34 + 4 * N + 8 * 3
    (pointer,) = struct.unpack("<q", Path(prefix + ".idx").read_bytes()[at:at + 8])
    _patch(prefix, at, struct.pack("<q", pointer + 4))
    return 2  # sequence 2 now ends 4 bytes before sequence 3's pointer: the first gap named


DAMAGE = {"two lengths swapped": _swap_lengths, "a pointer moved by 4 bytes": _move_pointer}


@pytest.mark.parametrize("mode", list(ReadMode))
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_in_range_index_damage_is_a_format_error_on_every_read_path(prefix, damage, mode):
    sound = TokenFile(prefix)
    expected = [sound[i].tolist() for i in range(N)]
    first_bad = DAMAGE[damage](prefix)
    tf = TokenFile(prefix, mode=mode)
    named = (rf"d\.idx: sequence {first_bad} has pointer \d+ and length \d+ .* "
             r"expected pointer\[i \+ 1\]")
    reads = {
        "single": lambda: tf[first_bad],
        "slice": lambda: tf[:],
        "document": lambda: tf.document(first_bad),
        "pieces": lambda: tf.read_pieces(np.array([0, first_bad]), np.zeros(2, np.int64),
                                         np.ones(2, np.int64)),
    }
    for name, read in reads.items():
        with pytest.raises(FormatError, match=named) as info:
            read()
        assert "HINT" in str(info.value), name
    assert tf[0].tolist() == expected[0]  # an untouched sequence still reads, and reads right
    assert tf[N - 1].tolist() == expected[N - 1]  # the last one ends at the end of .bin


@pytest.mark.parametrize("mode", list(ReadMode))
def test_the_last_sequence_is_checked_against_the_end_of_the_bin(prefix, mode):
    """The last sequence has no next pointer: its end is the end of ``.bin``, as the open checks;
    a batch touching it reads it (no false alarm), and every sequence reads what was written."""
    tf = TokenFile(prefix, mode=mode)
    every = np.arange(N)
    lengths = np.array(LENGTHS[::-1], np.int64)
    flat = tf.read_pieces(every[::-1].copy(), np.zeros(N, np.int64), lengths)
    assert flat.tolist() == [t for i in every[::-1] for t in tf[int(i)].tolist()]


@pytest.mark.parametrize("mode", list(ReadMode))
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_megatron_order_batch_over_a_damaged_index_is_a_format_error(prefix, damage, mode):
    """The indices built from the damaged lengths; the batch's pieces are checked as it reads."""
    DAMAGE[damage](prefix)
    cfg = _config(prefix, mode)
    train = build_datasets(cfg, [40, 0, 0])[0]
    with pytest.raises(FormatError, match=r"d\.idx: sequence \d+ has pointer"):
        train.__getitems__(list(range(len(train))))


@pytest.mark.parametrize("mode", list(ReadMode))
def test_a_dtype_code_changed_to_the_same_width_disagrees_with_the_sidecar(prefix, mode):
    _patch(prefix, 17, struct.pack("<B", 3))  # uint16 (8) -> int16 (3): every size still fits
    named = r"d\.idx: the header's dtype code 3 means int16, but the sidecar d\.json records uint16"
    with pytest.raises(FormatError, match=named):
        TokenFile(prefix, mode=mode)[0]
    cfg = _config(prefix, mode)
    with pytest.raises(FormatError, match="records uint16"):
        train = build_datasets(cfg, [40, 0, 0])[0]
        train.__getitems__([0])


@pytest.mark.parametrize("mode", list(ReadMode))
def test_each_chunk_of_pointers_is_checked_on_its_first_use(prefix, mode, monkeypatch):
    """``token_starts`` checks a chunk of sequences at its first use: damage in a chunk a batch
    has not touched yet is found when one does, after other chunks were checked and marked."""
    import tokenload.format.reader as reader

    monkeypatch.setattr(reader, "CHECK_SHIFT", 2)  # chunks of 4 sequences: [0, 4) and [4, 8)
    monkeypatch.setattr(reader, "CHECK_CHUNK", 4)
    at = 34 + 4 * N + 8 * 5
    (pointer,) = struct.unpack("<q", Path(prefix + ".idx").read_bytes()[at:at + 8])
    _patch(prefix, at, struct.pack("<q", pointer + 2))  # sequence 5's pointer: one token on
    tf = TokenFile(prefix, mode=mode)
    one = np.ones(2, np.int64)
    assert tf.read_pieces(np.array([0, 3]), np.zeros(2, np.int64), one).size == 2  # chunk 0: sound
    assert tf._state.verified.tolist() == [True, False] and tf._state.unverified == 1
    with pytest.raises(FormatError, match=r"d\.idx: sequence 4 has pointer"):
        tf.read_pieces(np.array([1, 7]), np.zeros(2, np.int64), one)
    assert tf._state.verified.tolist() == [True, False]  # a damaged chunk is never marked
