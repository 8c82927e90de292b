"""`tokenload info`, `verify`, `merge` and `convert`, run as real commands."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from support import FIXTURES, run_cli, write_documents
from tokenload.format import TokenFileWriter

LEGACY = FIXTURES / "legacy"


def test_info_reports_counts(small_file):
    out = run_cli("info", small_file)
    assert out.returncode == 0, out.stderr
    assert "documents    4 (1 empty)" in out.stdout
    assert "tokens       9" in out.stdout
    js = json.loads(run_cli("info", "--json", small_file).stdout)
    assert (js["documents"], js["sequences"], js["tokens"], js["dtype"]) == (4, 4, 9, "uint16")
    assert js["document_tokens"]["p100"] == 5


def test_verify_ok_then_detects_vocab_and_hash_problems(small_file):
    ok = run_cli("verify", "--hashes", "--vocab-size", "10", small_file)
    assert ok.returncode == 0 and ok.stdout.startswith("OK"), ok.stdout + ok.stderr
    bad_vocab = run_cli("verify", "--vocab-size", "9", small_file)
    assert bad_vocab.returncode == 1
    assert "token 9 at position 8 is outside the vocabulary [0, 9)" in bad_vocab.stdout
    data = bytearray(Path(small_file + ".bin").read_bytes())
    data[0] ^= 1
    Path(small_file + ".bin").write_bytes(bytes(data))
    bad_hash = run_cli("verify", "--hashes", small_file)
    assert bad_hash.returncode == 1 and "xxh3_64 is" in bad_hash.stdout


def test_verify_reports_broken_pointers(tmp_path):
    prefix = write_documents(tmp_path / "p", [[1, 2], [3, 4, 5], [6]])
    idx = bytearray(Path(prefix + ".idx").read_bytes())
    idx[34 + 12 + 8] = 3  # pointer of sequence 1: 4 -> 3 (bytes)
    Path(prefix + ".idx").write_bytes(bytes(idx))
    out = run_cli("verify", prefix)
    assert out.returncode == 1
    assert "sequence pointers disagree with the lengths; first at sequence 1: 3, expected 4" in out.stdout


def test_merge_folder_and_user_error_is_one_line(tmp_path):
    (tmp_path / "in").mkdir()
    write_documents(tmp_path / "in" / "x1", [[1, 2, 3]])
    write_documents(tmp_path / "in" / "x2", [[4]])
    out = run_cli("merge", "--input", tmp_path / "in", "--output-prefix", tmp_path / "all")
    assert out.returncode == 0, out.stderr
    info = json.loads(run_cli("info", "--json", tmp_path / "all").stdout)
    assert (info["documents"], info["tokens"]) == (2, 4)
    write_documents(tmp_path / "in" / "x3", [[70000]], dtype=np.int32)
    bad = run_cli("merge", "--input", tmp_path / "in", "--output-prefix", tmp_path / "all2")
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "different token dtypes" in bad.stderr and "HINT" in bad.stderr
    missing = run_cli("info", tmp_path / "nope")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def _sidecar_file(tmp_path, tokens, vocab_size):
    from tokenload.format import TokenFileWriter

    with TokenFileWriter(
        tmp_path / "s", np.uint16, tokenizer={"name": "t", "vocab_size": vocab_size, "eod_id": 0}
    ) as w:
        w.add_document(np.asarray(tokens))
    return str(tmp_path / "s")


def test_info_finds_the_sidecar_whichever_file_is_named(tmp_path):
    prefix = _sidecar_file(tmp_path, [1, 2], 50)
    for name in (prefix, prefix + ".bin", prefix + ".idx"):
        out = run_cli("info", name)
        assert out.returncode == 0, out.stderr
        assert "tokenizer    t (vocab 50, eod 0)" in out.stdout and "sidecar      none" not in out.stdout
        js = json.loads(run_cli("info", "--json", name).stdout)
        assert js["prefix"] == prefix and js["sidecar"]["tokenizer"]["vocab_size"] == 50


def test_info_says_when_each_sequence_is_a_document(tmp_path):
    from tokenload.format.idx import encode_index

    prefix = write_documents(tmp_path / "neox", [[1, 2], [3], [4, 5, 6]])
    with open(prefix + ".idx", "wb") as f:  # GPT-NeoX's merge: document_indices == [0]
        f.writelines(encode_index(np.uint16, np.array([2, 1, 3]), np.array([0])))
    out = run_cli("info", prefix)
    assert out.returncode == 0, out.stderr
    assert "documents    3 (0 empty)" in out.stdout
    assert "no document boundaries (document_indices == [0]" in out.stdout
    assert "each sequence is read as one document" in out.stdout
    js = json.loads(run_cli("info", "--json", prefix).stdout)
    assert (js["documents"], js["documents_from_sequences"]) == (3, True)
    plain = json.loads(run_cli("info", "--json", write_documents(tmp_path / "p", [[1]])).stdout)
    assert plain["documents_from_sequences"] is False


def test_verify_says_what_it_checked(tmp_path, small_file):
    bare = write_documents(tmp_path / "bare", [[1, 2]])
    (tmp_path / "bare.json").unlink()  # as Megatron writes it: no sidecar
    out = run_cli("verify", bare)
    assert out.returncode == 0, out.stderr
    assert "[checked: structure (header, sizes, pointers, document indices); structure only:" in out.stdout
    out = run_cli("verify", "--vocab-size", "10", "--hashes", small_file)
    assert out.returncode == 0, out.stderr
    assert "tokens < 10 (--vocab-size); xxh3-64 hashes against the sidecar]" in out.stdout


def test_verify_uses_the_sidecars_vocab_size(tmp_path):
    prefix = _sidecar_file(tmp_path, [1, 7, 2], 5)
    out = run_cli("verify", prefix)
    assert out.returncode == 1
    assert "tokens < 5 (the sidecar's vocab_size)" in out.stdout
    assert "token 7 at position 1 is outside the vocabulary [0, 5)" in out.stdout
    assert run_cli("verify", "--vocab-size", "8", prefix).returncode == 0  # the flag wins


def test_verify_exit_codes_are_documented_and_kept(tmp_path, small_file):
    help_text = " ".join(run_cli("verify", "--help").stdout.split())
    assert "Exit status: 0 every file valid, 1 a file is invalid, 2 a usage error" in help_text
    assert run_cli("verify", small_file).returncode == 0
    data = bytearray(Path(small_file + ".idx").read_bytes())
    data[34 + 12 * 4 + 8] = 9  # document_indices[1]: 1 -> 9, past the end
    broken = tmp_path / "broken"
    (tmp_path / "broken.idx").write_bytes(bytes(data))
    (tmp_path / "broken.bin").write_bytes(Path(small_file + ".bin").read_bytes())
    assert run_cli("verify", broken).returncode == 1
    assert run_cli("verify", "--vocab-size", "ten", small_file).returncode == 2
    assert run_cli("verify", "--vocab-size", "0", small_file).returncode == 2
    missing = run_cli("verify", tmp_path / "nope")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_every_token_file_command_has_a_description():
    for command, phrase in (
        ("info", "Describe Megatron token files"),
        ("verify", "Check Megatron token files"),
        ("merge", "Concatenate token files into one"),
        ("convert", "Rewrite one token file as megatron-core's MMIDIDX pair"),
    ):
        out = run_cli(command, "--help")
        assert out.returncode == 0 and phrase in " ".join(out.stdout.split()), (command, out.stdout)


def test_merge_output_named_with_its_bin_suffix(tmp_path):
    a = write_documents(tmp_path / "a", [[1, 2]])
    out = run_cli("merge", a + ".idx", "--output-prefix", tmp_path / "m.bin")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("m.")) == ["m.bin", "m.idx", "m.json"]


def _copy_fixture(name, folder):
    for ext in ("idx", "bin"):
        shutil.copy(LEGACY / f"{name}.{ext}", folder / f"{name}.{ext}")
    return str(folder / name)


def test_convert_a_legacy_neox_file(tmp_path):
    """GPT-NeoX's legacy (TNTIDX) file: info and verify read it, convert writes the MMIDIDX pair
    megatron-core's builder writes for the same documents, and the output reads the same."""
    legacy = _copy_fixture("cached", tmp_path)
    info = run_cli("info", legacy)
    assert info.returncode == 0, info.stderr
    assert "format       TNTIDX (legacy fairseq cached/lazy index" in info.stdout
    assert "documents    5 (1 empty)" in info.stdout and "dtype        int32 (code 4)" in info.stdout
    ok = run_cli("verify", legacy)
    assert ok.returncode == 0 and ok.stdout.startswith("OK") and "legacy TNTIDX" in ok.stdout, ok.stdout
    out = run_cli("convert", legacy + ".idx", "--output-prefix", tmp_path / "new")
    assert out.returncode == 0, out.stderr
    assert "(TNTIDX, dtype code 4) into" in out.stdout and "5 documents, 17 tokens (int32)" in out.stdout
    expected = json.loads((LEGACY / "expected.json").read_text())["files"]["cached"]
    with TokenFileWriter(tmp_path / "ref", np.int32) as w:  # megatron-core's bytes (test_writer.py)
        for doc in expected["documents"]:
            w.add_document(np.array([t for s in doc for t in s], np.int64), [len(s) for s in doc])
    for ext in ("idx", "bin"):
        assert (tmp_path / f"new.{ext}").read_bytes() == (tmp_path / f"ref.{ext}").read_bytes(), ext
    assert "format       MMIDIDX" in run_cli("info", tmp_path / "new").stdout
    side = json.loads((tmp_path / "new.json").read_text())
    assert side["metadata"]["converted_from"]["index_format"] == "TNTIDX"


