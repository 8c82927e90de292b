"""Index build time: tokenload's NumPy indices vs megatron-core's C++ helpers, same data, one run.

Usage: python benchmarks/index_build.py [--data-dir /tmp/tokenload-bench] [--docs 5000000] [--repeats 3]

Data: 5M documents with lognormal lengths (sigma 1, mean about 600 tokens, seed 0), so about 3B
tokens. Building the indices needs only the sequence lengths, so each token file is a real
``.idx`` with those lengths and a sparse ``.bin`` of the right size (``os.truncate``, no 6 GB
written); both tools open it as an ordinary token file. Cases, S = 2048, seed 1234:

* ``single``: one file of all the documents, split ``100,0,0``, one epoch (size None): the
  document index (RandomState shuffle of 5M ids), the sample index and the shuffle index.
* ``blend3``: the same documents cut into three files (50/30/20 % of them), blended with weights
  50/30/20 at the largest train size for which every mid-level dataset, surplus included, fits
  in one epoch: three GPT builds plus the greedy blending indices.

Each side runs its own dataset builder end to end (token files opened, indices built, Megatron's
cache written to a fresh folder: ``BlendedMegatronDatasetBuilder(...).build()`` against
``tokenload.datasets.build_datasets`` with ``cache="auto"``), best of ``--repeats`` rounds. tokenload is
also timed in memory (``cache="off"``). The cache folders are then compared file by file
(every Megatron ``.npy`` loaded and compared, dtype and values, and its bytes). A component table
times the pieces alone on the single file (document, sample, shuffle index; blending indices at
the blend3 size) to show where the time goes. Each round runs the peer once, then tokenload once,
so that load from other processes falls on both sides alike; the best round of each is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import shutil
import struct
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import best_of, run_peer, table  # noqa: E402

from tokenload.datasets import MegatronDataConfig, build_datasets  # noqa: E402
from tokenload.format import TokenFile, dtype_code, warmup_file  # noqa: E402
from tokenload.index import (  # noqa: E402
    build_blending_indices,
    build_document_index,
    build_sample_index,
    build_shuffle_index,
    tokens_per_epoch,
)

SEQ = 2048
SEED = 1234
SURPLUS = 0.005
BLEND_WEIGHTS = (50, 30, 20)
VOCAB = 50257

PEER = r"""
import json, logging, os, shutil, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
import numpy
from megatron.core.datasets import helpers
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import (
    GPTDataset, GPTDatasetConfig, _build_document_index, _build_shuffle_index)
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.tokenizers import MegatronTokenizer

a = json.loads(sys.argv[1])
tok = MegatronTokenizer.from_pretrained(
    metadata_path={"library": "null-text"}, vocab_size=a["vocab"], pad_id=-1)

def best(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)

out = {"tokenizer": dict(tok.unique_identifiers), "builder": {}, "parts": {}}
for case in a["cases"]:
    cache = case["cache"]
    def build():
        shutil.rmtree(cache, ignore_errors=True)
        cfg = GPTDatasetConfig(
            random_seed=a["seed"], sequence_length=a["seq"],
            blend=(case["prefixes"], case["weights"]), split=case["split"],
            path_to_cache=cache, tokenizer=tok, mid_level_dataset_surplus=a["surplus"],
            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
            create_attention_mask=False)
        t = time.perf_counter()
        BlendedMegatronDatasetBuilder(GPTDataset, case["sizes"], lambda: True, cfg).build()
        return time.perf_counter() - t
    out["builder"][case["name"]] = min(build() for _ in range(a["repeats"]))

low = IndexedDataset(a["single"])  # kept alive: its __del__ unmaps the arrays
lengths = low.sequence_lengths.copy()
docs = numpy.arange(len(lengths), dtype=numpy.int32)
tokens = int(numpy.sum(lengths[docs], dtype=numpy.int64))
doc_index = _build_document_index(docs, 1, numpy.random.RandomState(a["seed"]), False)
n = (tokens - 1) // a["seq"]
parts = out["parts"]
parts["document index"] = best(
    lambda: _build_document_index(docs, 1, numpy.random.RandomState(a["seed"]), False), a["repeats"])
parts["sample index"] = best(
    lambda: helpers.build_sample_idx(lengths, doc_index, a["seq"], 1, tokens, True, True), a["repeats"])
parts["shuffle index"] = best(
    lambda: _build_shuffle_index(n, n, numpy.random.RandomState(a["seed"])), a["repeats"])
w = numpy.array(a["blend_weights"], dtype=numpy.float64)
def blend():
    di = numpy.zeros(a["blend_size"], dtype=numpy.int16)
    dsi = numpy.zeros(a["blend_size"], dtype=numpy.int64)
    helpers.build_blending_indices(di, dsi, w, len(w), a["blend_size"], False)
