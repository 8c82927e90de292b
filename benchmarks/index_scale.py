"""Megatron-order index build at 1M / 10M / 100M documents, side by side with megatron-core's C++
helpers, alternating rounds, medians with the spread, peak RSS, arrays compared (issue 27).

Usage:
    python benchmarks/index_scale.py --docs 1000000 10000000 --prefixes 1 100 --rounds 3
    python benchmarks/index_scale.py --docs 100000000 --prefixes 1 --rounds 3 --profile

Data: benchmarks/startup_data.py's files (real ``.idx`` over sparse ``.bin``, lognormal documents
of mean ~600 tokens; 100M documents is a 2 GB ``.idx``), one prefix or a blend of ``--prefixes``
(weights = token counts). The train split (``100,0,0``), S = 2048, seed 1234, half an epoch of
samples (the size benchmarks/computed_order.py asks for), mid-level surplus 0.005.

Each side runs in a fresh process on an empty cache folder and builds and writes Megatron's
cache, as one rank of a job that finds no cache does:

* ``tokenload:auto``: ``build_datasets`` with ``build_policy="auto"``: builds and writes the cache
  (every file made durable before it is put in place -- one ``syncfs`` for the build's group of
  caches on Linux's local filesystems, else an fsync per file -- which megatron-core does not do);
* ``tokenload:every-rank``: the same build in memory, nothing written (``--policies``);
* ``megatron-core``: ``BlendedMegatronDatasetBuilder(GPTDataset, ...).build()`` (C++ helpers).

Timed: the build call alone (imports and tokenizer excluded on both sides), wall and CPU seconds
(``getrusage``, every thread), and the process's peak RSS (``VmHWM``). Rounds rotate which
side goes first; every ``.idx`` is read once before the first round so that both find it in the
page cache (a first reader of a 2 GB file pays the disk). After the first round the two cache
folders are compared array by array (``index_build.compare_caches``). ``--profile`` runs one
extra tokenload build (the first of ``--policies``) under cProfile and prints its top functions,
with ``tracemalloc`` off (it would distort the time): where the time goes; the memory is given by
the peak RSS and the arrays' sizes.
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

sys.path.insert(0, str(Path(__file__).parent))
from common import MEGATRON_PYTHON, table  # noqa: E402
from startup import NULL_TOKENIZER  # noqa: E402
from startup_data import make_blend  # noqa: E402

SEQ, SEED, VOCAB, SURPLUS = 2048, 1234, 50257, 0.005

TOKENLOAD = r"""
import json, os, resource, sys, time
a = json.loads(sys.argv[1])
from tokenload.datasets import MegatronDataConfig, build_datasets
if a.get("threads"):
    from tokenload.datasets.megatron import builder
    builder.BUILD_THREADS = int(a["threads"])
w = a["weights"]
blend = a["prefixes"] if w is None else [x for wt, p in zip(w, a["prefixes"]) for x in (str(wt), p)]
cfg = MegatronDataConfig(sequence_length=a["seq"], random_seed=a["seed"], blend=blend,
                         split="100,0,0", path_to_cache=a["cache"], build_policy=a["policy"],
                         mid_level_dataset_surplus=a["surplus"],
                         tokenizer=a["tokenizer"])
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
if a.get("profile"):
    import cProfile, pstats, io
    prof = cProfile.Profile(); prof.enable()
c0, t0 = cpu(), time.perf_counter()
ds = build_datasets(cfg, [a["size"], 0, 0])[0]
t1, c1 = time.perf_counter(), cpu()
if a.get("profile"):
    prof.disable(); s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue(), file=sys.stderr)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"s": t1 - t0, "cpu": c1 - c0, "hwm_mb": hwm / 1024, "len": len(ds)}))
"""

MEGATRON = r"""
import json, logging, resource, sys, time, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
a = json.loads(sys.argv[1])
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.tokenizers import MegatronTokenizer
tok = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"},
                                        vocab_size=a["vocab"], pad_id=-1)
w = a["weights"]
cfg = GPTDatasetConfig(random_seed=a["seed"], sequence_length=a["seq"], blend=(a["prefixes"], w),
    split="100,0,0", path_to_cache=a["cache"], tokenizer=tok,
    mid_level_dataset_surplus=a["surplus"],
    reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
    create_attention_mask=False)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
