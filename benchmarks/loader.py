"""Random-access samples/s at S = 2048: tokenload vs megatron-core's GPTDataset vs a raw NumPy gather.

Usage: python benchmarks/loader.py [--data-dir /tmp/tokenload-bench] [--gb 1.0] [--micro-batch 16]
                                   [--samples 16384] [--loader-samples 8192] [--repeats 3]

Data: the ~1 GiB uint16 token file of ``common.synthetic_token_file`` (lognormal document lengths,
mean 600 tokens; shared with read_modes.py), page cache warm. Both sides build their one-epoch
train split (split ``100,0,0``, seed 1234, S = 2048, extra token on, no attention mask) with their
own builder and cache folder; items carry tokens, labels, loss_mask and position_ids.

Measured, best of ``--repeats`` rounds (each round runs the peer, then tokenload, then the ceiling,
so that load from other processes falls on all of them alike):

* in-process: ``--samples`` random dataset indices (the same list for every row), read by
  tokenload as ``ds.__getitems__`` per micro-batch and by megatron-core as ``ds[i]`` per item
  (how Megatron reads);
* DataLoader with 0 and 2 workers: the first ``--loader-samples`` dataset indices in order (the
  order is already shuffled, so these are random reads), through ``tokenload.loader
  .build_dataloader`` and through ``torch.utils.data.DataLoader(ds, batch_size=mb)`` with default
  collate. A fresh loader per round; its first micro-batch (worker start-up) is not timed;
* the NumPy ceiling: ``np.memmap`` of the ``.bin`` and, per micro-batch of the in-process indices,
  one fancy-index gather of the S + 1 tokens that start at each sample's first token, cast to
  int64 (row slices stacked are timed too). It builds no fields and ignores document boundaries:
  the cost of touching the same bytes, nothing more.

Items of 64 of the indices are compared between the two libraries field by field.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import run_peer, synthetic_token_file, table  # noqa: E402

from tokenload.datasets import MegatronDataConfig, build_datasets  # noqa: E402
from tokenload.format import TokenFile, warmup_file  # noqa: E402
from tokenload.loader import build_dataloader  # noqa: E402

SEQ = 2048
SEED = 1234
VOCAB = 50257  # the synthetic file's token range; NullTokenizer's EOD is VOCAB - 1
FIELDS = ("tokens", "labels", "loss_mask", "position_ids")
CHECKED = 64

PEER = r"""
import gc, json, logging, os, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
import numpy, torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.tokenizers import MegatronTokenizer

a = json.loads(sys.argv[1])
tok = MegatronTokenizer.from_pretrained(
    metadata_path={"library": "null-text"}, vocab_size=a["vocab"], pad_id=-1)
cfg = GPTDatasetConfig(
    random_seed=a["seed"], sequence_length=a["seq"], blend=([a["prefix"]], None), split="100,0,0",
    path_to_cache=a["cache"], tokenizer=tok, reset_position_ids=False, reset_attention_mask=False,
    eod_mask_loss=False, create_attention_mask=False)
ds = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, cfg).build()[0]
idx, mb = a["indices"], a["micro_batch"]
out = {"len": len(ds), "eod": tok.eod, "pad": tok.pad, "keys": sorted(ds[0].keys())}

def best(fn):
    return min(fn() for _ in range(a["repeats"]))

def in_process():
    t = time.perf_counter()
    for i in idx:
        ds[i]
    return time.perf_counter() - t

def loader(workers):
    def run():
        dl = torch.utils.data.DataLoader(ds, batch_size=mb, shuffle=False, num_workers=workers)
        it = iter(dl)
        next(it)  # worker start-up, not timed
        t = time.perf_counter()
        for _ in range(a["loader_batches"]):
            next(it)
        dt = time.perf_counter() - t
        del it, dl
        gc.collect()
        return dt
    return run

