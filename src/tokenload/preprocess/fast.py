"""gigatoken as the encoder of byte-level BPE and byte-fallback SentencePiece BPE tokenizers.

gigatoken (Rust; single-threaded per call here, since the pipeline owns parallelism) gives the
ids of HF tokenizers / tiktoken / SentencePiece for these kinds many times faster. It ignores
post-processors, so the fixed prefix/suffix ids a post-processor adds (BOS/EOS templates) are put
back around its output, vectorized. It is used only when it reproduces the native encoder on
``PROBE_TEXTS`` at load; the tests check equality on every kind it accepts.

gigatoken's calls differ in what they cost besides encoding (measured on the 2-core benchmark
machine): ``encode_batch`` returns an awkward Array, and importing awkward costs 0.15-0.5 s of CPU
per process, a quarter of a whole 60 MB preprocess run; the one-text ``encode`` holds the GIL
while it encodes, so worker threads would encode one at a time. ``encode_batch_padded`` needs
neither: it releases the GIL and returns a NumPy matrix (one row per text, padded to the longest),
and given its texts as a ``BytesSource`` of UTF-8 buffers (a list of str makes it import awkward
to check the input's type) it never imports awkward.
Texts are therefore sorted by length and encoded in groups of similar lengths (``GROUP_CHARS``
characters of rows x longest text at most, which bounds the padding and the matrix), and each
row's ids are copied to the text's place: one slice per row for long rows, one masked gather for
groups of short ones. The ids are the batch call's, proven equal to the native encoder's at load.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..byte_source import gather_index
from ..errors import ConfigError, MissingExtraError, require
from .backends import HFTokenizer, SentencePieceTokenizer
from .config import TokenizerSpec
from .tokenizer import PROBE_TEXTS, TextTokenizer, id_beyond_dtype

log = logging.getLogger(__name__)

#: Characters gigatoken encodes differently from the SentencePiece library.
SENTENCEPIECE_DIVERGENT_CHARS = "\x85"
#: Rows x longest text (characters) of one padded call: a 1 MB matrix for text of about 4
#: characters per token, 16 MB at most (a token per UTF-8 byte, 4 per character).
GROUP_CHARS = 1 << 20
#: Characters from which a text is encoded by the one-text call: the padded call holds a text's
#: ids twice for a moment (its own buffer, then the matrix: 720 MB more for a 500 MB document),
#: the one-text call once, but it holds the GIL while it encodes (about 0.4 s for 64 MB here).
ONE_TEXT_CHARS = 1 << 26
#: Mean padded width from which rows are copied one slice each rather than by one masked gather
#: (a slice costs about 1 us, the gather about 8 ns per token).
ROW_COPY_WIDTH = 128


class GigatokenTokenizer(TextTokenizer):
    """gigatoken's encoder with the identity and affixes of the native tokenizer it replaces.

    gigatoken always matches special-token texts inside the input; SentencePiece never does for
    its control pieces (``<s>``, ``</s>``, ``<unk>``), and it does not normalize U+0085 as
    SentencePiece does. Texts containing one of those ``markers`` (a C-speed substring test) are
    therefore encoded by the native tokenizer instead.
    """

    engine = "gigatoken"

    def __init__(
        self,
        native: TextTokenizer,
        giga: Any,
        prefix: list[int],
        suffix: list[int],
        markers: tuple[str, ...] = (),
    ) -> None:
        self.native, self.giga, self.markers = native, giga, markers
        self.kind, self.files, self.options = native.kind, native.files, native.options
        self.vocab_size, self.eod_id = native.vocab_size, native.eod_id
        self.prefix = np.asarray(prefix, dtype=np.int64)
        self.suffix = np.asarray(suffix, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.markers:
            routed = [i for i, t in enumerate(texts) if any(m in t for m in self.markers)]
            if routed:
                return self._encode_mixed(texts, routed)
        return self._encode_fast(texts)

    def encode_documents(
        self, texts: list[str], eod: int | None, dtype: np.dtype
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """One document per text, laid out as ``encode.layout_documents`` lays out
        ``encode_batch``'s output, with each row of gigatoken's matrices written once, straight
        into the output dtype after its document's EOD slot is reserved. None (nothing done, the
        caller takes the general path) where that path's result or error could differ: affixes,
        texts for the native encoder, an EOD id the dtype cannot hold. A token id beyond the
        dtype raises the general path's error (naming the largest id). ``texts`` is emptied
        (see ``_encode_groups``)."""
        info = np.iinfo(dtype)
        if self.prefix.size or self.suffix.size:
            return None
        if eod is not None and not info.min <= eod <= info.max:
            return None
        if self.markers and any(any(m in t for m in self.markers) for t in texts):
            return None
        if not texts:
            return np.zeros(0, dtype), np.zeros(0, np.int32), np.zeros(0, np.int32)
        lengths, groups = _encode_groups(self.giga, texts, consume=True)
        # gigatoken's ids are below its vocabulary size (its largest id + 1, added tokens
        # included): when the dtype holds that, no id can be beyond it and the ids need no scan
        if self.giga.vocab_size - 1 > info.max:
            top = max((int(m.max()) for _, m in groups if m.size), default=0)
            if top > info.max:
                raise id_beyond_dtype(top, dtype)
        return _documents(lengths, groups, eod, dtype)

    def _encode_fast(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        flat, lengths = _encode_grouped(self.giga, texts)
        if self.prefix.size or self.suffix.size:
            return _wrap(flat, lengths, self.prefix, self.suffix)
        return flat, lengths

    def _encode_mixed(self, texts: list[str], routed: list[int]) -> tuple[np.ndarray, np.ndarray]:
        native_mask = np.zeros(len(texts), dtype=bool)
        native_mask[routed] = True
        fast_ids, fast_lengths = self._encode_fast([t for t, m in zip(texts, native_mask) if not m])
        slow_ids, slow_lengths = self.native.encode_batch([texts[i] for i in routed])
        lengths = np.empty(len(texts), dtype=np.int64)
        lengths[~native_mask], lengths[native_mask] = fast_lengths, slow_lengths
        starts = np.cumsum(lengths) - lengths
        out = np.empty(int(lengths.sum()), dtype=np.int64)
        out[gather_index(starts[~native_mask], fast_lengths)] = fast_ids
        out[gather_index(starts[native_mask], slow_lengths)] = slow_ids
        return out, lengths


def _encode_grouped(giga: Any, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """gigatoken's padded batch call over groups of similar lengths (see the module docstring):
    (uint32 ids of every text in input order, int64 length per text)."""
    lengths, groups = _encode_groups(giga, texts)
    starts = np.cumsum(lengths) - lengths
    flat = np.empty(int(lengths.sum()), dtype=np.uint32)
    for rows, matrix in groups:
        _place(flat, starts[rows], lengths[rows], matrix)
    return flat, lengths


def _encode_groups(
    giga: Any, texts: list[str], consume: bool = False
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """(int64 length per text, [(rows, padded uint32 matrix of those rows)]). With ``consume``
    ``texts`` is emptied once its UTF-8 copies exist, so a large document's ``str`` is freed
    before its ids are (only the caller's list is cleared; the strings go when nothing else
    holds them)."""
    from gigatoken.gigatoken_rs import BytesSource, PadTruncate

    no_padding_rules = PadTruncate(0)
    chars = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    order = np.argsort(chars, kind="stable")
    utf8 = list(map(str.encode, texts))
    if consume:
        texts.clear()
    lengths = np.empty(len(utf8), dtype=np.int64)
    groups = []
    for rows in _groups(chars[order], order):
        if rows.size == 1 and chars[rows[0]] >= ONE_TEXT_CHARS:  # see ONE_TEXT_CHARS
            matrix = giga.backend.encode(utf8[rows[0]]).reshape(1, -1)
            lengths[rows] = matrix.shape[1]
        else:
            buffers = BytesSource(list(map(utf8.__getitem__, rows.tolist())))
            matrix, got = giga.backend.encode_batch_padded(
                buffers, no_padding_rules, parallel=False
            )
            del buffers
            lengths[rows] = got
        groups.append((rows, matrix))
    return lengths, groups


def _documents(
    lengths: np.ndarray,
    groups: list[tuple[np.ndarray, np.ndarray]],
    eod: int | None,
    dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens in ``dtype``, int32 sequence lengths, int32 sequences per document) of one
    document per text: a text of no token is an empty document (no sequence, no EOD), every
    other one sequence of its ids plus the EOD when ``eod`` is not None."""
    kept = lengths > 0
    sizes = lengths + kept if eod is not None else lengths
    starts = np.cumsum(sizes) - sizes
    tokens = np.empty(int(sizes.sum()), dtype=dtype)
    for rows, matrix in groups:
        _place(tokens, starts[rows], lengths[rows], matrix)
    if eod is not None:
        tokens[(starts + lengths)[kept]] = eod
    return tokens, sizes[kept].astype(np.int32), kept.astype(np.int32)


