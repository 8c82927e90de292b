"""The computed order (issue 12) side by side with the Megatron order and megatron-core.

Usage: python benchmarks/computed_order.py [--data-dir /tmp/tokenload-bench]
           [--docs 1000000 10000000 100000000] [--prefixes 1] [--only startup|throughput]
           [--read-docs 200000] [--samples 4096] [--micro-batch 16] [--rounds 3]

**Startup** (``--docs``, one prefix each, or ``--prefixes`` prefixes sharing the documents):
``benchmarks/startup_data.py``'s files, real ``.idx`` files over sparse ``.bin`` s (lognormal
documents of mean 600 tokens: 100M documents is a 2 GB ``.idx`` and a 112 GiB sparse ``.bin``).
Each side runs in a fresh process and builds the train split (``100,0,0``, S = 2048, seed 1234,
half an epoch: a blend needs a size) and reads its first micro-batch, as one rank of a job
starting (after one untimed computed-order run that touches the freshly written files):

* ``computed``: ``build_computed_datasets``: nothing to build, cache or share;
* ``megatron (build)``: tokenload's Megatron order with ``build_policy="every-rank"``: what a
  rank does without a cache (every rank builds the indices in memory);
* ``megatron (cached)``: the same from a warm cache folder (``build_policy="none"`` after a
  ``prepare`` run): what every rank does once the cache exists;
* ``megatron-core (build)`` / ``(cached)``: megatron-core's ``BlendedMegatronDatasetBuilder``
  writing a fresh cache folder, then loading it in a second process.

Per side: seconds from the build call to the first micro-batch, the bytes of index arrays the
rank holds (document, sample and shuffle indices; blending indices; the computed order's blend
schedule), and the process's peak RSS (``VmHWM``, including the interpreter and NumPy). Sides
that build nothing run ``--repeats`` times (the median run is shown; the machine may be shared).

**Read throughput** (``--read-docs`` documents of real random tokens, warm page cache): fresh
samples per second at S = 2048 over consecutive dataset indices (already shuffled in every
order), ``--samples`` per pass in micro-batches of ``--micro-batch``: in-process
``__getitems__`` (megatron-core: ``ds[i]`` per item, how Megatron reads), and tokenload's loader
with 0 and 2 workers for both tokenload orders. Each side in a fresh process, sides alternating
from round to round; cells are medians of ``--rounds``. The machine may be shared: ratios
between sides of a round are the point, not absolute rates, and a second table gives samples per
CPU second of the reading process (robust to preemption; not for 2 workers, whose CPU time is
theirs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import MEGATRON_DATASET, docs_file, run_peer, table  # noqa: E402
from startup_data import make_blend  # noqa: E402

SEQ = 2048
SEED = 1234
VOCAB = 50257

MEGATRON_STARTUP = r"""
import json, logging, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
a = json.loads(sys.argv[1])
t0 = time.perf_counter()
import numpy
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.tokenizers import MegatronTokenizer
tok = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=a["vocab"], pad_id=-1)
blend = (a["prefixes"], a["weights"])
cfg = GPTDatasetConfig(
    random_seed=a["seed"], sequence_length=a["seq"], blend=blend, split="100,0,0", path_to_cache=a["cache"],
    tokenizer=tok, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
    create_attention_mask=False, mid_level_dataset_surplus=0.005)
start = time.perf_counter()
ds = BlendedMegatronDatasetBuilder(GPTDataset, [a["size"], None, None], lambda: True, cfg).build()[0]
for i in range(a["micro_batch"]):
    ds[i]
elapsed = time.perf_counter() - start
def arrays(d):
    names = ("document_index", "sample_index", "shuffle_index", "dataset_index", "dataset_sample_index")
    total = sum(getattr(d, n).nbytes for n in names if hasattr(d, n))
    return total + sum(arrays(m) for m in getattr(d, "datasets", []))
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"startup_s": elapsed, "index_bytes": arrays(ds), "peak_rss_mb": hwm / 1024, "len": len(ds)}))
"""

MEGATRON_READ = MEGATRON_DATASET + r"""
import time
start, n, mb = a["start"] % (len(ds) - a["samples"]), a["samples"], a["micro_batch"]
for i in range(mb):
    ds[(start + n + i) % len(ds)]
t, cpu = time.perf_counter(), time.process_time()
for i in range(start, start + n):
    ds[i]
