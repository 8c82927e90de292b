"""Tokenizer kinds backed by libraries: HF ``tokenizers`` (tokenizer.json, GPT-2 vocab + merges, a
local model folder through transformers), tiktoken (.tiktoken file) and SentencePiece (.model).

Ids follow what Megatron-LM's tokenizer classes produce for one document: HF tokenizers apply
their post-processor (BOS/EOS templates) unless ``add_special_tokens`` is off, truncation and
padding stored in a tokenizer.json are ignored (transformers resets them per call), tiktoken
recognises its special tokens in text (``allowed_special="all"``), SentencePiece encodes plain.

``load_native`` returns the native tokenizer and its gigatoken source; ``load`` (above this module)
hands both to ``fast.accelerate``, which swaps in gigatoken where it gives the same ids.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, MissingExtraError, require
from .config import TokenizerSpec
from .tokenizer import PROBE_TEXTS, TextTokenizer

log = logging.getLogger(__name__)

_EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
_TIKTOKEN_KNOWN = {  # file stem -> (pattern, <|endoftext|> id)
    "gpt2": ("gpt2", 50256),
    "r50k_base": ("r50k", 50256),
    "p50k_base": ("p50k", 50256),
    "cl100k_base": ("cl100k", 100257),
    "o200k_base": ("o200k", 199999),
}
_R50K = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_CL100K = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_TIKTOKEN_PATTERNS = {
    "gpt2": _R50K,
    "r50k": _R50K,
    "p50k": _R50K,
    "cl100k": _CL100K,
    "o200k": _O200K,
}
_GIGATOKEN_SCHEMES = {
    "gpt2": "gpt2",
    "r50k": "r50k",
    "p50k": "r50k",
    "cl100k": "cl100k",
    "o200k": "o200k",
}


def load_native(spec: TokenizerSpec) -> tuple[TextTokenizer, Any]:
    """The native tokenizer for ``spec`` and what gigatoken would be built from (None: nothing)."""
    return _LOADERS[spec.kind](spec)


# -- HF tokenizers --------------------------------------------------------------------------------
class HFTokenizer(TextTokenizer):
    """A ``tokenizers.Tokenizer`` through its Rust batch encoder."""

    engine = "tokenizers"

    def __init__(
        self,
        tok: Any,
        *,
        kind: str,
        files: tuple[str, ...],
        eod_id: int | None,
        vocab_size: int,
        add_special_tokens: bool,
        options: dict[str, Any],
    ) -> None:
        tok.no_truncation()
        tok.no_padding()
        self.tok = tok
        self.kind, self.files, self.eod_id, self.vocab_size = kind, files, eod_id, vocab_size
        self.add_special_tokens = add_special_tokens
        self.options = options
        self._encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # fast: no offsets

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return _flatten(
            [e.ids for e in self._encode(texts, add_special_tokens=self.add_special_tokens)]
        )

    def affixes(self) -> tuple[list[int], list[int]]:
        """Ids the post-processor puts before and after every text (BOS/EOS templates)."""
        if not self.add_special_tokens:
            return [], []
        probe = PROBE_TEXTS[2]
        plain = self.tok.encode(probe, add_special_tokens=False).ids
        full = self.tok.encode(probe, add_special_tokens=True).ids
        for i in range(len(full) - len(plain) + 1):
            if full[i : i + len(plain)] == plain:
                return full[:i], full[i + len(plain) :]
        raise ValueError("the post-processor changes the text's own ids")


def _hf_vocab_size(tok: Any) -> int:
    vocab = tok.get_vocab(with_added_tokens=True)
    return max(len(vocab), max(vocab.values(), default=-1) + 1)


def _hf_eod(tok: Any, spec: TokenizerSpec, config_eos: str | None) -> int | None:
    if spec.eod_id is not None:
        return spec.eod_id
    names = [spec.eod_token] if spec.eod_token else [n for n in (config_eos, *_EOD_CANDIDATES) if n]
    for name in names:
        token_id: int | None = tok.token_to_id(name)
        if token_id is not None:
            return token_id
    if spec.eod_token:
        raise ConfigError(
            f"EOD token {spec.eod_token!r} is not in the tokenizer's vocabulary",
            hint="pass an existing token as `eod_token=`, or an id as `eod_id=`",
        )
    return None


def _config_eos(folder: Path) -> str | None:
    """eos_token from a tokenizer_config.json beside the tokenizer, if any."""
    try:
        eos = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get(
            "eos_token"
        )
    except (OSError, ValueError, AttributeError):
        return None
    return eos.get("content") if isinstance(eos, dict) else eos


def _load_huggingface(spec: TokenizerSpec) -> tuple[TextTokenizer, Any]:
    assert spec.model is not None  # TokenizerSpec requires it for this kind
    path = Path(spec.model)
    if path.is_dir():
        return _load_folder(spec, path)
    tokenizers = require("tokenizers", "preprocess", "the huggingface tokenizer")
    try:
        tok = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on parse errors
        raise ConfigError(
            f"cannot load tokenizer.json ({exc})",
            path=str(path),
            hint="pass a tokenizer.json saved by HF tokenizers/transformers",
        ) from None
    native = HFTokenizer(
        tok,
        kind="huggingface",
        files=(spec.model,),
        eod_id=_hf_eod(tok, spec, _config_eos(path.parent)),
        vocab_size=_hf_vocab_size(tok),
        add_special_tokens=spec.add_special_tokens,
        options=_options(spec),
    )
    return native, ("tokenizer.json", str(path), tok)


def _load_folder(spec: TokenizerSpec, folder: Path) -> tuple[TextTokenizer, Any]:
    assert spec.model is not None  # the folder
    try:
        transformers = require("transformers", "transformers", "loading a model folder's tokenizer")
    except MissingExtraError:
        if not (folder / "tokenizer.json").is_file():
            raise
        log.warning(
            "transformers is not installed: using %s/tokenizer.json without tokenizer_config.json",
            folder,
        )
        return _load_huggingface(dataclasses.replace(spec, model=str(folder / "tokenizer.json")))
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    eod = spec.eod_id
    if eod is None:
        eod = tok.convert_tokens_to_ids(spec.eod_token) if spec.eod_token else tok.eos_token_id
    if not getattr(tok, "is_fast", False):
        raise ConfigError(
            f"the tokenizer in {str(folder)!r} has no fast (Rust) implementation",
            path=str(folder),
            hint="save it with a tokenizer.json (save_pretrained of a fast tokenizer writes one)",
        )
    backend = tok.backend_tokenizer
    native = HFTokenizer(
        backend,
        kind="huggingface",
        files=(spec.model,),
        eod_id=eod,
        vocab_size=max(len(tok), _hf_vocab_size(backend)),
        add_special_tokens=spec.add_special_tokens,
        options=_options(spec),
    )
    return native, backend


def _load_gpt2(spec: TokenizerSpec) -> tuple[TextTokenizer, Any]:
    assert spec.vocab_file is not None and spec.merge_file is not None  # required for gpt2
    tokenizers = require("tokenizers", "preprocess", "the gpt2 tokenizer")
    from tokenizers import decoders, models, pre_tokenizers

    try:
        tok = tokenizers.Tokenizer(models.BPE.from_file(spec.vocab_file, spec.merge_file))
    except Exception as exc:
        raise ConfigError(
            f"cannot load GPT-2 vocab/merges ({exc})",
            path=spec.vocab_file,
            hint="pass GPT-2's vocab.json as `vocab_file=` and merges.txt as `merge_file=`",
        ) from None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if tok.token_to_id("<|endoftext|>") is not None:
        # transformers' GPT2Tokenizer (Megatron's GPT2BPETokenizer) treats it as a special token
        tok.add_special_tokens(["<|endoftext|>"])
    native = HFTokenizer(
        tok,
        kind="gpt2",
        files=(spec.vocab_file, spec.merge_file),
        eod_id=_hf_eod(tok, spec, None),
        vocab_size=_hf_vocab_size(tok),
        add_special_tokens=False,
        options=_options(spec),
    )
    return native, tok


# -- tiktoken -------------------------------------------------------------------------------------
class TiktokenTokenizer(TextTokenizer):
    """A tiktoken encoding built from a local .tiktoken rank file (never downloaded)."""

    kind = "tiktoken"
    engine = "tiktoken"

    def __init__(
        self, enc: Any, *, spec: TokenizerSpec, eod: tuple[str, int], pattern: str, vocab_size: int
    ) -> None:
        assert spec.model is not None  # TokenizerSpec requires it for this kind
        self.enc, self.eod_id, self.vocab_size = enc, eod[1], vocab_size
        self.eod_token, self.pattern = eod[0], pattern
        self.files = (spec.model,)
        self.options = {**_options(spec), "tiktoken_pattern": pattern}

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return _flatten([self.enc.encode(t, allowed_special="all") for t in texts])


def _load_tiktoken(spec: TokenizerSpec) -> tuple[TextTokenizer, Any]:
    assert spec.model is not None  # TokenizerSpec requires it for this kind
    tiktoken = require("tiktoken", "tiktoken", "the tiktoken tokenizer")
    ranks = _read_tiktoken_ranks(spec.model)
    stem = Path(spec.model).name.split(".")[0]
    known_pattern, known_eod = _TIKTOKEN_KNOWN.get(stem, (None, None))
    pattern = spec.tiktoken_pattern or known_pattern
    if pattern is None:
        raise ConfigError(
            f"cannot tell the split pattern of {Path(spec.model).name!r} from its name",
            path=spec.model,
            hint="pass `tiktoken_pattern=` (gpt2, r50k, p50k, cl100k or o200k)",
        )
    eod_token = spec.eod_token or "<|endoftext|>"
    eod_id = (
        spec.eod_id
        if spec.eod_id is not None
        else (known_eod if known_eod is not None else len(ranks))
    )
    if eod_id in ranks.values():
        raise ConfigError(
            f"EOD id {eod_id} is already a mergeable token of {spec.model}",
            hint="pass an `eod_id=` beyond the file's ranks",
        )
    enc = tiktoken.Encoding(
        name=stem,
        pat_str=_TIKTOKEN_PATTERNS[pattern],
        mergeable_ranks=ranks,
        special_tokens={eod_token: eod_id},
    )
    vocab_size = max(max(ranks.values(), default=-1), eod_id) + 1
    native = TiktokenTokenizer(
        enc, spec=spec, eod=(eod_token, eod_id), pattern=pattern, vocab_size=vocab_size
    )
    return native, ("tiktoken", spec.model, _GIGATOKEN_SCHEMES[pattern], {eod_token: eod_id})


def _read_tiktoken_ranks(path: str) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError:
                raise ConfigError(
                    f"line {number} is not '<base64 token> <rank>'",
                    path=path,
                    hint="pass a .tiktoken rank file",
                ) from None
    return ranks


# -- SentencePiece --------------------------------------------------------------------------------
class SentencePieceTokenizer(TextTokenizer):
    """A SentencePiece .model; EOD is the model's EOS (Megatron's GPTSentencePieceTokenizer)."""

    kind = "sentencepiece"
    engine = "sentencepiece"

    def __init__(self, sp: Any, spec: TokenizerSpec) -> None:
        assert spec.model is not None  # TokenizerSpec requires it for this kind
        self.sp, self.vocab_size = sp, sp.vocab_size()
        self.files, self.options = (spec.model,), _options(spec)
        if spec.eod_id is not None:
            self.eod_id = spec.eod_id
        elif spec.eod_token:
            self.eod_id = sp.piece_to_id(spec.eod_token)
            if self.eod_id == sp.unk_id() and spec.eod_token != sp.id_to_piece(sp.unk_id()):
                raise ConfigError(
                    f"EOD token {spec.eod_token!r} is not in {spec.model}",
                    hint="pass an existing piece as `eod_token=`, or an id as `eod_id=`",
                )
        else:
            self.eod_id = sp.eos_id() if sp.eos_id() >= 0 else None

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return _flatten(self.sp.encode(texts, out_type=int, num_threads=1))

    def control_pieces(self) -> tuple[str, ...]:
        """Texts of the control and unknown pieces (never matched in text by SentencePiece)."""
        sp = self.sp
        ids = [i for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)]
        return tuple(sorted({sp.id_to_piece(i) for i in ids} - {""}))


def _load_sentencepiece(spec: TokenizerSpec) -> tuple[TextTokenizer, Any]:
    spm = require("sentencepiece", "sentencepiece", "the sentencepiece tokenizer")
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(spec.model)
    except (OSError, RuntimeError) as exc:
        raise ConfigError(
            f"cannot load the SentencePiece model ({exc})",
            path=spec.model,
            hint="pass a .model file written by SentencePieceTrainer",
        ) from None
    return SentencePieceTokenizer(sp, spec), ("sentencepiece", spec.model)


_LOADERS = {
    "huggingface": _load_huggingface,
    "gpt2": _load_gpt2,
    "tiktoken": _load_tiktoken,
    "sentencepiece": _load_sentencepiece,
}


def _flatten(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
    return flat, lengths


def _options(spec: TokenizerSpec) -> dict[str, Any]:
    """Spec options that change ids, recorded only when they differ from the defaults."""
    out: dict[str, Any] = {}
    if spec.kind == "huggingface" and not spec.add_special_tokens:
        out["add_special_tokens"] = False
    if spec.eod_token:
        out["eod_token"] = spec.eod_token
    if spec.eod_id is not None:
        out["eod_id"] = spec.eod_id
    return out
