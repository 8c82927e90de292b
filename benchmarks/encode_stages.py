"""CPU of the encoding path's stages, in-process, one thread: JSON parsing, gigatoken's encoding,
copying the ids out of its matrices, and the document layout (issue 27 goal 3).

Usage: PYTHONPATH=<tokenload src> python benchmarks/encode_stages.py --corpus DIR_OR_FILE
           --tokenizer tokenizer.json [--chunk-mb 4] [--rounds 3] [--no-eod] [--out FILE.npz]

Runs ``encode.encode_chunk`` (the worker's whole job for one chunk) over every chunk of the corpus,
cut as the pipeline cuts it (``sources._line_chunks``, a fixed ``--chunk-mb``), in the calling
thread, and splits its thread CPU time into exclusive stages by wrapping the functions that do
them (a stage's time excludes the wrapped stages it calls):

* ``parse``: ``records.parse_chunk`` (lines, orjson, the per-record checks);
* ``place``: ``fast._place`` (ids copied out of the padded matrices);
* ``layout``: ``encode.layout_documents`` (the general path: the int cast, ``np.insert`` of the
  EOD) and ``fast._documents`` (the fused path: its own work besides ``_place``);
* ``encode``: the rest of ``encode_chunk``: UTF-8 encoding, sorting and grouping the texts,
  gigatoken's calls.

Works on any tokenload version that has these functions (the fused ones are timed when present),
so the same script measures the code before and after a change: run it with each tree on
``PYTHONPATH``. Prints one JSON line per round and the medians. ``--out`` saves the ids, sequence
lengths and documents of the first round, to compare two versions' output exactly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from tokenload.preprocess import encode, fast, load_tokenizer, records, sources
from tokenload.preprocess.config import TokenizerSpec

STAGES = ("parse", "encode", "place", "layout")
_clock = time.thread_time
_stack: list[float] = []
_spent: dict[str, float] = defaultdict(float)


def _timed(name: str, fn):
    def wrapper(*args, **kwargs):
        _stack.append(0.0)
        start = _clock()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = _clock() - start
            nested = _stack.pop()
            _spent[name] += elapsed - nested
            if _stack:
                _stack[-1] += elapsed

    return wrapper


def instrument() -> None:
    encode.parse_chunk = _timed("parse", records.parse_chunk)
    fast._place = _timed("place", fast._place)
    encode.layout_documents = _timed("layout", encode.layout_documents)
    if hasattr(fast, "_documents"):
        fast._documents = _timed("layout", fast._documents)


def chunks(paths: list[Path], chunk_bytes: int) -> list[sources.Chunk]:
    out = []
    for path in paths:
        with open(path, "rb") as f:
            blocks = iter(lambda: f.read(1 << 20), b"")
            line = 1
            for data in sources._line_chunks(blocks, lambda: chunk_bytes):
                out.append(sources.Chunk(str(path), "jsonl", line, data, len(data)))
                line += data.count(b"\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--chunk-mb", type=float, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-eod", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    corpus = Path(args.corpus)
    paths = sorted(corpus.glob("*.jsonl")) if corpus.is_dir() else [corpus]
    spec = TokenizerSpec(kind="HuggingFaceTokenizer", model=args.tokenizer)
    tok = load_tokenizer(spec)
    encode.register_tokenizer(spec, tok)
    task = encode.EncodeTask(spec, ("text",), not args.no_eod, False, str(tok.dtype))
    work = chunks(paths, int(args.chunk_mb * (1 << 20)))
    size = sum(c.size for c in work)
    instrument()
    whole = _timed("encode", encode.encode_chunk)
    rows = []
    for r in range(args.rounds):
        _spent.clear()
        start, wall = _clock(), time.perf_counter()
        kept = []
        for chunk in work:
            result = whole(task, chunk)
            if r == 0 and args.out:
                kept.append(result.outputs[0])
        row = {s: round(_spent[s], 3) for s in STAGES}
        row["total"] = round(_clock() - start, 3)
        row["wall"] = round(time.perf_counter() - wall, 3)
        rows.append(row)
        print(json.dumps({"round": r + 1, **row}), flush=True)
        if kept:
            np.savez(
                args.out,
                tokens=np.concatenate([k[0] for k in kept]),
                sequences=np.concatenate([k[1] for k in kept]),
                documents=np.concatenate([k[2] for k in kept]),
            )
            del kept
    medians = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    spans = {k: [min(row[k] for row in rows), max(row[k] for row in rows)] for k in rows[0]}
    print(
        json.dumps(
            {
                "engine": tok.engine,
                "chunks": len(work),
                "mib": round(size / (1 << 20), 1),
                "median_cpu_s": medians,
                "range": spans,
            }
        )
    )


if __name__ == "__main__":
    main()