print(json.dumps({"rate": n / (time.perf_counter() - t), "cpu_rate": n / (time.process_time() - cpu)}))
"""


# -- tokenload's sides, each in a fresh process (--side NAME --payload JSON) -----------------------
def _config(a: dict, **kw):
    from tokenload.datasets import MegatronDataConfig

    weights = a.get("weights")
    blend = a["prefixes"] if weights is None else [x for w, p in zip(weights, a["prefixes"]) for x in (str(w), p)]
    return MegatronDataConfig(
        sequence_length=SEQ, random_seed=SEED, blend=blend, split="100,0,0", eod_id=VOCAB - 1, **kw
    )


def _index_bytes(ds) -> int:
    """Bytes of index arrays a dataset holds (blend members included)."""
    total = 0
    indices = getattr(ds, "indices", None)
    if indices is not None:
        total += sum(v.nbytes for v in indices.arrays().values())
    mixture = getattr(ds, "mixture", None)
    if mixture is not None:
        inter = mixture.interleave
        total += inter.sources.nbytes + inter.ranks.nbytes + inter.counts.nbytes
    return total + sum(_index_bytes(m) for m in getattr(ds, "datasets", []))


def side_startup(a: dict) -> dict:
    """One rank's start: build the train split and read its first micro-batch."""
    from tokenload.datasets import build_datasets
    from tokenload.datasets.computed.computed_dataset import build_computed_datasets

    start = time.perf_counter()
    size = a["size"]
    if a["order"] == "computed":
        ds = build_computed_datasets(_config(a), [size, None, None])[0]
    else:
        policy = a["policy"]
        kw = {"build_policy": policy, "path_to_cache": a["cache"]} if policy != "every-rank" else {"cache": "off"}
        ds = build_datasets(_config(a, **kw), [size, None, None])[0]
    ds.__getitems__(np.arange(a["micro_batch"]))
    elapsed = time.perf_counter() - start
    return {"startup_s": elapsed, "index_bytes": _index_bytes(ds), "len": len(ds),
            "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``: ``ru_maxrss`` keeps the forking parent's across exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def side_read(a: dict) -> dict:
    """Fresh samples per second of one order and one way of reading."""
    from tokenload.datasets import build_datasets
    from tokenload.datasets.computed.computed_dataset import build_computed_datasets

    if a["order"] == "computed":
        ds = build_computed_datasets(_config(a), [None, None, None])[0]
    else:
        ds = build_datasets(_config(a, path_to_cache=a["cache"]), [None, None, None])[0]
    n, mb = a["samples"], a["micro_batch"]
    begin = a["start"] % (len(ds) - n - mb)
    ds.__getitems__(np.arange(begin + n, begin + n + mb))  # untimed: first-call costs
    if a["what"] == "in-process":
        t, cpu = time.perf_counter(), time.process_time()
        for b in range(begin, begin + n, mb):
            ds.__getitems__(np.arange(b, b + mb))
        return {"rate": n / (time.perf_counter() - t), "cpu_rate": n / (time.process_time() - cpu)}
    from tokenload.loader import build_dataloader

    loader = build_dataloader(ds, micro_batch_size=mb, num_workers=int(a["what"][-1]), dp_rank=0, dp_size=1,
                              consumed_samples=begin)
    try:
        it = iter(loader)
        next(it)  # untimed: workers start
        t, cpu = time.perf_counter(), time.process_time()
        for _ in range(n // mb):
            next(it)
        return {"rate": n / (time.perf_counter() - t), "cpu_rate": n / (time.process_time() - cpu)}
    finally:
        loader.close()


def run_side(side: str, payload: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--side", side, "--payload", json.dumps(payload)],
        capture_output=True, text=True, timeout=7200,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{side} side failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_megatron_read(payload: dict) -> dict | None:
    """megatron-core's read side in its venv (``MEGATRON_DATASET`` reads its payload from a file)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(payload, f)
        f.flush()
        return run_peer(MEGATRON_READ.replace("json.load(open(sys.argv[1]))", f"json.load(open({f.name!r}))"), {})


# -- the two parts ---------------------------------------------------------------------------------
def startup(args) -> None:
    rows = []
    for docs in args.docs:
        blend = make_blend(args.data_dir, args.prefixes, docs)
        weights = None if args.prefixes == 1 else blend["weights"]
        size = blend["tokens"] // SEQ // 2  # half an epoch: a blend needs a size
        base = {"prefixes": blend["prefixes"], "weights": weights, "micro_batch": args.micro_batch, "size": size}
        cache = tempfile.mkdtemp(prefix="computed-order-cache-", dir=args.data_dir)
        try:
            sides = [("computed", {"order": "computed"}),
                     ("megatron (build)", {"order": "megatron", "policy": "every-rank"}),
                     ("prepare", {"order": "megatron", "policy": "auto", "cache": cache}),
                     ("megatron (cached)", {"order": "megatron", "policy": "none", "cache": cache})]
            run_side("startup", {**base, "order": "computed"})  # untimed: files just written
            for name, extra in sides:
                repeats = args.repeats if "build" not in name and name != "prepare" else 1
                runs = [run_side("startup", {**base, **extra}) for _ in range(repeats)]
                if name != "prepare":
                    rows.append(_startup_row(docs, name, _median_run(runs)))
            peer = {"prefixes": blend["prefixes"], "weights": weights, "seed": SEED, "seq": SEQ,
                    "vocab": VOCAB, "micro_batch": args.micro_batch, "size": size,
                    "cache": os.path.join(cache, "megatron-core")}
            for name in ("megatron-core (build)", "megatron-core (cached)"):
                runs = [run_peer(MEGATRON_STARTUP, peer, timeout=7200) for _ in range(1 if "build" in name else args.repeats)]
                if runs[0] is not None:
                    rows.append(_startup_row(docs, name, _median_run(runs)))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        print(table(rows[-6:], STARTUP_HEADER), flush=True)
    print("\n## Startup of one rank (train split, first micro-batch)\n")
    print(table(rows, STARTUP_HEADER))


def _median_run(runs: list[dict]) -> dict:
    """The run of median startup time."""
    return sorted(runs, key=lambda r: r["startup_s"])[len(runs) // 2]


STARTUP_HEADER = ["documents", "side", "startup s", "index arrays", "peak RSS MB"]


def _startup_row(docs: int, name: str, got: dict) -> list:
    size = got["index_bytes"]
    shown = f"{size / 2**20:,.1f} MiB" if size >= 2**20 else f"{size:,} B"
    return [f"{docs:,}", name, f"{got['startup_s']:.3f}", shown, f"{got['peak_rss_mb']:,.0f}"]


def throughput(args) -> None:
    args.docs = args.read_docs
    prefix = docs_file(args)
    cache = os.path.join(args.data_dir, "computed-order-read-cache")
    base = {"prefixes": [prefix], "weights": None, "cache": cache, "samples": args.samples,
            "micro_batch": args.micro_batch}
    run_side("read", {**base, "order": "megatron", "what": "in-process", "start": 0, "samples": args.micro_batch})
    peer_base = {"prefix": prefix, "seed": SEED, "seq": SEQ, "vocab": VOCAB, "cache": cache + "-core",
                 "samples": args.samples, "micro_batch": args.micro_batch}
    sides = [("megatron", "in-process"), ("computed", "in-process"), ("megatron-core", "in-process"),
             ("megatron", "loader-0"), ("computed", "loader-0"), ("megatron", "loader-2"), ("computed", "loader-2")]
    rates: dict[tuple[str, str], list[float]] = {s: [] for s in sides}
    cpu_rates: dict[tuple[str, str], list[float]] = {s: [] for s in sides}
    rng = np.random.default_rng(0)
    for r in range(args.rounds):
        start = int(rng.integers(0, 2**31))
        for order, what in (sides if r % 2 == 0 else sides[::-1]):
            if order == "megatron-core":
                got = run_megatron_read({**peer_base, "start": start})
                if got is None:
                    continue
            else:
                got = run_side("read", {**base, "order": order, "what": what, "start": start})
            rates[(order, what)].append(got["rate"])
            cpu_rates[(order, what)].append(got["cpu_rate"])
    for title, table_rates in (("samples/s", rates), ("samples per CPU second of the reading process", cpu_rates)):
        rows = []
        for what in ("in-process", "loader-0", "loader-2"):
            if what == "loader-2" and table_rates is cpu_rates:
                continue  # the workers' CPU time is not the training process's
            meg = statistics.median(table_rates[("megatron", what)])
            comp = statistics.median(table_rates[("computed", what)])
            core = table_rates.get(("megatron-core", what)) or []
            rows.append([what, f"{meg:,.0f}", f"{comp:,.0f}", f"{comp / meg:.2f}",
                         f"{statistics.median(core):,.0f}" if core else "-"])
        print(f"\n## Read throughput, {title}, S = {SEQ}, micro-batch {args.micro_batch}, "
              f"{args.read_docs:,} documents, median of {args.rounds}\n")
        print(table(rows, ["read", "megatron order", "computed order", "computed / megatron", "megatron-core"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side")
    ap.add_argument("--payload")
    ap.add_argument("--data-dir", default="/tmp/tokenload-bench")
    ap.add_argument("--docs", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    ap.add_argument("--prefixes", type=int, default=1)
    ap.add_argument("--read-docs", type=int, default=200_000)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each startup side that builds nothing (median)")
    ap.add_argument("--only", choices=("startup", "throughput"))
    ap.add_argument("--gb", type=float, default=1.0)
    args = ap.parse_args()
    if args.side:
        payload = json.loads(args.payload)
        print(json.dumps({"startup": side_startup, "read": side_read}[args.side](payload)))
        return
    if args.only != "throughput":
        startup(args)
    if args.only != "startup":
        throughput(args)


if __name__ == "__main__":
    main()
