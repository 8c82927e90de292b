"""Tiny tokenizers of every kind, trained or written in-process (never downloaded), and a corpus.

One session fixture trains them all on a small generated corpus (about a second): byte-level
BPE tokenizer.json (plain and with a BOS post-processor), a SentencePiece-style BPE tokenizer.json
with byte fallback, WordPiece tokenizer.json, GPT-2 vocab.json + merges.txt, a .tiktoken rank
file, SentencePiece BPE (byte fallback) and unigram .model files, and a plain (whitespace,
unknown-token) BPE tokenizer.json.
"""

from __future__ import annotations

import base64
import io
import json

import pytest

from preprocess_texts import make_texts


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return make_texts(300)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    )
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _merge_pairs(model: dict) -> list[tuple[str, ...]]:
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]


def _train_bytelevel(corpus, vocab_size=500):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


def _sentencepiece_style_json(corpus) -> str:
    """A Llama-2-style tokenizer.json: BPE with byte fallback, '▁' for spaces, byte pieces."""
    from tokenizers import Tokenizer, models, normalizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
        ),
    )
    data = json.loads(tok.to_str())
    specials = ["<unk>", "<s>", "</s>"]
    learned = [
        k
        for k, _ in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
        if k not in specials
    ]
    order = specials + [f"<0x{i:02X}>" for i in range(256)] + learned
    data["model"].update(
        vocab={k: i for i, k in enumerate(order)},
        byte_fallback=True,
        unk_token="<unk>",
        fuse_unk=True,
    )
    for added in data["added_tokens"]:
        added["id"] = order.index(added["content"])
    return json.dumps(data)


def _tiktoken_ranks(bytelevel_tok) -> dict[bytes, int]:
    """Ranks equivalent to a byte-level BPE: the 256 bytes, then each merge in priority order."""
    model = json.loads(bytelevel_tok.to_str())["model"]
    inverse = {c: b for b, c in _bytes_to_unicode().items()}
    ranks = {bytes([b]): b for b in range(256)}
    for a, b in _merge_pairs(model):
        merged = bytes(inverse[c] for c in a + b)
        ranks.setdefault(merged, len(ranks))
    return ranks


def _train_sentencepiece(corpus, model_type: str) -> bytes:
    import sentencepiece as spm

    out = io.BytesIO()
    lines = [line for t in corpus for line in t.split("\n") if line.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=out,
        vocab_size=400 if model_type == "bpe" else 90,
        hard_vocab_limit=False,
        model_type=model_type,
        byte_fallback=model_type == "bpe",
        character_coverage=1.0,
        minloglevel=2,
        num_threads=1,
    )
    return out.getvalue()


@pytest.fixture(scope="session")
def tokenizer_files(tmp_path_factory, texts) -> dict[str, str]:
    """Paths of every tiny tokenizer, by name."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    root = tmp_path_factory.mktemp("tokenizers")
    corpus = make_texts(1500, seed=1)
    paths: dict[str, str] = {}

    bl = _train_bytelevel(corpus)
    paths["bytelevel"] = str(root / "bytelevel.json")
    bl.save(paths["bytelevel"])

    bos = Tokenizer.from_str(bl.to_str())
    eot = bos.token_to_id("<|endoftext|>")
    bos.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", eot)]
    )
    paths["bytelevel_bos"] = str(root / "bytelevel_bos.json")
    bos.save(paths["bytelevel_bos"])

    paths["sp_bpe_json"] = str(root / "sp_bpe.json")
    (root / "sp_bpe.json").write_text(_sentencepiece_style_json(corpus), encoding="utf-8")

    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.train_from_iterator(
        corpus,
        trainers.WordPieceTrainer(
            vocab_size=300, special_tokens=["[UNK]", "[SEP]"], show_progress=False
        ),
    )
    paths["wordpiece"] = str(root / "wordpiece.json")

    plain = Tokenizer(models.BPE(unk_token="[UNK]"))
    plain.pre_tokenizer = pre_tokenizers.Whitespace()
    plain.train_from_iterator(
        corpus,
        trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "</s>"], show_progress=False),
    )
    paths["bpe_plain"] = str(root / "bpe_plain.json")
    plain.save(paths["bpe_plain"])
    wp.save(paths["wordpiece"])

    model = json.loads(bl.to_str())["model"]
    paths["gpt2_vocab"] = str(root / "vocab.json")
    paths["gpt2_merges"] = str(root / "merges.txt")
    (root / "vocab.json").write_text(
        json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8"
    )
    merges = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in _merge_pairs(model))
    (root / "merges.txt").write_text(merges, encoding="utf-8")

    ranks = _tiktoken_ranks(bl)
    paths["tiktoken"] = str(root / "tiny.tiktoken")
    lines = (
        f"{base64.b64encode(tok).decode()} {rank}\n"
        for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])
    )
    (root / "tiny.tiktoken").write_text("".join(lines), encoding="ascii")

    for kind in ("bpe", "unigram"):
        paths[f"sp_{kind}"] = str(root / f"sp_{kind}.model")
        (root / f"sp_{kind}.model").write_bytes(_train_sentencepiece(corpus, kind))
    return paths