parts["blending indices"] = best(blend, a["repeats"])
print(json.dumps(out))
"""


def lognormal_lengths(docs: int, mean_len: int = 600, seed: int = 0) -> np.ndarray:
    """Document lengths as ``common.synthetic_token_file`` draws them (int32, >= 1)."""
    rng = np.random.default_rng(seed)
    sigma = 1.0
    mu = np.log(mean_len) - sigma**2 / 2
    return np.maximum(rng.lognormal(mu, sigma, size=docs).astype(np.int64), 1).astype(np.int32)


def sparse_token_file(prefix: str, lengths: np.ndarray, dtype=np.uint16) -> str:
    """A real ``.idx`` for single-sequence documents of ``lengths`` and a sparse ``.bin``; reused if present."""
    if os.path.exists(prefix + ".idx") and os.path.exists(prefix + ".bin"):
        return prefix
    dtype = np.dtype(dtype)
    n = lengths.shape[0]
    pointers = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
    pointers *= dtype.itemsize
    with open(prefix + ".idx.tmp", "wb") as f:
        f.write(struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, dtype_code(dtype), n, n + 1))
        f.write(lengths.astype(np.int32).tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(n + 1, dtype=np.int64).tobytes())
    with open(prefix + ".bin", "wb") as f:
        f.truncate(int(lengths.sum(dtype=np.int64)) * dtype.itemsize)
    os.replace(prefix + ".idx.tmp", prefix + ".idx")
    return prefix


def samples_per_epoch(lengths: np.ndarray) -> int:
    return (int(lengths.sum(dtype=np.int64)) - 1) // SEQ


def one_epoch_blend_size(epoch_samples: list[int], weights: tuple[int, ...]) -> int:
    """Largest train size whose mid-level sizes (Megatron's ceil(ceil(w N)(1 + surplus))) fit one epoch."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()

    def fits(size: int) -> bool:
        return all(math.ceil(math.ceil(size * wi) * (1 + SURPLUS)) <= n for wi, n in zip(w, epoch_samples))

    size = int(min(n / (wi * (1 + SURPLUS)) for wi, n in zip(w, epoch_samples)))
    while not fits(size):
        size -= 1
    return size


def tokenload_build(case: dict, tokenizer: dict, cache: str | None) -> None:
    blend: list[str] = []
    if case["weights"] is None:
        blend = list(case["prefixes"])
    else:
        for weight, prefix in zip(case["weights"], case["prefixes"]):
            blend += [str(weight), prefix]
    config = MegatronDataConfig(
        sequence_length=SEQ, random_seed=SEED, blend=blend, split=case["split"], tokenizer=tokenizer,
        mid_level_dataset_surplus=SURPLUS, path_to_cache=cache, cache="auto" if cache else "off",
    )
    datasets = build_datasets(config, case["sizes"])
    assert datasets[0] is not None and len(datasets[0]) > 0


def compare_caches(ours: str, theirs: str) -> tuple[bool, bool, int]:
    """(arrays equal, bytes equal, files compared) over every file Megatron wrote."""
    names = sorted(os.listdir(theirs))
    arrays_ok = bytes_ok = True
    for name in names:
        mine = os.path.join(ours, name)
        if not os.path.exists(mine):
            print(f"  missing in tokenload's cache: {name}", file=sys.stderr)
            return False, False, len(names)
        a_bytes, b_bytes = Path(mine).read_bytes(), Path(theirs, name).read_bytes()
        same_bytes = hashlib.md5(a_bytes).digest() == hashlib.md5(b_bytes).digest()
        bytes_ok &= same_bytes
        if name.endswith(".npy"):
            a, b = np.load(mine, allow_pickle=False), np.load(os.path.join(theirs, name), allow_pickle=False)
            same = a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
        else:
            same = same_bytes
        if not same:
            print(f"  differs: {name}", file=sys.stderr)
        arrays_ok &= same
    return arrays_ok, bytes_ok, len(names)


def ours_parts(single: str, blend_size: int, repeats: int) -> dict[str, float]:
    lengths = np.array(TokenFile(single).sequence_lengths)
    docs = np.arange(lengths.shape[0], dtype=np.int32)
    tokens = tokens_per_epoch(lengths, docs)
    doc_index = build_document_index(docs, 1, np.random.RandomState(SEED), False)
    n = (tokens - 1) // SEQ
    w = np.asarray(BLEND_WEIGHTS, dtype=np.float64)
    w = w / w.sum()
    return {
        "document index": best_of(lambda: build_document_index(docs, 1, np.random.RandomState(SEED), False), repeats),
        "sample index": best_of(
            lambda: build_sample_index(lengths, doc_index, sequence_length=SEQ, num_epochs=1,
                                       tokens_per_epoch=tokens, drop_last=True, extra=1), repeats),
        "shuffle index": best_of(lambda: build_shuffle_index(n, n, np.random.RandomState(SEED)), repeats),
        "blending indices": best_of(lambda: build_blending_indices(w, blend_size), repeats),
    }


def make_files(data: Path, docs: int) -> tuple[str, list[str], list[int]]:
    lengths = lognormal_lengths(docs)
    single = sparse_token_file(str(data / f"sparse_{docs}"), lengths)
    cuts = np.cumsum([0] + [docs * w // sum(BLEND_WEIGHTS) for w in BLEND_WEIGHTS])
    cuts[-1] = docs
    parts = [sparse_token_file(str(data / f"sparse_{docs}_part{i}"), lengths[cuts[i]:cuts[i + 1]])
             for i in range(len(BLEND_WEIGHTS))]
    epochs = [samples_per_epoch(lengths[cuts[i]:cuts[i + 1]]) for i in range(len(BLEND_WEIGHTS))]
    return single, parts, epochs


def tokenload_round(cases: list[dict], tokenizer: dict, work: Path) -> dict[str, float]:
    """One timing of each case: cache written to a fresh folder, then in memory."""
    out = {}
    for case in cases:
        cache = str(work / f"tokenload-{case['name']}")
        shutil.rmtree(cache, ignore_errors=True)
        t = time.perf_counter()
        tokenload_build(case, tokenizer, cache)
        out[case["name"]] = time.perf_counter() - t
        out[case["name"] + "/memory"] = best_of(lambda: tokenload_build(case, tokenizer, None), 1)
    return out


def merge_min(best: dict, new: dict) -> dict:
    """``new`` with every float replaced by its minimum over ``best`` and ``new`` (nested dicts too)."""
    out = {}
    for k, v in new.items():
        if isinstance(v, dict):
            out[k] = merge_min(best.get(k, {}), v)
        else:
            out[k] = min(v, best.get(k, v)) if isinstance(v, float) else v
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="/tmp/tokenload-bench")
    ap.add_argument("--docs", type=int, default=5_000_000)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (peer, then tokenload)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    work = data / "index_build_cache"
    single, parts, epochs = make_files(data, args.docs)
    for prefix in [single, *parts]:
        warmup_file(prefix + ".idx")
    blend_size = one_epoch_blend_size(epochs, BLEND_WEIGHTS)
    cases = [
        {"name": "single", "prefixes": [single], "weights": None, "split": "100,0,0", "sizes": [None, None, None]},
        {"name": "blend3", "prefixes": parts, "weights": list(BLEND_WEIGHTS), "split": "100,0,0",
         "sizes": [blend_size, 0, 0]},
    ]
    for case in cases:
        case["cache"] = str(work / f"megatron-{case['name']}")
    w = np.asarray(BLEND_WEIGHTS, dtype=np.float64)
    payload = {"cases": cases, "seq": SEQ, "seed": SEED, "surplus": SURPLUS, "vocab": VOCAB, "repeats": 1,
               "single": single, "blend_size": blend_size, "blend_weights": (w / w.sum()).tolist()}
    # Rounds alternate the two sides so that load from other processes falls on both alike.
    peer: dict = {}
    ours: dict = {}
    ours_p: dict = {}
    for _ in range(args.repeats):
        got = run_peer(PEER, payload)
        if got is None:
            sys.exit("megatron-core venv missing: run bash ../shared/tools/megatron-env.sh")
        peer = merge_min(peer, got)
        ours = merge_min(ours, tokenload_round(cases, got["tokenizer"], work))
        ours_p = merge_min(ours_p, ours_parts(single, blend_size, 1))
    report(args, cases, peer, ours, ours_p, work, parts, epochs, blend_size, single)


def report(args, cases, peer, ours, ours_p, work, parts, epochs, blend_size, single) -> None:
    rows, identical = [], True
    for case in cases:
        name = case["name"]
        same_arrays, same_bytes, files = compare_caches(str(work / f"tokenload-{name}"), case["cache"])
        identical &= same_arrays
        theirs = peer["builder"][name]
        rows.append([name, f"{theirs:.3f}", f"{ours[name]:.3f}", f"{theirs / ours[name]:.2f}x",
                     f"{ours[name + '/memory']:.3f}",
                     f"{'yes' if same_arrays else 'NO'} ({files} files; bytes {'equal' if same_bytes else 'differ'})"])
    part_rows = [[k, f"{peer['parts'][k] * 1000:.1f}", f"{v * 1000:.1f}", f"{peer['parts'][k] / v:.2f}x"]
                 for k, v in ours_p.items()]
    lengths = TokenFile(single).sequence_lengths
    print(f"data: {args.docs:,} documents, {int(lengths.sum(dtype=np.int64)):,} tokens (mean "
          f"{float(lengths.mean()):.0f}), S={SEQ}, seed {SEED}; blend3: {len(parts)} files of "
          f"{'/'.join(str(x) for x in BLEND_WEIGHTS)} % of the documents, weights "
          f"{'/'.join(str(x) for x in BLEND_WEIGHTS)}, train size {blend_size:,} (mid-level sizes within one "
          f"epoch: {epochs}); best of {args.repeats} interleaved rounds; nproc {os.cpu_count()}\n")
    print(table(rows, ["case", "megatron-core s", "tokenload s", "speed-up", "tokenload in memory s",
                       "identical cache arrays"]))
    print("\ncomponents alone (single file; blending at the blend3 size):\n")
    print(table(part_rows, ["step", "megatron-core ms", "tokenload ms", "speed-up"]))
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
