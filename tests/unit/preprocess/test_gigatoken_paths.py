"""gigatoken's padded batch call, over groups of texts sorted by length, gives the native
encoder's ids in input order whatever the grouping and the way rows are copied out, and a
preprocess run never imports awkward (the plain batch call's return type, 0.15-0.5 s of import)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from test_tokenizers import EXTRA, GIGATOKEN_KINDS, spec_for, split

from tokenload.preprocess import fast, load_tokenizer


@pytest.mark.parametrize("name", GIGATOKEN_KINDS)
@pytest.mark.parametrize("group_chars, row_copy_width", [(1 << 20, 128), (50, 0), (300, 10**9)])
def test_every_grouping_gives_native_ids_in_input_order(
    name, group_chars, row_copy_width, tokenizer_files, texts, monkeypatch
):
    monkeypatch.setattr(fast, "GROUP_CHARS", group_chars)
    monkeypatch.setattr(fast, "ROW_COPY_WIDTH", row_copy_width)
    tok = load_tokenizer(spec_for(name, tokenizer_files))
    native = load_tokenizer(spec_for(name, tokenizer_files, engine="native"))
    assert tok.engine == "gigatoken"
    sample = texts[:150] + EXTRA + [" ".join(texts[:40]), "", texts[3]]
    flat, lengths = tok.encode_batch(sample)
    assert split(flat, lengths) == split(*native.encode_batch(sample))


def test_groups_bound_rows_times_longest_text(monkeypatch):
    monkeypatch.setattr(fast, "GROUP_CHARS", 30)
    sorted_chars = np.array([1, 2, 3, 10, 10, 40, 200])
    order = np.array([6, 0, 5, 1, 4, 2, 3])
    groups = [g.tolist() for g in fast._groups(sorted_chars, order)]
    assert groups == [[6, 0, 5], [1, 4], [2], [3]]  # a text longer than the bound: a group alone


def test_a_preprocess_run_never_imports_awkward(tokenizer_files, texts, tmp_path):
    corpus = tmp_path / "docs.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for i in range(60):  # long and short documents
            f.write(json.dumps({"text": " ".join(texts[i : i + (40 if i % 2 else 1)])}) + "\n")
    code = f"""
import sys
from tokenload.preprocess import PreprocessConfig, TokenizerSpec, preprocess
spec = TokenizerSpec(kind="huggingface", model={tokenizer_files['bytelevel']!r})
result = preprocess(PreprocessConfig(inputs=({str(corpus)!r},), output_prefix={str(tmp_path / 'out')!r},
                    tokenizer=spec, append_eod=True, workers=2), progress=False)
print(result.engine, result.documents, "awkward" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["gigatoken", "60", "False"]
    written = np.fromfile(tmp_path / "out_text_document.bin", dtype=np.uint16)
    assert written.size > 30 * 40


def test_gigatoken_read_from_the_file_ignores_its_truncation_and_padding(tokenizer_files, texts, tmp_path):
    """gigatoken now reads the tokenizer.json file itself; the native encoder drops the
    truncation and padding stored there (as transformers does per call), and so must the ids."""
    from tokenizers import Tokenizer

    saved = Tokenizer.from_file(tokenizer_files["bytelevel"])
    saved.enable_truncation(5)
    saved.enable_padding(length=64)
    path = tmp_path / "tokenizer.json"
    saved.save(str(path))
    assert json.loads(path.read_text())["truncation"]["max_length"] == 5
    spec = spec_for("bytelevel", {"bytelevel": str(path)})
    tok, native = load_tokenizer(spec), load_tokenizer(spec_for("bytelevel", {"bytelevel": str(path)}, engine="native"))
    assert tok.engine == "gigatoken"
    sample = [" ".join(texts[:30]), "", texts[1]]
    flat, lengths = tok.encode_batch(sample)
    assert split(flat, lengths) == split(*native.encode_batch(sample))
    assert lengths[0] > 64


def test_a_tokenizer_json_gigatoken_cannot_read_falls_back_to_the_loaded_tokenizer(tokenizer_files, monkeypatch):
    import gigatoken

    def refuse(data):
        raise ValueError("unreadable")

    monkeypatch.setattr(gigatoken.Tokenizer, "from_json", staticmethod(refuse))
    tok = load_tokenizer(spec_for("bytelevel", tokenizer_files))
    assert tok.engine == "gigatoken"