def test_convert_neox_mmidx_files_to_megatron_core_codes_and_boundaries(tmp_path):
    floats = _copy_fixture("mmap_float32", tmp_path)
    info = run_cli("info", floats)
    assert "note         dtype code 6 read as float32 (GPT-NeoX's table" in info.stdout, info.stdout
    out = run_cli("convert", floats, "--output-prefix", tmp_path / "f")
    assert out.returncode == 0 and "(MMIDIDX, dtype code 6) into" in out.stdout, out.stdout + out.stderr
    assert "(MMIDIDX, dtype code 7)" in out.stdout and (tmp_path / "f.idx").read_bytes()[17] == 7
    merged = _copy_fixture("mmap_merged", tmp_path)
    out = run_cli("convert", merged, "--output-prefix", tmp_path / "m")
    assert out.returncode == 0 and "one document per sequence" in out.stdout, out.stdout + out.stderr
    docs = np.frombuffer((tmp_path / "m.idx").read_bytes()[34 + 12 * 6 :], dtype="<i8").tolist()
    assert docs == [0, 1, 2, 3, 4, 5, 6]


def test_convert_user_errors_are_one_line(tmp_path):
    floats = _copy_fixture("mmap_float32", tmp_path)
    forced = run_cli("convert", floats, "--output-prefix", tmp_path / "f", "--dtype-codes", "megatron")
    assert forced.returncode == 2 and len(forced.stderr.strip().splitlines()) == 1, forced.stderr
    assert "swapped between megatron-core and GPT-NeoX" in forced.stderr
    broken = _copy_fixture("cached", tmp_path)
    idx = bytearray((tmp_path / "cached.idx").read_bytes())
    idx[8] = 2  # version
    (tmp_path / "cached.idx").write_bytes(bytes(idx))
    bad = run_cli("convert", broken, "--output-prefix", tmp_path / "b")
    assert bad.returncode == 2 and "legacy fairseq index (TNTIDX): version is 2" in bad.stderr, bad.stderr
    assert not list(tmp_path.glob("b.*")) and not list(tmp_path.glob(".b.*"))
