"""Where a Megatron-order index build spends its CPU and memory, step by step (issue 27).

Usage: python benchmarks/index_profile.py PREFIX [--seq 2048] [--seed 1234]
       (e.g. a benchmarks/index_scale.py file: DATA/blend_1x100000000/p0000)
       NUMPY_MADVISE_HUGEPAGE=0 python benchmarks/index_profile.py PREFIX   # without THP advice

The train split of one token file (all its documents), half an epoch of samples at S = 2048:
the steps of ``build_gpt_indices`` run one by one, each with its CPU and wall seconds and the
process's RSS and peak RSS after it, then the arrays' sizes. cProfile is not used: it measures
wall time, which on a shared machine is mostly other processes' time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tokenload.format import TokenFile
from tokenload.index.document import build_document_index, tokens_per_epoch
from tokenload.index.epochs import plan_epochs
from tokenload.index.sample import build_sample_index
from tokenload.index.shuffle import build_shuffle_index


def memory() -> str:
    with open("/proc/self/status") as f:
        got = {line.split(":")[0]: int(line.split()[1]) // 1024 for line in f
               if line.startswith(("VmRSS", "VmHWM"))}
    return f"RSS {got['VmRSS']:,} MB, peak {got['VmHWM']:,} MB"


def step(name: str, fn, steps: list):
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    steps.append((name, time.process_time() - cpu, time.perf_counter() - wall))
    print(f"{name}: CPU {steps[-1][1]:.2f} s, wall {steps[-1][2]:.2f} s; {memory()}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("prefix")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    steps: list = []
    print("start:", memory())
    file = TokenFile(args.prefix)
    lengths = step("sequence lengths copied from the mapped .idx",
                   lambda: np.array(file.sequence_lengths), steps)
    docs = step("document ids (arange, int32)",
                lambda: np.arange(0, lengths.size, dtype=np.int32), steps)
    tokens = step("tokens per epoch", lambda: tokens_per_epoch(lengths, docs), steps)
    epochs = plan_epochs(tokens_per_epoch=tokens, num_samples=tokens // args.seq // 2,
                         sequence_length=args.seq, extra=1)
    rng = np.random.RandomState(args.seed)
    document_index = step(
        "document index (RandomState.shuffle)",
        lambda: build_document_index(docs, epochs.num_epochs, rng, epochs.separate_final_epoch),
        steps)
    sample_index = step(
        "sample index",
        lambda: build_sample_index(lengths, document_index, sequence_length=args.seq,
                                   num_epochs=epochs.num_epochs, tokens_per_epoch=tokens), steps)
    n = sample_index.shape[0] - 1
    split_at = epochs.samples_sans_final_epoch if epochs.separate_final_epoch else n
    shuffle_index = step("shuffle index", lambda: build_shuffle_index(split_at, n, rng), steps)
    arrays = {"lengths": lengths, "document ids": docs, "document index": document_index,
              "sample index": sample_index, "shuffle index": shuffle_index}
    print("arrays MB:", {k: round(v.nbytes / 2**20) for k, v in arrays.items()})
    print(f"total CPU {sum(s[1] for s in steps):.2f} s")


if __name__ == "__main__":
    main()