out["in-process"] = len(idx) / best(in_process)
for w in (0, 2):
    out[f"loader-{w}"] = a["loader_batches"] * mb / best(loader(w))
items = [ds[i] for i in idx[: a["checked"]]]
numpy.savez(a["items"], **{k: numpy.stack([it[k].numpy() for it in items]) for k in items[0]})
print(json.dumps(out))
"""


def best_rate(fn, count: int, repeats: int) -> float:
    """``count`` / fastest of ``repeats`` runs of ``fn`` (which returns seconds, or None to be timed)."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        dt = fn()
        times.append(time.perf_counter() - t if dt is None else dt)
    return count / min(times)


def window_starts(ds, tf: TokenFile, indices: np.ndarray) -> np.ndarray:
    """Stream position (in tokens) of each dataset index's first token."""
    samples = np.asarray(ds.shuffle_index[indices], dtype=np.int64)
    rows = np.asarray(ds.sample_index[samples], dtype=np.int64)
    seqs = np.asarray(ds.document_index[rows[:, 0]], dtype=np.int64)
    starts = tf.sequence_pointers[seqs] // tf.dtype.itemsize + rows[:, 1]
    return np.minimum(starts, tf.num_tokens - (SEQ + 1))


def ceilings(prefix: str, starts: np.ndarray, mb: int, repeats: int) -> dict[str, float]:
    mm = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r")
    cols = np.arange(SEQ + 1, dtype=np.int64)
    batches = [starts[b : b + mb] for b in range(0, starts.size, mb)]

    def fancy():
        for s in batches:
            mm[s[:, None] + cols].astype(np.int64)

    def slices():
        for s in batches:
            np.stack([mm[i : i + SEQ + 1] for i in s.tolist()]).astype(np.int64)

    return {"fancy": best_rate(fancy, starts.size, repeats), "slices": best_rate(slices, starts.size, repeats)}


def ours(ds, indices: np.ndarray, mb: int, loader_batches: int, repeats: int) -> dict[str, float]:
    batches = [indices[b : b + mb] for b in range(0, indices.size, mb)]

    def in_process():
        for b in batches:
            ds.__getitems__(b)

    rates = {"in-process": best_rate(in_process, indices.size, repeats)}
    for workers in (0, 2):

        def run():
            dl = build_dataloader(ds, micro_batch_size=mb, num_workers=workers, dp_rank=0, dp_size=1)
            it = iter(dl)
            next(it)  # worker start-up, not timed
            t = time.perf_counter()
            for _ in range(loader_batches):
                next(it)
            dt = time.perf_counter() - t
            del it, dl
            gc.collect()
            return dt

        rates[f"loader-{workers}"] = best_rate(run, loader_batches * mb, repeats)
    return rates


