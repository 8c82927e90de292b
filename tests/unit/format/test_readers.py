"""The three read modes agree; readers open lazily per process and survive fork and spawn."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tokenload.format import FlatTokenFile, ReadMode, TokenFile, warmup_file, write_flat


def test_modes_return_identical_arrays(random_file):
    prefix, docs = random_file
    files = {m: TokenFile(prefix, mode=m) for m in ReadMode}
    rng = np.random.default_rng(0)
    seqs = rng.integers(0, len(docs), size=200)
    lengths = np.array([len(docs[s]) for s in seqs])
    offsets = (rng.random(200) * lengths).astype(np.int64)
    take = ((lengths - offsets) * rng.random(200)).astype(np.int64)
    expected = np.concatenate([docs[s][o : o + t] for s, o, t in zip(seqs, offsets, take)])
    for mode, tf in files.items():
        got = tf.read_pieces(seqs, offsets, take)
        assert got.dtype == np.uint16, mode
        np.testing.assert_array_equal(got, expected, err_msg=str(mode))
        for i in (0, 17, len(docs) - 1):
            np.testing.assert_array_equal(tf[i], docs[i])
            np.testing.assert_array_equal(
                tf.get(i, offset=1, length=max(len(docs[i]) - 2, 0)),
                docs[i][1 : 1 + max(len(docs[i]) - 2, 0)],
            )
        parts = tf[10:20]
        for got_part, doc in zip(parts, docs[10:20]):
            np.testing.assert_array_equal(got_part, doc)


def test_get_out_of_sequence_range_is_index_error(small_file):
    tf = TokenFile(small_file)
    with pytest.raises(IndexError):
        tf.get(0, offset=3, length=5)
    with pytest.raises(IndexError):
        tf[4]
    assert tf[-1].tolist() == [9]


def test_pickle_holds_only_path_and_options(small_file):
    tf = TokenFile(small_file, mode="pread")
    assert tf[0].tolist() == [1, 2, 3, 4, 5]  # opened
    blob = pickle.dumps(tf)
    assert len(blob) < 400
    clone = pickle.loads(blob)
    assert clone._state is None and clone.mode is ReadMode.PREAD
    assert clone[1].tolist() == [6, 7]


def test_reopens_after_fork(small_file):
    import os

    tf = TokenFile(small_file)
    tf[0]
    parent_state = tf._state
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the inherited state belongs to the parent and must not be used
        ok = tf[3].tolist() == [9] and tf._state is not parent_state
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    assert tf._state is parent_state


def test_warmup_reads_whole_file(random_file):
    prefix, _ = random_file
    import os

    assert warmup_file(prefix + ".bin") == os.path.getsize(prefix + ".bin")
    tf = TokenFile(prefix, warmup=True)
    assert tf.num_sequences == 400


def test_empty_file_pair(tmp_path):
    from tokenload.format import TokenFileWriter

    with TokenFileWriter(tmp_path / "empty", np.uint16):
        pass
    for mode in ReadMode:
        tf = TokenFile(tmp_path / "empty", mode=mode)
        assert (tf.num_sequences, tf.num_documents, tf.num_tokens) == (0, 0, 0)
        assert tf[:] == []


@pytest.mark.parametrize("mode", list(ReadMode))
def test_flat_file(tmp_path, mode):
    tokens = (np.arange(10_000) * 7) % 50257
    write_flat(tmp_path / "train.bin", tokens)
    flat = FlatTokenFile(tmp_path / "train.bin", mode=mode)
    assert flat.num_tokens == 10_000
    np.testing.assert_array_equal(flat.read(100, 50), tokens[100:150])
    got = flat.read_spans(np.array([5, 9000, 0]), np.array([3, 10, 0]))
    np.testing.assert_array_equal(got, np.concatenate([tokens[5:8], tokens[9000:9010]]))
    clone = pickle.loads(pickle.dumps(flat))
    assert clone._source is None and clone.read(0, 2).tolist() == tokens[:2].tolist()


def test_flat_file_odd_size_is_format_error(tmp_path):
    from tokenload.errors import FormatError

    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(FormatError, match="not a multiple"):
        FlatTokenFile(tmp_path / "odd.bin").num_tokens


@pytest.mark.parametrize("mode", list(ReadMode))
@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
@pytest.mark.parametrize("mean_length", [4, 700])  # a per-token gather below 32 tokens per span, a join above
def test_read_spans_every_mode_dtype_and_span_length(tmp_path, mode, dtype, mean_length):
    from tokenload.errors import FormatError
    from tokenload.format.bin import open_bin

    tokens = ((np.arange(50_000, dtype=np.int64) * 7919) % 60_000).astype(dtype)
    tokens.tofile(tmp_path / "t.bin")
    source = open_bin(str(tmp_path / "t.bin"), np.dtype(dtype), mode)
    rng = np.random.default_rng(mean_length)
    lengths = rng.integers(0, 2 * mean_length, size=40)
    starts = rng.integers(0, tokens.size - lengths)
    lengths[3] = 0  # an empty span in the middle
    starts[-1], lengths[-1] = tokens.size - 5, 5  # the file's last tokens
    expected = np.concatenate([tokens[s : s + n] for s, n in zip(starts, lengths)])
    got = source.read_spans(starts, lengths)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, expected)
    wide = source.read_spans(starts, lengths, np.int64)
    assert wide.dtype == np.int64 and wide.flags.writeable
    np.testing.assert_array_equal(wide, expected.astype(np.int64))
    assert source.read_spans(starts[:0], lengths[:0]).size == 0
    with pytest.raises(
        FormatError,
        match=rf"\[{tokens.size - 5}, {tokens.size + 1}\) is outside the {tokens.size} tokens",
    ):
        source.read_spans(starts, lengths + (np.arange(lengths.size) == lengths.size - 1))
    with pytest.raises(FormatError, match="outside"):
        source.read_spans(np.array([-1, 0]), np.array([1, 1]))
    source.close()


@pytest.mark.parametrize("mode", list(ReadMode))
def test_read_spans_overflowing_end_is_format_error(tmp_path, mode):
    """A corrupt index whose start + length wraps past int64 must not pass as a short read."""
    from tokenload.errors import FormatError
    from tokenload.format.bin import open_bin

    np.arange(100, dtype=np.uint16).tofile(tmp_path / "t.bin")
    source = open_bin(str(tmp_path / "t.bin"), np.dtype(np.uint16), mode)
    huge = np.iinfo(np.int64).max
    for starts, lengths in (([10, 20], [5, huge]), ([huge, 0], [huge, 1]), ([0], [101])):
        with pytest.raises(FormatError, match="outside the 100 tokens"):
            source.read_spans(np.array(starts), np.array(lengths))
    source.close()


def test_pread_spans_adjacent_runs_short_reads_and_failures(tmp_path, monkeypatch):
    """pread reads runs of spans that continue each other with one call, finishes reads that
    return fewer bytes than asked (network filesystems do), and a file that ends early or a
    failing read is a StorageError, never a partly filled array."""
    import os

    from tokenload.errors import StorageError
    from tokenload.format.bin import open_bin

    tokens = (np.arange(10_000) % 50_000).astype(np.uint16)
    tokens.tofile(tmp_path / "t.bin")
    source = open_bin(str(tmp_path / "t.bin"), np.dtype(np.uint16), "pread")
    starts = np.array([100, 110, 110, 130, 5, 9_990, 0])  # 100-110-130 continue each other
    lengths = np.array([10, 0, 20, 7, 3, 10, 0])
    expected = np.concatenate([tokens[s : s + n] for s, n in zip(starts, lengths)])
    real = os.preadv
    calls = []

    def counted(fd, buffers, offset):
        calls.append((offset, len(buffers[0])))
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", counted)
    np.testing.assert_array_equal(source.read_spans(starts, lengths), expected)
    # tokens 100-137 in one read, none for empty spans
    assert calls == [(200, 74), (10, 6), (19_980, 20)]

    def short(fd, buffers, offset):  # at most 4 bytes per call
        return real(fd, [memoryview(buffers[0]).cast("B")[:4]], offset)

    monkeypatch.setattr(os, "preadv", short)
    np.testing.assert_array_equal(source.read_spans(starts, lengths), expected)
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: 0)  # the file was truncated
    with pytest.raises(StorageError, match="file ended after 200 bytes, expected 274"):
        source.read_spans(starts, lengths)

    def failing(fd, buffers, offset):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "preadv", failing)
    with pytest.raises(StorageError, match="cannot read token data"):
        source.read_spans(starts, lengths)
    source.close()