c0, t0 = cpu(), time.perf_counter()
ds = BlendedMegatronDatasetBuilder(GPTDataset, [a["size"], 0, 0], lambda: True, cfg).build()[0]
t1, c1 = time.perf_counter(), cpu()
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"s": t1 - t0, "cpu": c1 - c0, "hwm_mb": hwm / 1024, "len": len(ds)}))
"""


def run(side: str, payload: dict, timeout: int = 7200) -> dict:
    python = MEGATRON_PYTHON if side == "megatron-core" else sys.executable
    code = MEGATRON if side == "megatron-core" else TOKENLOAD
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([python, "-c", code, json.dumps(payload)], capture_output=True, text=True,
                         timeout=timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{out.stderr[-3000:]}")
    if payload.get("profile"):
        print(out.stderr[-12000:])
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got["load"] = os.getloadavg()[0]
    return got


def spread(values: list[float], digits: int = 2) -> str:
    med = statistics.median(values)
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def compare(ours: str, theirs: str) -> str:
    from index_build import compare_caches

    files = sorted(f for f in os.listdir(theirs))
    mine_dirs = [ours] + [str(p) for p in Path(ours).rglob("*") if p.is_dir()]
    for folder in mine_dirs:
        if all(os.path.exists(os.path.join(folder, f)) for f in files):
            arrays, same_bytes, n = compare_caches(folder, theirs)
            same = "equal" if same_bytes else "differ"
            return f"{'yes' if arrays else 'NO'} ({n} files; bytes {same})"
    return "not compared (file names differ)"


def case_rows(args, docs: int, prefixes: int) -> tuple[list, dict]:
    t = time.time()
    blend = make_blend(args.data_dir, prefixes, docs)
    for p in blend["prefixes"]:  # both sides find the .idx in the page cache
        with open(p + ".idx", "rb") as f:
            while f.read(64 << 20):
                pass
    size = blend["tokens"] // SEQ // 2
    print(f"[{docs:,} documents in {prefixes} prefix(es), {blend['tokens']:,} tokens, "
          f"size {size:,}; "
          f"data ready in {time.time() - t:.0f} s]", flush=True)
    base = {"prefixes": blend["prefixes"], "weights": None if prefixes == 1 else blend["weights"],
            "seq": SEQ, "seed": SEED, "vocab": VOCAB, "surplus": SURPLUS, "size": size,
            "threads": args.threads, "tokenizer": NULL_TOKENIZER}
    sides = [f"tokenload:{p}" for p in args.policies.split(",")]
    if os.path.exists(MEGATRON_PYTHON):
        sides.append("megatron-core")
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    identical = "-"
    work = Path(tempfile.mkdtemp(prefix="index-scale-", dir=args.data_dir))
    try:
        for r in range(args.rounds):
            order = sides[r % len(sides):] + sides[: r % len(sides)]  # each side leads in turn
            for side in order:
                cache = work / f"{side.replace(':', '-')}-{r}"
                shutil.rmtree(cache, ignore_errors=True)
                cache.mkdir()
                lib, _, policy = side.partition(":")
                runs[side].append(run(lib, {**base, "cache": str(cache), "policy": policy}))
                print(f"  round {r + 1} {side}: {runs[side][-1]}", flush=True)
            ours = work / f"{sides[0].replace(':', '-')}-0"
            if r == 0 and "megatron-core" in runs and sides[0].endswith(":auto"):
                identical = compare(str(ours), str(work / "megatron-core-0"))
            for side in order:
                shutil.rmtree(work / f"{side.replace(':', '-')}-{r}", ignore_errors=True)
        if args.profile:
            cache = work / "profile"
            cache.mkdir()
            policy = args.policies.split(",")[0]
            run("tokenload", {**base, "cache": str(cache), "profile": True, "policy": policy})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    peer = runs.get("megatron-core", [])
    for side in sides:
        got = runs[side]
        secs = [x["s"] for x in got]
        ratio = "-"
        if peer and side != "megatron-core":
            ratio = spread([b["s"] / a["s"] for a, b in zip(got, peer)])
        rows.append([f"{docs:,}", prefixes, side, spread(secs),
                     spread([x["cpu"] for x in got]), ratio,
                     f"{statistics.median(secs) / docs * 1e9:.0f}",
                     f"{statistics.median([x['hwm_mb'] for x in got]):,.0f}",
                     identical if side == sides[0] else "",
                     f"{statistics.median([x['load'] for x in got]):.1f}"])
    return rows, {"docs": docs, "prefixes": prefixes, "runs": runs, "identical": identical}


HEADER = ["documents", "prefixes", "side", "build s (median, range)", "CPU s",
          "megatron-core / this (per round)", "ns per document", "peak RSS MB",
          "arrays identical to megatron-core's", "load (1 min)"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir",
                    default=os.path.join(tempfile.gettempdir(), "tokenload-bench", "index-scale"))
    ap.add_argument("--docs", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    ap.add_argument("--prefixes", type=int, nargs="+", default=[1, 100])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--policies", default="auto,every-rank",
                    help="tokenload build policies, each a side (auto writes the cache, as"
                         " megatron-core does; every-rank builds in memory)")
    ap.add_argument("--threads", type=int, default=0,
                    help="tokenload's BUILD_THREADS (0: as shipped)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    print(f"load average at start {os.getloadavg()}; {os.cpu_count()} CPUs; "
          f"peer {MEGATRON_PYTHON}", flush=True)
    rows, raw = [], []
    for docs in args.docs:
        for prefixes in args.prefixes:
            got, rec = case_rows(args, docs, prefixes)
            rows += got
            raw.append(rec)
            print(table(got, HEADER), flush=True)
    print()
    print(table(rows, HEADER))
    print(f"load average at end {os.getloadavg()}")
    if args.out:
        Path(args.out).write_text(json.dumps(raw))


if __name__ == "__main__":
    main()
