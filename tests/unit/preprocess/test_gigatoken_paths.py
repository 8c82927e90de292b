"""gigatoken's two call paths (one text per call, then the batch call once a process has encoded
``PER_TEXT_BUDGET`` texts) give the native encoder's ids, and a run of long documents never
imports awkward (the batch call's return type, 0.15-0.5 s of import)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tokenload.preprocess import fast, load_tokenizer

from test_tokenizers import EXTRA, GIGATOKEN_KINDS, spec_for, split


@pytest.mark.parametrize("name", GIGATOKEN_KINDS)
@pytest.mark.parametrize("budget", [0, 7, 10**9])
def test_every_path_gives_native_ids(name, budget, tokenizer_files, texts, monkeypatch):
    monkeypatch.setattr(fast, "PER_TEXT_BUDGET", budget)
    tok = load_tokenizer(spec_for(name, tokenizer_files))
    native = load_tokenizer(spec_for(name, tokenizer_files, engine="native"))
    assert tok.engine == "gigatoken"
    sample = texts[:150] + EXTRA
    want = split(*native.encode_batch(sample))
    for start, stop in ((0, 5), (5, None), (0, None)):  # budget 7: the switch happens mid-way
        assert split(*tok.encode_batch(sample[start:stop])) == want[start:stop]


def test_the_batch_call_is_checked_before_its_first_use(tokenizer_files, texts, monkeypatch):
    monkeypatch.setattr(fast, "PER_TEXT_BUDGET", 0)
    calls = []
    real = fast._encode_batched

    def wrong(giga, batch):
        calls.append(len(batch))
        flat, lengths = real(giga, batch)
        return flat + 1, lengths  # a batch call that disagrees with the one-text call

    monkeypatch.setattr(fast, "_encode_batched", wrong)
    tok = load_tokenizer(spec_for("bytelevel", tokenizer_files))
    native = load_tokenizer(spec_for("bytelevel", tokenizer_files, engine="native"))
    assert tok.engine == "gigatoken"
    for _ in range(2):
        assert split(*tok.encode_batch(texts[:20])) == split(*native.encode_batch(texts[:20]))
    assert calls == [len(fast.PROBE_TEXTS)]  # checked once (at the load's probe), never used


def test_a_run_of_long_documents_never_imports_awkward(tokenizer_files, texts, tmp_path):
    corpus = tmp_path / "long.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for i in range(60):
            f.write(json.dumps({"text": " ".join(texts[i : i + 40])}) + "\n")
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
    assert written.size > 60 * 40
