"""gigatoken as the encoder of byte-level BPE and byte-fallback SentencePiece BPE tokenizers.

gigatoken (Rust; single-threaded per call here, since the pipeline owns parallelism) gives the
ids of HF tokenizers / tiktoken / SentencePiece for these kinds many times faster. It ignores
post-processors, so the fixed prefix/suffix ids a post-processor adds (BOS/EOS templates) are put
back around its output, vectorized. It is used only when it reproduces the native encoder on
``PROBE_TEXTS`` at load; the tests check equality on every kind it accepts.

gigatoken's batch call returns an awkward Array, and importing awkward costs 0.15-0.5 s of CPU
per process (measured on the 2-core benchmark machine): a quarter of a whole 60 MB preprocess run.
Its one-text call returns NumPy and needs no awkward, but costs about 1-2.5 us more per text
(measured: 0.9 us at 64 characters, 2.6 us at 4 KB; the same CPU as the batch call on 17 KB
documents). So a process encodes one text per call until that extra cost would have paid for the
import (``PER_TEXT_BUDGET`` texts), then batches; long-document corpora never import awkward,
short-document ones pay at most twice the cheaper choice. Both paths give the same ids: the batch
path is compared with the one-text path on ``PROBE_TEXTS`` before its first use.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from ..errors import ConfigError, MissingExtraError, require
from ..format.bin import gather_index
from .backends import HFTokenizer, SentencePieceTokenizer
from .config import TokenizerSpec
from .tokenizer import PROBE_TEXTS, TextTokenizer

log = logging.getLogger(__name__)

#: Characters gigatoken encodes differently from the SentencePiece library.
SENTENCEPIECE_DIVERGENT_CHARS = "\x85"
#: Texts a process encodes one per call before it imports awkward and batches (see above):
#: about 0.15 s of import at ~2 us of extra cost per one-text call.
PER_TEXT_BUDGET = 75_000


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
        giga,
        prefix: list[int],
        suffix: list[int],
        markers: tuple[str, ...] = (),
    ) -> None:
        self.native, self.giga, self.markers = native, giga, markers
        self.kind, self.files, self.options = native.kind, native.files, native.options
        self.vocab_size, self.eod_id = native.vocab_size, native.eod_id
        self.prefix = np.asarray(prefix, dtype=np.int64)
        self.suffix = np.asarray(suffix, dtype=np.int64)
        self._per_text_left = PER_TEXT_BUDGET
        self._batch_ok: bool | None = None  # None: the batch path is not checked yet
        self._lock = threading.Lock()

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.markers:
            routed = [i for i, t in enumerate(texts) if any(m in t for m in self.markers)]
            if routed:
                return self._encode_mixed(texts, routed)
        return self._encode_fast(texts)

    def _encode_fast(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self._use_batch(len(texts)):
            flat, lengths = _encode_batched(self.giga, texts)
        else:
            flat, lengths = _encode_one_by_one(self.giga, texts)
        if self.prefix.size or self.suffix.size:
            return _wrap(flat, lengths, self.prefix, self.suffix)
        return flat, lengths

    def _use_batch(self, count: int) -> bool:
        """Whether ``count`` texts go through the batch call (see the module docstring)."""
        with self._lock:
            if self._per_text_left > 0:
                self._per_text_left -= count
                return False
            if self._batch_ok is None:
                probe = list(PROBE_TEXTS)
                a, b = _encode_batched(self.giga, probe), _encode_one_by_one(self.giga, probe)
                self._batch_ok = all(np.array_equal(x, y) for x, y in zip(a, b))
                if not self._batch_ok:
                    log.info("gigatoken's batch call differs from its one-text call; not batching")
            return self._batch_ok

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


def _encode_batched(giga, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """gigatoken's batch call (imports awkward on first use): (uint32 ids, int64 lengths)."""
    layout = giga.encode_batch(texts, parallel=False).layout
    offsets = np.asarray(layout.offsets.data)
    flat = np.asarray(layout.content.data)[offsets[0] : offsets[-1]]
    return flat, np.diff(offsets).astype(np.int64)


def _encode_one_by_one(giga, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """One gigatoken call per text (NumPy out, no awkward): (uint32 ids, int64 lengths)."""
    encode = giga.backend.encode  # the Rust method: no wrapper call per text
    pieces = [encode(text) for text in texts]
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    return np.concatenate(pieces), lengths


def _wrap(flat: np.ndarray, lengths: np.ndarray, prefix: np.ndarray, suffix: np.ndarray):
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


def accelerate(native: TextTokenizer, source, spec: TokenizerSpec) -> TextTokenizer:
    """``native``, or gigatoken standing in for it when it is available and gives the same ids."""
    try:
        gigatoken = require("gigatoken", "fast", "the gigatoken engine")
    except MissingExtraError:
        if spec.engine == "gigatoken":
            raise
        return native
    try:
        if isinstance(source, tuple) and source[0] == "tiktoken":
            giga = gigatoken.Tokenizer.from_tiktoken(
                source[1], pretokenizer=source[2], special_tokens=source[3]
            )
        elif isinstance(source, tuple):
            giga = gigatoken.Tokenizer.from_sentencepiece(source[1])
        else:
            giga = gigatoken.Tokenizer(source)
        prefix, suffix = native.affixes() if isinstance(native, HFTokenizer) else ([], [])
        markers = ()
        if isinstance(native, SentencePieceTokenizer):
            # U+0085 (NEXT LINE) is the one character whose ids differ: SentencePiece's
            # normalizer handles it, gigatoken does not (found by the hypothesis test, then an
            # exhaustive probe of U+0080..U+FFFF and a stride over the astral planes).
            markers = (*native.control_pieces(), SENTENCEPIECE_DIVERGENT_CHARS)
        fast = GigatokenTokenizer(native, giga, prefix, suffix, markers)
        same = _same_ids(native, fast)
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
            hint="drop --engine gigatoken (the native encoder gives the reference ids)",
        )
    log.info(
        "gigatoken not used for this %s tokenizer (%s); using %s", spec.kind, reason, native.engine
    )
    return native


def _same_ids(a: TextTokenizer, b: TextTokenizer) -> bool:
    texts = list(PROBE_TEXTS)
    fa, la = a.encode_batch(texts)
    fb, lb = b.encode_batch(texts)
    return np.array_equal(la, lb) and np.array_equal(fa.astype(np.int64), fb.astype(np.int64))
