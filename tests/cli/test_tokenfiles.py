"""`tokenload info`, `verify` and `merge`, run as real commands."""

from __future__ import annotations

import json

import numpy as np
from support import run_cli, write_documents


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
    data = bytearray(open(small_file + ".bin", "rb").read())
    data[0] ^= 1
    open(small_file + ".bin", "wb").write(bytes(data))
    bad_hash = run_cli("verify", "--hashes", small_file)
    assert bad_hash.returncode == 1 and "xxh3_64 is" in bad_hash.stdout


def test_verify_reports_broken_pointers(tmp_path):
    prefix = write_documents(tmp_path / "p", [[1, 2], [3, 4, 5], [6]])
    idx = bytearray(open(prefix + ".idx", "rb").read())
    idx[34 + 12 + 8] = 3  # pointer of sequence 1: 4 -> 3 (bytes)
    open(prefix + ".idx", "wb").write(bytes(idx))
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

    with TokenFileWriter(tmp_path / "s", np.uint16, tokenizer={"name": "t", "vocab_size": vocab_size, "eod_id": 0}) as w:
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
    data = bytearray(open(small_file + ".idx", "rb").read())
    data[34 + 12 * 4 + 8] = 9  # document_indices[1]: 1 -> 9, past the end
    broken = tmp_path / "broken"
    (tmp_path / "broken.idx").write_bytes(bytes(data))
    (tmp_path / "broken.bin").write_bytes(open(small_file + ".bin", "rb").read())
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
    ):
        out = run_cli(command, "--help")
        assert out.returncode == 0 and phrase in " ".join(out.stdout.split()), (command, out.stdout)


def test_merge_output_named_with_its_bin_suffix(tmp_path):
    a = write_documents(tmp_path / "a", [[1, 2]])
    out = run_cli("merge", a + ".idx", "--output-prefix", tmp_path / "m.bin")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("m.")) == ["m.bin", "m.idx", "m.json"]
