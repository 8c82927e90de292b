"""Could gigatoken parse the JSONL in Rust instead of orjson (issue 27 goal 3)? Its behaviour on
adversarial lines against tokenload's records, and its CPU against tokenload's encoding path.

Usage: python benchmarks/gigatoken_jsonl.py --tokenizer tokenizer.json --corpus FILE.jsonl
           [--rounds 5] [--chunk-mb 4]

1. Behaviour: each adversarial line (the ones of ``tests/unit/preprocess/test_encode_paths.py``)
   is written between two good lines and read by ``encode_files(JsonlFileSource)``; printed: the
   texts gigatoken gives, against the documents and bad-record reasons tokenload's
   ``records.parse_chunk`` gives. Any line where they differ is one a fast path would have to
   detect before trusting gigatoken.
2. CPU (thread time, one thread, rounds interleaved, min and median): ``encode_files`` on the
   corpus file (parsing and encoding in Rust; its ids read from the awkward array without a
   copy) against tokenload's ``encode_chunk`` on the same bytes cut into ``--chunk-mb`` chunks
   (parse with orjson, encode with gigatoken's padded calls, lay the documents out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit" / "preprocess"))


def behaviour(giga, lines: list[bytes]) -> None:
    from gigatoken.gigatoken_rs import JsonlFileSource

    from tokenload.preprocess.records import parse_chunk
    from tokenload.preprocess.sources import Chunk

    good = b'{"text": "good"}'
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "one.jsonl")
        for line in lines:
            payload = good + b"\n" + line + b"\n" + good + b"\n"
            with open(path, "wb") as f:
                f.write(payload)
            try:
                rows = giga.encode_files(JsonlFileSource([path]), parallel=False)
                theirs = [giga.decode(np.asarray(r)).decode("utf-8", "replace") for r in rows]
            except Exception as exc:  # what it raises is part of what is reported
                theirs = [f"raised {type(exc).__name__}"]
            parsed = parse_chunk(Chunk(path, "jsonl", 1, payload, len(payload)), ("text",), False)
            ours = [t if isinstance(t, str) else f"sentences {t}" for t in parsed.columns[0]]
            same = theirs == ours
            differ += not same
            show = [t[:30] for t in theirs]
            print(
                f"{'same ' if same else 'DIFF '} {line[:60]!r}: gigatoken {show}; tokenload "
                f"{[t[:30] for t in ours]} {dict(parsed.skipped)}"
            )
    print(f"{differ} of {len(lines)} lines differ")


def cpu(giga, tokenizer: str, corpus: Path, rounds: int, chunk_mb: float) -> None:
    from gigatoken.gigatoken_rs import JsonlFileSource

    from tokenload.preprocess import encode, load_tokenizer, sources
    from tokenload.preprocess.config import TokenizerSpec

    spec = TokenizerSpec(kind="HuggingFaceTokenizer", model=tokenizer)
    tok = load_tokenizer(spec)
    encode.register_tokenizer(spec, tok)
    task = encode.EncodeTask(spec, ("text",), False, False, "uint32")
    with open(corpus, "rb") as f:
        blocks = iter(lambda: f.read(1 << 20), b"")
        size = int(chunk_mb * (1 << 20))
        work = [
            sources.Chunk(str(corpus), "jsonl", 1, d, len(d))
            for d in sources._line_chunks(blocks, lambda: size)
        ]

    def rust() -> np.ndarray:
        rows = giga.encode_files(JsonlFileSource([str(corpus)]), parallel=False)
        return np.asarray(rows.layout.content.data)

    def ours() -> np.ndarray:
        return np.concatenate([encode.encode_chunk(task, c).outputs[0][0] for c in work])

    assert np.array_equal(rust(), ours()), "the ids differ"
    times: dict[str, list[float]] = {"encode_files": [], "tokenload encode_chunk": []}
    for _ in range(rounds):
        for name, fn in (("encode_files", rust), ("tokenload encode_chunk", ours)):
            start = time.thread_time()
            fn()
            times[name].append(time.thread_time() - start)
    mib = corpus.stat().st_size / (1 << 20)
    for name, t in times.items():
        print(
            f"{name}: {mib:.0f} MiB, thread CPU min {min(t):.3f} s, median "
            f"{statistics.median(t):.3f} s (rounds {', '.join(f'{x:.3f}' for x in t)})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunk-mb", type=float, default=4)
    args = ap.parse_args()
    import gigatoken
    from test_encode_paths import ADVERSARIAL

    giga = gigatoken.Tokenizer.from_json(Path(args.tokenizer).read_bytes())
    behaviour(giga, ADVERSARIAL)
    print(json.dumps({"awkward imported": "awkward" in sys.modules}))
    cpu(giga, args.tokenizer, Path(args.corpus), args.rounds, args.chunk_mb)


if __name__ == "__main__":
    main()
