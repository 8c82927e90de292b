"""The Ray executor's overhead: preprocess throughput with Ray against the process executor, same
corpus, same worker count, same output bytes (checked).

Usage: python benchmarks/preprocess_ray.py [--data-dir /tmp/tokenload-bench] [--mb 32] [--workers 2]
       [--tokenizer bpe|byte] [--range-mb 8] [--tiny-files 300]

Corpora, from ``tokenload corpus`` (the standard library's sources, repeated to ``--mb``):
one large JSONL file (Ray: byte ranges of ``--range-mb``), the same bytes as 16 files, and
``--tiny-files`` files of about 2 KB (each a task of its own: the per-task cost laid bare).
Tokenizer: the byte-level BPE of benchmarks/preprocess.py (vocab 32,000; gigatoken where it is
proven equal, as by default) or the byte tokenizer (almost no encoding work: overhead only).
Ray runs on a local cluster of ``--workers`` CPUs started before the clock (its start-up is
reported on its own line), so the table shows scheduling, not cluster start; its worker
processes stay up between runs, with the tokenizer loaded, while the process executor starts a
pool (and loads the tokenizer in it) per run, as each ``tokenload preprocess`` does. Each cell:
the best of ``--rounds`` runs; "ray ms per task" is the Ray run's wall time per task (with
tiny files: almost all of it per-task cost).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import table  # noqa: E402
from preprocess import EOD, train_tokenizer  # noqa: E402


def corpora(data: Path, mb: int, tiny: int) -> dict[str, list[str]]:
    """{name: input paths}: one large file, the same split in 16, and ``tiny`` small files."""
    from tokenload.preprocess import write_stdlib_corpus

    big = data / f"ray-corpus-{mb}mb.jsonl"
    if not big.exists():
        write_stdlib_corpus(big, min_bytes=mb * 1_000_000)
    split = data / f"ray-split-{mb}mb"
    if not split.exists():
        split.mkdir()
        lines = big.read_bytes().splitlines(keepends=True)
        per = -(-len(lines) // 16)
        for i in range(16):
            (split / f"{i:02d}.jsonl").write_bytes(b"".join(lines[i * per : (i + 1) * per]))
    small = data / f"ray-tiny-{tiny}"
    if not small.exists():
        small.mkdir()
        lines = big.read_bytes().splitlines(keepends=True)
        picked = (line for line in lines if 1000 < len(line) < 3000)
        for i in range(tiny):
            (small / f"{i:04d}.jsonl").write_bytes(next(picked))
    return {
        f"1 file, {big.stat().st_size / 1e6:.0f} MB": [str(big)],
        f"16 files, {big.stat().st_size / 1e6:.0f} MB": [str(split)],
        f"{tiny} files of ~2 KB": [str(small)],
    }


def _files(inputs: list[str]) -> list[str]:
    found = []
    for path in inputs:
        found += sorted(str(p) for p in Path(path).iterdir()) if os.path.isdir(path) else [path]
    return found


def run(inputs, out: Path, tokenizer, executor: str, workers: int, range_mb: float):
    from tokenload.preprocess import PreprocessConfig, preprocess

    config = PreprocessConfig(
        inputs=tuple(inputs),
        output_prefix=str(out),
        tokenizer=tokenizer,
        append_eod=True,
        executor=executor,
        workers=workers,
        range_bytes=int(range_mb * (1 << 20)),
        resume=False,
    )
    start = time.perf_counter()
    result = preprocess(config, progress=False)
    return time.perf_counter() - start, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="/tmp/tokenload-bench")
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tokenizer", choices=("bpe", "byte"), default="bpe")
    ap.add_argument("--range-mb", type=float, default=8)
    ap.add_argument("--tiny-files", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    import ray

    from tokenload.preprocess import TokenizerSpec

    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    sets = corpora(data, args.mb, args.tiny_files)
    if args.tokenizer == "bpe":
        big = next(iter(sets.values()))[0]
        tok = TokenizerSpec(kind="huggingface", model=str(train_tokenizer(Path(big), data / "bpe32k.json")),
                            eod_token=EOD)
    else:
        tok = TokenizerSpec(kind="byte")
    out = data / "ray-out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    startup = time.perf_counter() - t0
    rows = []
    for name, inputs in sets.items():
        best = {}
        for _ in range(args.rounds):
            for executor in ("processes", "ray"):
                seconds, result = run(inputs, out / executor, tok, executor, args.workers, args.range_mb)
                best[executor] = min(best.get(executor, (1e9, None)), (seconds, result), key=lambda r: r[0])
        for ext in (".bin", ".idx"):
            a = Path(f"{out / 'processes'}_text_document{ext}").read_bytes()
            b = Path(f"{out / 'ray'}_text_document{ext}").read_bytes()
            assert a == b, f"outputs differ ({ext})"
        (p, rp), (r, rr) = best["processes"], best["ray"]
        files = rp.files
        tasks = sum(max(1, -(-os.path.getsize(f) // int(args.range_mb * (1 << 20))))
                    for f in _files(inputs))
        rows.append([
            name, files, tasks, f"{p:.2f}", f"{r:.2f}", f"{r / p:.2f}", f"{r * 1000 / tasks:.1f}",
            f"{rp.input_bytes / 1e6 / p:.1f}", f"{rr.input_bytes / 1e6 / r:.1f}",
        ])
    ray.shutdown()
    print(f"tokenizer {args.tokenizer} ({rp.engine}), {args.workers} workers / Ray CPUs,"
          f" Ray byte ranges of {args.range_mb:g} MB; outputs byte-identical in every row")
    print(f"local Ray cluster start (not in the table): {startup:.1f} s; {os.cpu_count()} CPUs on this machine")
    print(table(rows, ["corpus", "files", "ray tasks", "processes s", "ray s", "ray / processes",
                       "ray ms per task", "processes MB/s", "ray MB/s"]))


if __name__ == "__main__":
    main()