def check_items(ds, indices: np.ndarray, path: str) -> list[str]:
    """Fields where tokenload's items differ from megatron-core's (empty: identical)."""
    theirs = np.load(path)
    mine = ds.__getitems__(indices)
    problems = [f"megatron-core has fields {sorted(theirs.files)}"] if sorted(theirs.files) != sorted(FIELDS) else []
    for k in FIELDS:
        if k not in theirs.files or not np.array_equal(np.asarray(mine[k]), theirs[k]):
            problems.append(k)
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="/tmp/tokenload-bench")
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--samples", type=int, default=16384, help="random in-process reads per round")
    ap.add_argument("--loader-samples", type=int, default=8192, help="samples per DataLoader round")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    prefix = synthetic_token_file(data / f"docs_{args.gb:g}gb", tokens=int(args.gb * 2**30 / 2))
    warmup_file(prefix + ".idx")
    warmup_file(prefix + ".bin")
    mb = args.micro_batch
    cache = data / "loader_cache"
    config = MegatronDataConfig(
        sequence_length=SEQ, random_seed=SEED, blend=[prefix], split="100,0,0", eod_id=VOCAB - 1, pad_id=-1,
        path_to_cache=str(cache / "tokenload"),
    )
    ds = build_datasets(config, [None, None, None])[0]
    indices = np.random.default_rng(args.seed).integers(0, len(ds), size=args.samples)
    loader_batches = args.loader_samples // mb
    tf = TokenFile(prefix)
    starts = window_starts(ds, tf, indices)
    payload = {
        "prefix": prefix, "cache": str(cache / "megatron"), "seq": SEQ, "seed": SEED, "vocab": VOCAB,
        "indices": indices.tolist(), "micro_batch": mb, "loader_batches": loader_batches, "repeats": 1,
        "checked": CHECKED,
    }
    # Rounds alternate the sides so that load from other processes falls on all of them alike.
    peer: dict = {}
    mine: dict = {}
    ceiling: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        payload["items"] = os.path.join(tmp, "items.npz")
        for _ in range(args.repeats):
            got = run_peer(PEER, payload)
            if got is None:
                sys.exit("megatron-core venv missing: run bash ../shared/tools/megatron-env.sh")
            peer = {k: max(v, peer.get(k, v)) if isinstance(v, float) else v for k, v in got.items()}
            new = ours(ds, indices, mb, loader_batches, 1)
            mine = {k: max(v, mine.get(k, v)) for k, v in new.items()}
            new = ceilings(prefix, starts, mb, 1)
            ceiling = {k: max(v, ceiling.get(k, v)) for k, v in new.items()}
        problems = check_items(ds, indices[:CHECKED], payload["items"])
    if peer["len"] != len(ds):
        problems.append(f"length {len(ds)} vs megatron-core {peer['len']}")

    def row(name, ours_rate, peer_rate):
        return [name, f"{ours_rate:,.0f}", f"{peer_rate:,.0f}", f"{ours_rate / peer_rate:.1f}x"]

    rows = [
        row("in-process random (tokenload `__getitems__` per micro-batch; megatron-core `ds[i]`)",
            mine["in-process"], peer["in-process"]),
        row("DataLoader, 0 workers", mine["loader-0"], peer["loader-0"]),
        row("DataLoader, 2 workers", mine["loader-2"], peer["loader-2"]),
    ]
    best_ceiling = max(ceiling.values())
    size = Path(prefix + ".bin").stat().st_size / 2**30
    print(f"file: {prefix} ({size:.2f} GiB .bin, {tf.num_sequences:,} documents), S={SEQ}, micro-batch {mb}, "
          f"{len(ds):,} samples in the split; {args.samples:,} random in-process reads, "
          f"{loader_batches * mb:,} DataLoader samples; best of {args.repeats} interleaved rounds; nproc {os.cpu_count()}; "
          f"warm page cache\n")
    print(table(rows, ["samples/s", "tokenload", "megatron-core", "ratio"]))
    print("\n" + table([
        ["np.memmap + one fancy-index gather per micro-batch, .astype(int64)", f"{ceiling['fancy']:,.0f}"],
        ["np.memmap + row slices stacked per micro-batch, .astype(int64)", f"{ceiling['slices']:,.0f}"],
    ], ["NumPy ceiling (same windows, in-process)", "samples/s"]))
    verdict = [
        ("tokenload in-process >= 8x megatron-core in-process", mine["in-process"] / peer["in-process"], 8.0),
        ("tokenload in-process within 2x of the NumPy ceiling (ratio to the faster ceiling)",
         mine["in-process"] / best_ceiling, 0.5),
        ("tokenload DataLoader 2 workers faster than 0", mine["loader-2"] / mine["loader-0"], 1.0),
    ]
    print("\n" + table([[g, f"{v:.2f}", "met" if v >= bar else "NOT met"] for g, v, bar in verdict],
                       ["goal", "measured", ""]))
    print(f"\nitems of {CHECKED} indices equal to megatron-core's ({', '.join(FIELDS)}): "
          f"{'yes' if not problems else 'NO: ' + ', '.join(problems)}")
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
