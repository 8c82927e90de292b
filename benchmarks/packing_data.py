"""The documents of benchmarks/packing.py and the metrics every side is judged by.

Two length mixes, each a tokenload token file (``PREFIX.bin`` + ``.idx`` + sidecar), uint16,
every document ending with the EOD id (so OLMo-core, which finds documents by scanning for its
EOS id, sees the same documents as the ``.idx``; its raw ``.npy`` format is the ``.bin``'s bytes):

* ``stdlib``: a real corpus, ``tokenload corpus`` (the Python standard library's sources) tokenized
  by ``tokenload preprocess`` with a byte-level BPE of 32,000 tokens trained in-process with HF
  ``tokenizers`` (benchmarks/preprocess.py's ``train_tokenizer``), ``--append-eod``;
* ``web``: a heavy-tailed web-text mix, lognormal lengths of median 400 tokens and sigma 1.3
  (mean ~930; at 200k documents about 20 past 50k tokens, the longest ~100k), random tokens in
  [1, 32000) and the EOD id 0 last, written by tokenload's ``TokenFileWriter``.

Both are made once in ``DATA/`` and reused.

Metrics, computed the same way for every side from the rows it made (document index, first token
within the document, tokens); pieces lie back to back from slot 0 of their row, so a row holding
``held`` tokens fills its slots ``[0, held)``. ``padding`` = empty token slots / all token slots,
of the side's own slots (tokenload's rows have S + 1: S inputs and the extra label token; a row of
S slots has S inputs and S - 1 targets), so it is not the same quantity on both kinds of row. The
like-for-like measures: ``padded_inputs`` = input positions (a row's first S slots) that hold no
document token, ``max(0, S - held)`` a row, over rows x S; ``masked_labels`` = label positions
whose loss is masked because no document token is there to predict (the padding's ``loss_mask``
0: what ``loader.metrics()`` counts as padding), over rows x S: label slot ``i`` (``i`` in
``[0, S)``) predicts the row's token ``i + 1``, which exists when ``i + 1 < min(held, slots)``, so
a row has ``min(held - 1, S, slots - 1)`` loss-bearing labels (``min(held - 1, S)`` for S + 1
slots; ``min(held - 1, S - 1)`` for S: such a row's last label has nothing to predict, as
OLMo-core's ``get_labels`` pads it with its ignore index) and the rest of its S are masked.
Both layouts then mask ``S + 1 - held`` labels a row: rows x (S + 1) - tokens in all. A document is
*cut* when its tokens lie in more than one row; ``short cut`` counts the cut documents of at most S
tokens (the goal: 0). For concatenation the rows are Megatron's windows over the documents
concatenated in a seeded random order: row k holds stream tokens ``[k*S, k*S + S + 1)`` (inputs
the first S, labels shifted by one), so a document is cut when its input tokens fall in two rows
(``start // S != (end - 1) // S``); concatenation has no padding (``padded_inputs`` 0), and drops
the stream's last partial window. Its rows are counted as S slots of input tokens (the label token
a window shares with the next is the next row's first input), so ``masked_labels`` counts
one a row where Megatron's windows mask none: read it for packed rows only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

VOCAB = 32_000  # the BPE's size; the web mix's tokens lie below its EOD id too
EOD_TEXT = "<|endoftext|>"
WEB_MEDIAN, WEB_SIGMA = 400, 1.3
WEB_EOD = 0  # the web mix's EOD id; its other tokens lie in [1, VOCAB)


def make_stdlib(data: Path, workers: int = 2) -> str:
    """The tokenized standard-library corpus (module docstring); its prefix."""
    from preprocess import train_tokenizer

    prefix = data / "stdlib_text_document"
    if Path(str(prefix) + ".idx").exists():
        return str(prefix)
    corpus = data / "stdlib.jsonl"
    tl = [sys.executable, "-m", "tokenload.cli.main"]
    if not corpus.exists():
        subprocess.run([*tl, "corpus", "--output", str(corpus)], check=True)
    tokenizer = train_tokenizer(corpus, data / "bpe32k.json", vocab=VOCAB)
    subprocess.run(
        [
            *tl,
            "preprocess",
            "--input",
            str(corpus),
            "--output-prefix",
            str(data / "stdlib"),
            "--tokenizer-type",
            "huggingface",
            "--tokenizer-model",
            str(tokenizer),
            "--eod-token",
            EOD_TEXT,
            "--append-eod",
            "--workers",
            str(workers),
            "--no-progress",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return str(prefix)


def web_lengths(docs: int, seed: int = 0) -> np.ndarray:
    """``docs`` lognormal lengths (median ``WEB_MEDIAN``, sigma ``WEB_SIGMA``), at least 2 tokens
    (a token and the EOD)."""
    rng = np.random.default_rng(seed)
    return np.maximum(rng.lognormal(np.log(WEB_MEDIAN), WEB_SIGMA, size=docs), 2).astype(np.int64)


def make_web(data: Path, docs: int, seed: int = 0) -> str:
    """The heavy-tailed web-text mix of ``docs`` documents (module docstring); its prefix."""
    from tokenload.format import TokenFileWriter

    prefix = data / f"web_{docs}"
    if Path(str(prefix) + ".idx").exists():
        return str(prefix)
    lengths = web_lengths(docs, seed)
    eod = WEB_EOD
    rng = np.random.default_rng(seed + 1)
    with TokenFileWriter(prefix, np.uint16, tokenizer={"eod_id": eod, "vocab_size": VOCAB}) as w:
        for b in range(0, docs, 50_000):
            lens = lengths[b : b + 50_000]
            tokens = rng.integers(eod + 1, VOCAB, size=int(lens.sum()), dtype=np.uint16)
            tokens[np.cumsum(lens) - 1] = eod
            w.add_documents(tokens, lens)
    return str(prefix)


def eod_id(prefix: str) -> int:
    """The EOD id recorded in a token file's sidecar (the BPE's ``<|endoftext|>`` for ``stdlib``,
    ``WEB_EOD`` for ``web``)."""
    side = json.loads(Path(prefix + ".json").read_text())
    return int(side["tokenizer"]["eod_id"])


def document_lengths(prefix: str) -> np.ndarray:
    """int64 tokens of each document of a token file (one sequence per document here)."""
    from tokenload.format import TokenFile

    tf = TokenFile(prefix)
    ends = np.zeros(tf.num_sequences + 1, dtype=np.int64)
    np.cumsum(np.asarray(tf.sequence_lengths, dtype=np.int64), out=ends[1:])
    docs = np.asarray(tf.document_indices, dtype=np.int64)
    return ends[docs[1:]] - ends[docs[:-1]]


@dataclass
class Rows:
    """Rows as pieces: row r holds pieces ``offsets[r]:offsets[r+1]``; a piece is tokens
    ``[start, start + length)`` of document ``doc``."""

    slots: int  # token slots per row
    offsets: np.ndarray
    doc: np.ndarray
    start: np.ndarray
    length: np.ndarray
    dropped: int = 0  # tokens of the documents no row holds (truncation, a partial last window)


def metrics(rows: Rows, lengths: np.ndarray, seq: int) -> dict:
    """Padding share (of the side's own slots), padded input positions and masked label
    positions (like for like across row widths; module docstring), cut documents (all /
    of <= ``seq`` tokens), tokens dropped, documents per row (p50, p99); and the documents whose
    tokens the pieces do not all hold (``incomplete_docs``: a gap, a truncation, or the tail
    concatenation drops)."""
    n_rows = len(rows.offsets) - 1
    per_row = np.diff(rows.offsets)
    piece_row = np.repeat(np.arange(n_rows, dtype=np.int64), per_row)
    held = int(rows.length.sum())
    # tokens each row holds, laid from its slot 0: inputs are slots [0, seq), label slot i
    # (i < seq) holds token i + 1 of the row
    row_held = np.bincount(piece_row, weights=rows.length, minlength=n_rows).astype(np.int64)
    padded_inputs = int(np.maximum(seq - row_held, 0).sum())
    targets = int(np.clip(np.minimum(row_held - 1, min(seq, rows.slots - 1)), 0, None).sum())
    positions = max(n_rows * seq, 1)
    # a document is cut when its pieces lie in more than one row
    pairs = np.unique(rows.doc * (n_rows + 1) + piece_row)
    rows_per_doc = np.bincount(pairs // (n_rows + 1), minlength=lengths.size)
    cut = rows_per_doc > 1
    short = lengths <= seq
    # coverage: sorted by (document, start), each piece starts at or before where the previous
    # one ended (pieces of one document may overlap by the extra token), and the last one ends at
    # the document's end; a document of 0 tokens needs no piece
    order = np.lexsort((rows.start, rows.doc))
    d, s = rows.doc[order], rows.start[order]
    e = s + rows.length[order]
    first = np.r_[True, d[1:] != d[:-1]] if d.size else np.zeros(0, bool)
    last = np.r_[d[1:] != d[:-1], True] if d.size else np.zeros(0, bool)
    prev_e = np.r_[0, e[:-1]] if d.size else e
    gaps = np.where(first, s != 0, (s > prev_e) | (e < prev_e))
    ends = np.zeros(lengths.size, dtype=np.int64)
    ends[d[last]] = e[last]
    incomplete = ends != lengths
    incomplete[d[gaps]] = True
    floor = -(-held // rows.slots) if rows.slots else 0
    return {
        "rows": n_rows,
        # the fewest rows of this width that can hold these pieces (any packer's bound)
        "rows_over_floor": n_rows - floor,
        # what a trainer computes per token of data: S input positions a row, whatever the
        # row's slots (tokenload's S + 1 slots give S inputs and S targets; a row of S slots
        # gives S inputs and S - 1 targets)
        "inputs_per_token": n_rows * seq / max(int(lengths.sum()), 1),
        "padding": 1 - held / max(n_rows * rows.slots, 1),
        # like for like whatever the row's slots: input positions holding no token, and label
        # positions with nothing to predict (loss_mask 0), each of rows x S
        "padded_inputs": padded_inputs / positions,
        "masked_labels": 1 - targets / positions,
        "cut": int(cut.sum()),
        "short_cut": int((cut & short).sum()),
        "long_docs": int((~short).sum()),
        "dropped_tokens": int(rows.dropped),
        "docs_per_row_p50": float(np.percentile(per_row, 50)) if n_rows else 0.0,
        "docs_per_row_p99": float(np.percentile(per_row, 99)) if n_rows else 0.0,
        "incomplete_docs": int(incomplete.sum()),
    }


def concat_rows(lengths: np.ndarray, seq: int, seed: int = 1234) -> Rows:
    """Megatron's concatenated windows over the documents in a seeded random order (module
    docstring), as pieces. Each piece is a document's input tokens within one row (the label
    token a window shares with the next is not counted twice)."""
    order = np.random.default_rng(seed).permutation(lengths.size)
    lens = lengths[order]
    ends = np.cumsum(lens)
    starts = ends - lens
    total = int(ends[-1])
    n_rows = (total - 1) // seq  # Megatron's sample count: windows of S + 1 tokens, stride S
    usable = n_rows * seq
    first_row = starts // seq
    last_row = (np.minimum(ends, usable) - 1) // seq
    keep = starts < usable
    counts = np.where(keep, last_row - first_row + 1, 0)
    doc = np.repeat(order, counts)
    idx = np.repeat(np.arange(lengths.size), counts)
    within = np.arange(doc.size) - np.repeat(np.cumsum(counts) - counts, counts)
    row = first_row[idx] + within
    lo = np.maximum(starts[idx], row * seq)
    hi = np.minimum(np.minimum(ends[idx], usable), (row + 1) * seq)
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=n_rows), out=offsets[1:])
    return Rows(
        slots=seq,
        offsets=offsets,
        doc=doc,
        start=lo - starts[idx],
        length=hi - lo,
        dropped=total - usable,
    )


def plan_rows(plan, block_docs: np.ndarray) -> Rows:
    """A ``pack_block`` plan of one block as pieces over the whole file (``block_docs``: the
    file's document index of each of the block's documents)."""
    return Rows(
        slots=plan.window,
        offsets=np.asarray(plan.row_offsets),
        doc=block_docs[np.asarray(plan.piece_doc)],
        start=np.asarray(plan.piece_start),
        length=np.asarray(plan.piece_length),
    )


def join(parts: list[Rows]) -> Rows:
    """Rows of several blocks, one after the other."""
    offsets = [np.zeros(1, dtype=np.int64)]
    base = 0
    for p in parts:
        offsets.append(p.offsets[1:] + base)
        base += int(p.offsets[-1])
    return Rows(
        slots=parts[0].slots,
        offsets=np.concatenate(offsets),
        doc=np.concatenate([p.doc for p in parts]),
        start=np.concatenate([p.start for p in parts]),
        length=np.concatenate([p.length for p in parts]),
        dropped=sum(p.dropped for p in parts),
    )


def load_label() -> str:
    """The machine's load average, for the tables."""
    one, five, _ = os.getloadavg()
    return f"{one:.1f}/{five:.1f}"