def _groups(sorted_chars: np.ndarray, order: np.ndarray) -> list[np.ndarray]:
    """Consecutive runs of ``order`` (texts sorted by length) whose rows x longest text stays
    within ``GROUP_CHARS`` (a text longer than that is a group of its own)."""
    groups, start, n = [], 0, sorted_chars.size
    while start < n:
        rows = np.arange(1, n - start + 1)
        fits = int(
            np.searchsorted(np.maximum(sorted_chars[start:], 1) * rows, GROUP_CHARS, "right")
        )
        stop = start + max(fits, 1)
        groups.append(order[start:stop])
        start = stop
    return groups


def _place(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, matrix: np.ndarray) -> None:
    """Copy row r's first ``lengths[r]`` ids of ``matrix`` to ``flat[starts[r]:]``."""
    if matrix.size >= ROW_COPY_WIDTH * matrix.shape[0]:
        for row, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist())):
            flat[start : start + length] = matrix[row, :length]
        return
    keep = np.arange(matrix.shape[1]) < lengths[:, None]
    flat[gather_index(starts, lengths)] = matrix[keep]


def _wrap(
    flat: np.ndarray, lengths: np.ndarray, prefix: np.ndarray, suffix: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Put ``prefix`` before and ``suffix`` after every text's ids, vectorized."""
    extra = prefix.size + suffix.size
    new_lengths = lengths + extra
    starts = np.concatenate(([0], np.cumsum(new_lengths)[:-1]))
    out = np.empty(int(new_lengths.sum()), dtype=np.int64)
    out[gather_index(starts + prefix.size, lengths)] = flat
    if prefix.size:
        out[(starts[:, None] + np.arange(prefix.size)).ravel()] = np.tile(prefix, lengths.size)
    if suffix.size:
        tail = starts + prefix.size + lengths
        out[(tail[:, None] + np.arange(suffix.size)).ravel()] = np.tile(suffix, lengths.size)
    return out, new_lengths


def accelerate(native: TextTokenizer, source: Any, spec: TokenizerSpec) -> TextTokenizer:
    """``native``, or gigatoken standing in for it when it is available and gives the same ids."""
    try:
        gigatoken = require("gigatoken", "fast", "the gigatoken engine")
    except MissingExtraError:
        if spec.engine == "gigatoken":
            raise
        return native
    try:
        if isinstance(source, tuple) and source[0] == "tokenizer.json":
            giga = _from_tokenizer_json(gigatoken, source[1], source[2])
        elif isinstance(source, tuple) and source[0] == "tiktoken":
            giga = gigatoken.Tokenizer.from_tiktoken(
                source[1], pretokenizer=source[2], special_tokens=source[3]
            )
        elif isinstance(source, tuple):
            giga = gigatoken.Tokenizer.from_sentencepiece(source[1])
        else:
            giga = gigatoken.Tokenizer(source)
        prefix, suffix = native.affixes() if isinstance(native, HFTokenizer) else ([], [])
        markers: tuple[str, ...] = ()
        if isinstance(native, SentencePieceTokenizer):
            # U+0085 (NEXT LINE) is the one character whose ids differ: SentencePiece's
            # normalizer handles it, gigatoken does not (found by the hypothesis test, then an
            # exhaustive probe of U+0080..U+FFFF and a stride over the astral planes).
            markers = (*native.control_pieces(), SENTENCEPIECE_DIVERGENT_CHARS)
        fast = GigatokenTokenizer(native, giga, prefix, suffix, markers)
        same = same_ids(native.encode_batch(list(PROBE_TEXTS)), fast)
    except Exception as exc:  # gigatoken raises RuntimeError/ValueError for what it cannot encode
        same, reason = False, str(exc).splitlines()[0]
    else:
        reason = "its ids differ from the native encoder's on the probe texts"
    if same:
        log.debug("encoding with gigatoken")
        return fast
    if spec.engine == "gigatoken":
        raise ConfigError(
            f"gigatoken cannot be used for this {spec.kind} tokenizer: {reason}",
            hint="drop `engine='gigatoken'` (the native encoder gives the reference ids)",
        )
    log.info(
        "gigatoken not used for this %s tokenizer (%s); using %s", spec.kind, reason, native.engine
    )
    return native


def _from_tokenizer_json(gigatoken: Any, path: str, loaded: Any) -> Any:
    """gigatoken from the tokenizer.json file's own bytes, which skips serializing the loaded HF
    tokenizer back to JSON (20 ms for a 32k BPE, on the run's serial start); from the loaded
    tokenizer if gigatoken cannot read the file. Truncation and padding stored in the file, which
    the native encoder drops, are ignored by gigatoken either way; the probe checks the ids."""
    try:
        return read_tokenizer_json(gigatoken, path)
    except Exception:  # gigatoken raises ValueError/RuntimeError for what it cannot read
        return gigatoken.Tokenizer(loaded)


def read_tokenizer_json(gigatoken: Any, path: str) -> Any:
    """gigatoken's tokenizer from a tokenizer.json file's own bytes."""
    with open(path, "rb") as f:
        return gigatoken.Tokenizer.from_json(f.read())


def same_ids(native_ids: tuple[np.ndarray, np.ndarray], b: TextTokenizer) -> bool:
    """Whether ``b`` gives ``native_ids`` (the native encoder's flat ids and lengths) on
    ``PROBE_TEXTS``."""
    fa, la = native_ids
    fb, lb = b.encode_batch(list(PROBE_TEXTS))
    return np.array_equal(la, lb) and np.array_equal(fa.astype(np.int64), fb.astype(np.int64))
