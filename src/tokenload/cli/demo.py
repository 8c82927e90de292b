"""``tokenload demo``: the main job end to end on an embedded default that needs no download.

Raw text (the Python standard library's own sources, written as JSONL) -> token files with the
built-in byte-level tokenizer -> ``info`` of the result -> the Megatron sample order over it
and the first micro-batches a 2-rank data-parallel job would read.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the whole pipeline on the Python standard library's sources")
    p.add_argument("--output", default=None, metavar="DIR", help="working folder (default: a new temporary one)")
    p.add_argument("--max-mb", type=float, default=16.0, help="size cap of the sample corpus in MB")
    p.add_argument("--workers", type=int, default=2, help="tokenizer workers")
    p.add_argument("--seq-length", type=int, default=1024, help="tokens per training sample")
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
    print("[4/4] sample order and batches")
    _show_batches(prefix, args.seq_length)
    print(f"\nfiles are in {folder}{os.sep}")
    return 0


def _show_batches(prefix: str, seq_length: int) -> None:
    try:
        from ..datasets import gpt  # noqa: F401  (the Megatron-order datasets)
    except ImportError:
        _show_flat_windows(prefix, seq_length)
        return
    from ..datasets import show_first_batches

    show_first_batches(prefix, seq_length)


def _show_flat_windows(prefix: str, seq_length: int) -> None:
    """Windows of the token stream in an order computed on demand, as two ranks would read them."""
    from ..datasets import FlatDatasetConfig, FlatTokenDataset
    from ..loader import MicroBatchPlan, PretrainingSampler

    dataset = FlatTokenDataset(prefix + ".bin", FlatDatasetConfig(block_size=seq_length, seed=1234))
    print(f"      {len(dataset):,} samples of {seq_length} tokens (one epoch, keyed shuffle, no index built)")
    for rank in range(2):
        plan = MicroBatchPlan(total_samples=len(dataset), micro_batch_size=4, dp_rank=rank, dp_size=2)
        first = next(iter(PretrainingSampler(plan)))
        batch = dataset.__getitems__(first)
        text = bytes(int(t) for t in batch["tokens"][0][:60] if t < 256).decode("utf-8", "replace")
        print(f"      rank {rank}: samples {first}, tokens {batch['tokens'].shape}; starts {text!r}")
