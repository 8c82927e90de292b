"""Merging follows Megatron's merge_datasets: sorted order, offset document indices, same dtype."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from support import write_documents
from tokenload.errors import ConfigError
from tokenload.format import TokenFile, merge_token_files, prefixes_in, verify


def test_merge_equals_single_write(tmp_path):
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 1000, size=int(n)) for n in rng.integers(0, 50, size=60)]
    (tmp_path / "parts").mkdir()
    write_documents(tmp_path / "parts" / "b", docs[20:45])
    write_documents(tmp_path / "parts" / "a", docs[:20])
    write_documents(tmp_path / "parts" / "c", docs[45:])
    whole = write_documents(tmp_path / "whole", docs)
    prefixes = prefixes_in(tmp_path / "parts")
    assert [p.rsplit("/", 1)[1] for p in prefixes] == ["a", "b", "c"]
    merge_token_files(prefixes, tmp_path / "merged")
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"merged{ext}").read_bytes() == Path(whole + ext).read_bytes()
    assert verify(str(tmp_path / "merged"), hashes=True) == []


def test_merge_keeps_multi_sequence_documents(tmp_path):
    a = write_documents(tmp_path / "a", [[1, 2, 3], []], lengths=[[2, 1], []])
    b = write_documents(tmp_path / "b", [[4, 5]], lengths=[[1, 1]])
    merge_token_files([a, b], tmp_path / "m")
    tf = TokenFile(tmp_path / "m")
    assert tf.document_indices.tolist() == [0, 2, 2, 4]
    assert tf.sequence_lengths.tolist() == [2, 1, 1, 1]


def test_merge_refuses_mixed_dtypes(tmp_path):
    a = write_documents(tmp_path / "a", [[1, 2]], dtype=np.uint16)
    b = write_documents(tmp_path / "b", [[70000]], dtype=np.int32)
    with pytest.raises(ConfigError, match="different token dtypes") as info:
        merge_token_files([a, b], tmp_path / "m")
    assert "HINT" in str(info.value)
    assert not (tmp_path / "m.bin").exists() and not (tmp_path / "m.idx").exists()


def test_folder_with_unpaired_file_is_refused(tmp_path):
    write_documents(tmp_path / "a", [[1]])
    (tmp_path / "b.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="without their pair"):
        prefixes_in(tmp_path)


@pytest.mark.parametrize("suffix", ["", ".bin", ".idx"])
def test_merge_keeps_the_shared_tokenizer_identity_however_inputs_are_named(tmp_path, suffix):
    from tokenload.format import TokenFileWriter, read_sidecar

    ident = {"kind": "byte", "vocab_size": 259}
    for name, doc in (("a", [1, 2]), ("b", [3])):
        with TokenFileWriter(tmp_path / name, np.uint16, tokenizer=ident) as w:
            w.add_document(np.asarray(doc))
    merge_token_files([str(tmp_path / f"{n}{suffix}") for n in "ab"], tmp_path / "m")
    assert read_sidecar(tmp_path / "m").tokenizer == ident


@pytest.mark.parametrize("damage", ["negative length", "pointer moved"])
@pytest.mark.parametrize("how", ["merge", "convert", "cli merge", "cli convert"])
def test_a_damaged_input_is_refused_and_nothing_is_written(tmp_path, damage, how):
    """Merging or converting a token file that `tokenload verify` fails was accepted (a red-team
    finding): a negative length made an output that fails verify, a moved pointer one that
    passes it, the damage laundered. It is a FormatError naming the input, and no output."""
    import struct

    from support import run_cli
    from tokenload.errors import FormatError
    from tokenload.format import convert_token_file

    good = write_documents(tmp_path / "good", [np.arange(1, 40), np.arange(1, 30), np.arange(5)])
    bad = write_documents(tmp_path / "bad", [np.arange(1, 40), np.arange(1, 30), np.arange(5)])
    with open(bad + ".idx", "r+b") as f:
        if damage == "negative length":
            f.seek(34)  # sequence 0's length
            f.write(struct.pack("<i", -5))
        else:
            f.seek(34 + 4 * 3 + 8)  # sequence 1's pointer, two tokens on
            (pointer,) = struct.unpack("<q", f.read(8))
            f.seek(34 + 4 * 3 + 8)
            f.write(struct.pack("<q", pointer + 4))
    assert verify(bad)
    out = tmp_path / "out"
    if how.startswith("cli"):
        args = ["merge", good, bad, "--output-prefix", str(out)] if how == "cli merge" else [
            "convert", bad, "--output-prefix", str(out)]
        done = run_cli(*args)
        assert done.returncode == 2 and "damaged token file" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    else:
        with pytest.raises(FormatError, match="cannot append a damaged token file") as info:
            if how == "merge":
                merge_token_files([good, bad], out)
            else:
                convert_token_file(bad, out)
        assert info.value.path == bad + ".idx" and "tokenload verify" in str(info.value)
    assert not list(tmp_path.glob("out*")) and not list(tmp_path.glob(".out*"))
