"""Writer output: the spec's worked example byte for byte, round trips, atomic publication."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenload.errors import ConfigError, FormatError
from tokenload.format import ReadMode, TokenFile, TokenFileWriter, optimal_dtype, read_sidecar

# spec §1.1: the 122-byte index of documents [1..5]/[5], [6,7,8]/[2,1], []/[], [9]/[1] (uint16)
EXAMPLE_IDX = bytes.fromhex(
    "4d4d49444944580000" "0100000000000000" "08" "0400000000000000" "0500000000000000"
    "05000000" "02000000" "01000000" "01000000"
    "0000000000000000" "0a00000000000000" "0e00000000000000" "1000000000000000"
    "0000000000000000" "0100000000000000" "0300000000000000" "0300000000000000" "0400000000000000"
)


def test_worked_example_is_byte_identical(small_file):
    assert len(EXAMPLE_IDX) == 122
    with open(small_file + ".idx", "rb") as f:
        assert f.read() == EXAMPLE_IDX
    with open(small_file + ".bin", "rb") as f:
        assert f.read() == np.arange(1, 10, dtype="<u2").tobytes()


def test_sidecar_records_counts_and_hashes(small_file):
    side = read_sidecar(small_file)
    assert (side.dtype, side.sequences, side.documents, side.tokens) == ("uint16", 4, 4, 9)
    assert (side.bin_bytes, side.idx_bytes) == (18, 122)
    import xxhash

    assert side.hashes["idx"]["xxh3_64"] == xxhash.xxh3_64(EXAMPLE_IDX).hexdigest()


@pytest.mark.parametrize(
    "vocab,expected",
    [(1000, np.uint16), (65499, np.uint16), (65500, np.int32), (200_000, np.int32)],
)
def test_optimal_dtype_follows_megatron_writer_rule(vocab, expected):
    assert optimal_dtype(vocab) == np.dtype(expected)


documents = st.lists(
    st.lists(st.lists(st.integers(0, 65535), max_size=12), max_size=4),  # a document = its sequences
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=documents, dtype=st.sampled_from([np.uint16, np.int32]), mode=st.sampled_from(list(ReadMode)))
def test_round_trip(tmp_path, docs, dtype, mode):
    prefix = str(tmp_path / f"rt{abs(hash(str(docs))) % 10**9}")
    with TokenFileWriter(prefix, dtype) as w:
        for doc in docs:
            flat = [t for seq in doc for t in seq]
            w.add_document(np.array(flat, dtype=np.int64), [len(s) for s in doc])
    tf = TokenFile(prefix, mode=mode)
    sequences = [s for doc in docs for s in doc]
    assert tf.num_sequences == len(sequences)
    assert tf.num_documents == len(docs)
    assert tf.num_tokens == sum(map(len, sequences))
    for i, seq in enumerate(sequences):
        np.testing.assert_array_equal(tf[i], np.array(seq, dtype=dtype))
    for d, doc in enumerate(docs):
        np.testing.assert_array_equal(tf.document(d), np.array([t for s in doc for t in s], dtype=dtype))
    assert tf.document_indices.tolist() == [0, *np.cumsum([len(d) for d in docs]).tolist()]


def test_item_api_matches_document_api(tmp_path):
    with TokenFileWriter(tmp_path / "a", np.int32) as w:
        w.add_document([1, 2, 3, 4], [3, 1])
        w.add_document([5], [1])
    with TokenFileWriter(tmp_path / "b", np.int32) as w:
        w.add_item([1, 2, 3])
        w.add_item([4])
        w.end_document()
        w.add_item([5])
        w.end_document()
    with TokenFileWriter(tmp_path / "c", np.int32) as w:
        w.add_document([1, 2, 3, 4], [3, 1])
        w.add_documents(np.array([5]), np.array([1]))
    for name in "bc":
        for ext in (".bin", ".idx"):
            assert (tmp_path / f"a{ext}").read_bytes() == (tmp_path / f"{name}{ext}").read_bytes()


def test_multimodal_modes_round_trip(tmp_path):
    with TokenFileWriter(tmp_path / "mm", np.int32, multimodal=True) as w:
        w.add_item([1, 2], mode=1)
        w.end_document()
        w.add_document([3, 4, 5], [1, 2])
    tf = TokenFile(tmp_path / "mm")
    assert tf.header.multimodal
    assert tf.sequence_modes.tolist() == [1, 0, 0]
    assert tf.sequence_lengths.tolist() == [2, 1, 2]


def test_lengths_must_partition_document(tmp_path):
    w = TokenFileWriter(tmp_path / "bad", np.uint16)
    with pytest.raises(ConfigError, match="sum to"):
        w.add_document([1, 2, 3], [2])
    w.abort()


def test_failed_writer_leaves_no_files(tmp_path):
    with pytest.raises(RuntimeError), TokenFileWriter(tmp_path / "x", np.uint16) as w:
        w.add_document([1, 2, 3])
        raise RuntimeError("killed")
    assert os.listdir(tmp_path) == []


def test_rewrite_replaces_pair_atomically(tmp_path):
    prefix = tmp_path / "p"
    with TokenFileWriter(prefix, np.uint16) as w:
        w.add_document([1, 2, 3])
    with TokenFileWriter(prefix, np.uint16) as w:
        w.add_document([7, 8])
        # Before finalize, the old pair is still the valid one and no new name is visible.
        assert TokenFile(prefix, mode="pread")[0].tolist() == [1, 2, 3]
    assert TokenFile(prefix)[0].tolist() == [7, 8]
    assert sorted(os.listdir(tmp_path)) == ["p.bin", "p.idx", "p.json"]


def test_killed_writer_leaves_only_hidden_temp_files(tmp_path):
    """A writer process killed with SIGKILL mid-way leaves nothing a reader would open."""
    import signal
    import subprocess
    import sys

    code = (
        "import numpy as np, time, sys\n"
        "from tokenload.format import TokenFileWriter\n"
        f"w = TokenFileWriter({str(tmp_path / 'k')!r}, np.uint16)\n"
        "w.add_document(np.arange(100000) % 60000)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    visible = [n for n in os.listdir(tmp_path) if not n.startswith(".")]
    assert visible == []
    assert any(n.startswith(".k.bin.tmp-") for n in os.listdir(tmp_path))


def test_default_dtype_is_int32(tmp_path):
    """A writer made without a dtype writes int32 (code 4) and keeps ids above uint16's range."""
    with TokenFileWriter(tmp_path / "d") as w:
        w.add_document([70000, 1, 2**31 - 1])
    assert (tmp_path / "d.idx").read_bytes()[17] == 4
    tf = TokenFile(tmp_path / "d")
    assert tf.dtype == np.dtype(np.int32)
    assert tf[0].tolist() == [70000, 1, 2**31 - 1]


