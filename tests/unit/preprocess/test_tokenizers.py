"""Every tokenizer kind gives its reference library's ids; gigatoken gives the same ids wherever
it is used; identity, EOD and dtype follow the rules."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenload.errors import ConfigError
from tokenload.preprocess import TokenizerSpec, load_tokenizer
from tokenload.preprocess.fast import _wrap

EXTRA = [
    "",
    " ",
    "<|endoftext|> inside text",
    "<s> and </s> or <unk> in text",
    "a" * 2000,
    "\r\n\r\n",
    "\u00a0\u2028",
    "🙂" * 30,
]


def split(flat, lengths):
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    return [flat[a:b].tolist() for a, b in itertools.pairwise(bounds)]


def spec_for(name: str, files: dict[str, str], **kw) -> TokenizerSpec:
    if name == "gpt2":
        return TokenizerSpec(
            kind="GPT2BPETokenizer",
            vocab_file=files["gpt2_vocab"],
            merge_file=files["gpt2_merges"],
            **kw,
        )
    if name == "tiktoken":
        return TokenizerSpec(
            kind="tiktoken", model=files["tiktoken"], tiktoken_pattern="gpt2", **kw
        )
    if name.startswith("sp_") and not name.endswith("json"):
        return TokenizerSpec(kind="GPTSentencePieceTokenizer", model=files[name], **kw)
    return TokenizerSpec(kind="HuggingFaceTokenizer", model=files[name], **kw)


def reference_ids(name: str, files: dict[str, str], texts: list[str]) -> list[list[int]]:
    """Ids from the reference library, one text at a time."""
    if name in ("bytelevel", "bytelevel_bos", "sp_bpe_json", "wordpiece", "bpe_plain"):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(files[name])
        return [tok.encode(t).ids for t in texts]
    if name == "gpt2":  # vocab/merges were written from the byte-level tokenizer: same ids
        return reference_ids("bytelevel", files, texts)
    if name == "tiktoken":
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
        from tiktoken_ext.openai_public import r50k_pat_str

        ranks = load_tiktoken_bpe(files["tiktoken"])
        enc = tiktoken.Encoding(
            "t",
            pat_str=r50k_pat_str,
            mergeable_ranks=ranks,
            special_tokens={"<|endoftext|>": len(ranks)},
        )
        return [enc.encode(t, allowed_special="all") for t in texts]
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=files[name])
    return [sp.encode(t) for t in texts]


ALL = [
    "bytelevel",
    "bytelevel_bos",
    "sp_bpe_json",
    "wordpiece",
    "bpe_plain",
    "gpt2",
    "tiktoken",
    "sp_bpe",
    "sp_unigram",
]
GIGATOKEN_KINDS = ["bytelevel", "bytelevel_bos", "sp_bpe_json", "gpt2", "tiktoken", "sp_bpe"]


def test_byte_tokenizer_is_utf8_bytes_with_eod_256():
    tok = load_tokenizer(TokenizerSpec(kind="byte"))
    texts = ["", "aé", "日本", "\x00\n"]
    flat, lengths = tok.encode_batch(texts)
    assert split(flat, lengths) == [list(t.encode("utf-8")) for t in texts]
    assert (tok.vocab_size, tok.eod_id, tok.dtype) == (257, 256, np.dtype(np.uint16))
    assert tok.identity() == {"name": "byte", "kind": "byte", "vocab_size": 257, "eod_id": 256}
    with pytest.raises(ConfigError, match="collides"):
        load_tokenizer(TokenizerSpec(kind="byte", eod_id=10))
    # it names no token, so an EOD named by its text is refused (it was silently ignored: the
    # EOD stayed 256 and the sidecar did not say so), as other tokenizers refuse an unknown one
    with pytest.raises(ConfigError, match="the byte tokenizer has no token named"):
        load_tokenizer(TokenizerSpec(kind="byte", eod_token="<|endoftext|>"))


@pytest.mark.parametrize("name", ALL)
def test_native_ids_equal_reference_library(name, tokenizer_files, texts):
    tok = load_tokenizer(spec_for(name, tokenizer_files, engine="native"))
    sample = texts[:120] + EXTRA
    flat, lengths = tok.encode_batch(sample)
    assert split(flat, lengths) == reference_ids(name, tokenizer_files, sample)
    assert tok.engine != "gigatoken"


@pytest.mark.parametrize("name", GIGATOKEN_KINDS)
def test_gigatoken_is_chosen_and_gives_native_ids(name, tokenizer_files, texts):
    fast = load_tokenizer(spec_for(name, tokenizer_files))
    native = load_tokenizer(spec_for(name, tokenizer_files, engine="native"))
    assert fast.engine == "gigatoken"
    sample = texts + EXTRA
    f1, l1 = fast.encode_batch(sample)
    f2, l2 = native.encode_batch(sample)
    assert np.array_equal(l1, l2) and np.array_equal(f1.astype(np.int64), f2)
    assert fast.identity() == native.identity()


def test_sentencepiece_next_line_character_goes_to_the_native_encoder(tokenizer_files):
    """U+0085 made gigatoken and SentencePiece disagree (hypothesis found it in CI)."""
    fast = _cached("sp_bpe", tokenizer_files, "auto")
    native = _cached("sp_bpe", tokenizer_files, "native")
    docs = ["\x85", "a\x85b", "plain text", "x \x85 y \x85"]
    f1, l1 = fast.encode_batch(docs)
    f2, l2 = native.encode_batch(docs)
    assert split(f1, l1) == split(f2, l2)
    assert fast.engine == "gigatoken"


_unicode_docs = st.lists(st.text(max_size=80), min_size=1, max_size=8)


@pytest.mark.parametrize("name", ["bytelevel", "sp_bpe_json", "sp_bpe", "tiktoken"])
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(docs=_unicode_docs)
def test_gigatoken_equals_native_on_arbitrary_unicode(name, tokenizer_files, docs):
    fast = _cached(name, tokenizer_files, "auto")
    native = _cached(name, tokenizer_files, "native")
    f1, l1 = fast.encode_batch(docs)
    f2, l2 = native.encode_batch(docs)
    assert split(f1, l1) == split(f2, l2)


_CACHE: dict = {}


def _cached(name, files, engine):
    key = (name, engine)
    if key not in _CACHE:
        _CACHE[key] = load_tokenizer(spec_for(name, files, engine=engine))
    return _CACHE[key]


@pytest.mark.parametrize("name", ["wordpiece", "sp_unigram", "bpe_plain"])
def test_gigatoken_not_used_where_it_does_not_apply(name, tokenizer_files):
    assert load_tokenizer(spec_for(name, tokenizer_files)).engine in ("tokenizers", "sentencepiece")
    with pytest.raises(ConfigError, match="gigatoken cannot"):
        load_tokenizer(spec_for(name, tokenizer_files, engine="gigatoken"))


def test_post_processor_bos_follows_add_special_tokens(tokenizer_files):
    with_bos = load_tokenizer(spec_for("bytelevel_bos", tokenizer_files))
    plain = load_tokenizer(spec_for("bytelevel_bos", tokenizer_files, add_special_tokens=False))
    eot = with_bos.eod_id
    f1, l1 = with_bos.encode_batch(["", "cat sat"])
    f2, l2 = plain.encode_batch(["", "cat sat"])
    assert split(f1, l1) == [[eot], [eot] + split(f2, l2)[1]]
    assert l2[0] == 0
    assert plain.identity()["options"] == {"add_special_tokens": False}


def test_eod_ids_per_kind(tokenizer_files):
    vocab = json.loads(Path(tokenizer_files["gpt2_vocab"]).read_text(encoding="utf-8"))
    assert load_tokenizer(spec_for("bytelevel", tokenizer_files)).eod_id == vocab["<|endoftext|>"]
    assert load_tokenizer(spec_for("gpt2", tokenizer_files)).eod_id == vocab["<|endoftext|>"]
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=tokenizer_files["sp_bpe"])
    assert load_tokenizer(spec_for("sp_bpe", tokenizer_files)).eod_id == sp.eos_id()
    tik = load_tokenizer(spec_for("tiktoken", tokenizer_files))
    nranks = sum(1 for line in Path(tokenizer_files["tiktoken"]).read_text().splitlines() if line.strip())
    assert (tik.eod_id, tik.vocab_size) == (nranks, nranks + 1)
    assert load_tokenizer(spec_for("wordpiece", tokenizer_files)).eod_id is None
    assert load_tokenizer(spec_for("wordpiece", tokenizer_files, eod_token="[SEP]")).eod_id == 1
    assert load_tokenizer(spec_for("bytelevel", tokenizer_files, eod_id=7)).eod_id == 7
    with pytest.raises(ConfigError, match="not in the tokenizer's vocabulary"):
        load_tokenizer(spec_for("wordpiece", tokenizer_files, eod_token="<nope>"))


def test_tokenizer_config_eos_beside_tokenizer_json(tmp_path, tokenizer_files):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_files["wordpiece"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "[SEP]"}}))
    assert (
        load_tokenizer(TokenizerSpec(kind="hf", model=str(tmp_path / "tokenizer.json"))).eod_id == 1
    )


def test_identity_records_file_hash_and_vocab(tokenizer_files):
    tok = load_tokenizer(spec_for("gpt2", tokenizer_files))
    ident = tok.identity()
    vocab_bytes = Path(tokenizer_files["gpt2_vocab"]).read_bytes()
    assert ident["xxh3_64"] == xxhash.xxh3_64(vocab_bytes).hexdigest()
    assert [f["path"] for f in ident["files"]] == [
        tokenizer_files["gpt2_vocab"],
        tokenizer_files["gpt2_merges"],
    ]
    assert ident["vocab_size"] == len(json.loads(vocab_bytes))
    assert ident["kind"] == "gpt2" and ident["name"] == "gpt2:vocab.json"


def test_vocabulary_of_65500_or_more_gives_int32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    for size, dtype in ((65499, np.uint16), (65500, np.int32)):
        vocab = {f"w{i}": i for i in range(size - 1)} | {"[UNK]": size - 1}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        path = tmp_path / f"wl{size}.json"
        tok.save(str(path))
        loaded = load_tokenizer(TokenizerSpec(kind="hf", model=str(path)))
        assert loaded.vocab_size == size and loaded.dtype == np.dtype(dtype)
        flat, _ = loaded.encode_batch([f"w{size - 2} w0 zzz"])
        assert flat.tolist() == [size - 2, 0, size - 1]


def test_wrap_puts_affixes_around_every_text():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 5, size=30)
    flat = rng.integers(0, 100, size=int(lengths.sum()))
    prefix, suffix = np.array([900, 901]), np.array([999])
    out, new_lengths = _wrap(flat, lengths, prefix, suffix)
    expected = [[900, 901, *doc, 999] for doc in split(flat, lengths)]
    assert split(out, new_lengths) == expected


def test_bad_tokenizer_settings_are_config_errors(tmp_path, tokenizer_files):
    with pytest.raises(ConfigError, match="GPTSentencePieceTokenizer"):
        TokenizerSpec(kind="SentencePieceTokenizer", model="x.model")
    with pytest.raises(ConfigError, match="needs both"):
        TokenizerSpec(kind="gpt2", vocab_file="v.json")
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(TokenizerSpec(kind="hf", model=str(tmp_path / "missing.json")))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"cannot load tokenizer.json"):
        load_tokenizer(TokenizerSpec(kind="hf", model=str(tmp_path / "bad.json")))
    renamed = tmp_path / "mystery.tiktoken"
    renamed.write_bytes(Path(tokenizer_files["tiktoken"]).read_bytes())
    with pytest.raises(ConfigError, match="`tiktoken_pattern=`"):
        load_tokenizer(TokenizerSpec(kind="tiktoken", model=str(renamed)))


def test_local_model_folder_goes_through_transformers(tmp_path, tokenizer_files, texts):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    backend = Tokenizer.from_file(tokenizer_files["bytelevel_bos"])
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>").save_pretrained(
        tmp_path / "model"
    )
    tok = load_tokenizer(TokenizerSpec(kind="hf", model=str(tmp_path / "model")))
    reference = AutoTokenizer.from_pretrained(str(tmp_path / "model"), local_files_only=True)
    sample = texts[:80] + EXTRA
    flat, lengths = tok.encode_batch(sample)
    assert split(flat, lengths) == reference(sample)["input_ids"]
    assert (tok.eod_id, tok.vocab_size, tok.engine) == (
        reference.eos_token_id,
        len(reference),
        "gigatoken",
    )
    assert tok.identity()["name"] == "huggingface:model"


def test_a_tokenizer_shipped_as_bytes_encodes_like_the_original(tokenizer_files, texts, tmp_path):
    """The Ray executor sends tokenizer files as bytes; the copy a worker writes and loads gives
    the same ids (file names kept: tiktoken takes its pattern from the name)."""
    from tokenload.preprocess.ray_worker import local_spec
    from tokenload.preprocess.ray_worker import tokenizer_files as files_of

    for spec in (
        TokenizerSpec(kind="huggingface", model=tokenizer_files["bytelevel"], engine="native"),
        TokenizerSpec(kind="tiktoken", model=tokenizer_files["tiktoken"], tiktoken_pattern="gpt2"),
    ):
        shipped = files_of(spec)
        copy = local_spec(spec, shipped)
        assert copy.model != spec.model and os.path.basename(copy.model) == os.path.basename(spec.model)
        a, b = load_tokenizer(spec).encode_batch(texts[:50]), load_tokenizer(copy).encode_batch(texts[:50])
        assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
        assert local_spec(spec, shipped) == copy  # written once per content
