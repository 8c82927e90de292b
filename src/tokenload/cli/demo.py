"""``tokenload demo``: the main job end to end on an embedded default that needs no download.

Raw text (the Python standard library's own sources, written as JSONL) -> token files with the
built-in byte-level tokenizer -> ``info`` of the result -> Megatron's sample order over it (its
document, sample and shuffle indices, cached under Megatron's file names) and the first
micro-batches a 2-rank data-parallel job would read.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from .args import positive


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the whole pipeline on the Python standard library's sources")
    p.add_argument("--output", default=None, metavar="DIR", help="working folder (default: a new temporary one)")
    p.add_argument("--max-mb", type=positive(float), default=16.0, help="size cap of the sample corpus in MB")
    p.add_argument("--workers", type=positive(int), default=2, help="tokenizer workers")
    p.add_argument("--seq-length", type=positive(int), default=1024, help="tokens per training sample")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..preprocess import PreprocessConfig, TokenizerSpec, preprocess, write_stdlib_corpus
    from .tokenfiles import run_info

    folder = Path(args.output or tempfile.mkdtemp(prefix="tokenload-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "stdlib.jsonl"
    print(f"[1/4] sample corpus: the standard library's sources -> {corpus}")
    write_stdlib_corpus(corpus, max_bytes=int(args.max_mb * 2**20))
    print(f"[2/4] tokenize with the built-in byte-level tokenizer ({args.workers} workers)")
    start = time.perf_counter()
    result = preprocess(
        PreprocessConfig(
            inputs=(str(corpus),),
            output_prefix=str(folder / "stdlib"),
            tokenizer=TokenizerSpec(kind="byte"),
            append_eod=True,
            workers=args.workers,
            resume=False,
        ),
        progress=False,
    )
    prefix = result.outputs["text"]
    tokens = sum(result.tokens.values())
    print(f"      {tokens:,} tokens in {time.perf_counter() - start:.2f} s")
    print("[3/4] tokenload info")
    run_info(argparse.Namespace(prefixes=[prefix], json=False))
    print("[4/4] Megatron sample order and the first micro-batch of 2 data-parallel ranks")
    _show_batches(prefix, args.seq_length)
    print(f"\nfiles are in {folder}{os.sep}")
    return 0


def _show_batches(prefix: str, seq_length: int) -> None:
    """Megatron's sample order over the new file and the first micro-batch of two data-parallel
    ranks (computed with the sampler directly, so the demo needs no torch)."""
    from ..datasets import MegatronDataConfig, build_datasets
    from ..format import read_sidecar
    from ..loader import MicroBatchPlan, PretrainingSampler

    tokenizer = read_sidecar(prefix).tokenizer or {}
    config = MegatronDataConfig(
        sequence_length=seq_length,
        blend=[prefix],
        split="98,2,0",
        tokenizer=tokenizer,
        eod_id=tokenizer.get("eod_id"),
        path_to_cache=os.path.join(os.path.dirname(prefix), "index-cache"),
    )
    start = time.perf_counter()
    train, valid, _ = build_datasets(config, [None, None, None])
    print(
        f"      train {len(train):,} / valid {len(valid):,} samples of {seq_length} tokens,"
        f" indices built and cached in {time.perf_counter() - start:.2f} s"
    )
    for rank in range(2):
        plan = MicroBatchPlan(total_samples=len(train), micro_batch_size=4, dp_rank=rank, dp_size=2)
        first = next(iter(PretrainingSampler(plan)))
        batch = train.__getitems__(first)
        text = bytes(int(t) for t in batch["tokens"][0][:60] if t < 256).decode("utf-8", "replace")
        shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in batch.items())
        print(f"      rank {rank}: samples {first}: {shapes}")
        print(f"              sample {first[0]} starts {text!r}")