@pytest.mark.parametrize(
    "dtype,tokens,bad",
    [
        (np.uint16, [1, 70000, 2], 70000),
        (np.uint16, [1, -1], -1),
        (np.uint16, np.array([65536], dtype=np.int32), 65536),
        (np.int32, [2**31], 2**31),
        (np.int32, np.array([5, 2**40], dtype=np.int64), 2**40),
        (np.int32, np.array([2**32 - 1], dtype=np.uint32), 2**32 - 1),
    ],
)
@pytest.mark.parametrize("api", ["add_document", "add_item", "add_documents"])
def test_tokens_outside_the_dtype_are_refused_not_wrapped(tmp_path, dtype, tokens, bad, api):
    w = TokenFileWriter(tmp_path / "r", dtype)
    w.add_document([3, 4])
    arr = np.asarray(tokens)
    call = {
        "add_document": lambda: w.add_document(arr),
        "add_item": lambda: w.add_item(arr),
        "add_documents": lambda: w.add_documents(arr, np.array([arr.size])),
    }[api]
    with pytest.raises(
        FormatError, match=rf"token {bad} does not fit this file's {np.dtype(dtype).name} tokens"
    ) as info:
        call()
    assert "HINT:" in str(info.value)
    w.add_document([5])  # the refused call wrote nothing; the writer goes on
    w.finalize()
    tf = TokenFile(tmp_path / "r")
    assert [tf[i].tolist() for i in range(len(tf))] == [[3, 4], [5]]


def test_range_limits_themselves_are_written(tmp_path):
    with TokenFileWriter(tmp_path / "u", np.uint16) as w:
        w.add_document(np.array([0, 65535], dtype=np.int64))
    assert TokenFile(tmp_path / "u")[0].tolist() == [0, 65535]


def test_non_integer_tokens_are_refused(tmp_path):
    with TokenFileWriter(tmp_path / "f", np.uint16) as w:
        with pytest.raises(FormatError, match="tokens are float64, expected integers"):
            w.add_document(np.array([1.5, 2.0]))
        w.add_document([])  # an empty document (NumPy makes [] float64) is fine
    assert TokenFile(tmp_path / "f").num_documents == 1


# -- adopt: one whole file linked instead of copied -----------------------------------------------
def _source(tmp_path, name: str = "part", sidecar: bool = True):
    prefix = str(tmp_path / name)
    with TokenFileWriter(prefix, np.uint16) as w:
        for n in (3, 1, 7):
            w.add_document(np.arange(n, dtype=np.uint16) + n)
    if not sidecar:
        os.unlink(prefix + ".json")
    return prefix


def _bytes(prefix: str) -> tuple[bytes, bytes]:
    return open(prefix + ".bin", "rb").read(), open(prefix + ".idx", "rb").read()


def test_adopt_gives_the_bytes_and_hashes_of_append_and_shares_the_inode(tmp_path):
    source = _source(tmp_path)
    with TokenFileWriter(tmp_path / "copied", np.uint16) as w:
        w.append(source)
    with TokenFileWriter(tmp_path / "linked", np.uint16) as w:
        assert w.adopt(source)
    linked, copied = str(tmp_path / "linked"), str(tmp_path / "copied")
    assert _bytes(linked) == _bytes(copied)
    assert read_sidecar(linked).hashes == read_sidecar(copied).hashes
    assert os.stat(linked + ".bin").st_ino == os.stat(source + ".bin").st_ino
    os.unlink(source + ".bin")  # the work folder's removal leaves the output whole
    assert TokenFile(linked)[2].tolist() == list(range(7, 14))


def test_adopt_declines_without_a_sidecar_or_on_another_dtype_and_append_still_works(tmp_path):
    bare = _source(tmp_path, "bare", sidecar=False)
    with TokenFileWriter(tmp_path / "out", np.uint16) as w:
        assert not w.adopt(bare)
        w.append(bare)
    assert _bytes(str(tmp_path / "out")) == _bytes(bare)
    with TokenFileWriter(tmp_path / "wide", np.int32) as w:
        assert not w.adopt(_source(tmp_path))
    with TokenFileWriter(tmp_path / "started", np.uint16) as w:
        w.add_document(np.array([1], np.uint16))
        assert not w.adopt(_source(tmp_path, "other"))


def test_nothing_may_be_added_after_adopt_and_the_source_is_untouched(tmp_path):
    source = _source(tmp_path)
    before = _bytes(source)
    w = TokenFileWriter(tmp_path / "out", np.uint16)
    assert w.adopt(source)
    with pytest.raises(FormatError, match="after adopt"):
        w.add_document(np.array([1, 2], np.uint16))
    w.abort()
    assert not os.path.exists(tmp_path / "out.bin") and _bytes(source) == before
