"""Random-access samples/s at S = 2048 in three regimes: tokenload vs megatron-core's GPTDataset
vs a NumPy ceiling.

Usage: python benchmarks/loader.py [--data-dir /tmp/tokenload-bench] [--docs 1000000]
                                   [--micro-batch 16] [--samples 16384] [--loader-samples 8192]
                                   [--cold-samples 2048] [--rounds 3] [--variants ...] [--quick]

Data: a synthetic uint16 token file of ``--docs`` documents (lognormal lengths, mean 600 tokens:
1M documents is ~1.2 GB, issue 15's file). Both sides build their one-epoch train split (split
``100,0,0``, seed 1234, S = 2048, extra token on, no attention mask) with their own builder and
cache folder; items carry tokens, labels, loss_mask and position_ids.

Regimes, each process reading each index at most once per regime:

* **first pass (the goal)**: a fresh process per side reads fresh random samples once. The page
  cache holds the file, the process's page tables hold nothing: what pretraining does, reading
  each sample about once per epoch from a file much larger than one pass touches.
* **warm re-read**: the same process reads the same samples again (page tables mapped).
* **cold page cache**: ``echo 3 > /proc/sys/vm/drop_caches`` right before the pass, or where the
  machine refuses that (not root, a sandbox), ``posix_fadvise(DONTNEED)`` on the token file and
  both sides' index caches; then other fresh samples (fewer: they come from disk). Neither way
  evicts pages a process has mapped, so the cold pass runs in a process of its own (run after the
  first and warm passes, which map most of the file, it would find them resident and mapped).
  The files are read back into the page cache after each cold process.

Measurements, each side in a fresh process, the same indices for every side of a round, sides
alternating in order from round to round, cells the MEDIAN of ``--rounds`` rounds:

Before its first pass each in-process side reads one untimed micro-batch of other fresh indices
(first-call costs: lazy imports, code pages), as the DataLoaders' untimed first batch does.

* in-process: tokenload ``ds.__getitems__`` per micro-batch vs megatron-core ``ds[i]`` per item
  (how Megatron reads) vs the NumPy ceiling (``np.memmap``, each sample's S + 1 tokens from its
  first token as row slices, stacked and cast to int64: no fields, no document boundaries);
* DataLoader with 0 and with 2 workers: consecutive dataset indices (already shuffled samples;
  each regime and worker count its own range), ``tokenload.loader.build_dataloader`` vs
  ``torch.utils.data.DataLoader`` (default collate, persistent workers); the first micro-batch of
  each pass (worker start-up) is not timed.

Per side and micro-batch: CPU time (the process and its workers), minor and major page faults,
voluntary and involuntary context switches (``getrusage`` and ``/proc`` for the workers), so a
missed goal can be explained. ``--baseline-src DIR`` also runs tokenload imported from another
source folder (a worktree of an earlier commit) as one more side of every round: before and after
a change, on the same indices, in one run. ``--variants`` also measures the read-path ideas of
``prototypes.py`` (tokenload only, patched in the benchmark process, not in ``src``).

The machine may be shared: absolute rates move between runs; the ratios are the point. Where
other work competes for the cores, a side's wall time stretches with it while its CPU time per
micro-batch does not, so the goal tables also give each ratio by CPU time per batch (a
side's cost, not its speed: it cannot show what parallel workers gain, so that goal has none).
The verdict is on samples/s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import MEGATRON_DATASET, PROBE, add_data_arguments, cold_method, docs_file, run_peer, table  # noqa: E402
from prototypes import IN_PROCESS_VARIANTS, VARIANTS, WORKER_VARIANTS, apply_variant  # noqa: E402

SEQ = 2048
SEED = 1234
VOCAB = 50257  # the synthetic file's token range; NullTokenizer's EOD is VOCAB - 1
FIELDS = ("tokens", "labels", "loss_mask", "position_ids")
CHECKED = 64
REGIMES = ("first", "warm", "cold")
REGIME_NAMES = {"first": "first pass (the goal)", "warm": "warm re-read", "cold": "cold page cache"}
WHATS = ("in-process", "loader-0", "loader-2")

PASSES = PROBE + r"""
def in_process_passes(plan, read_batch, mb, evict=()):
    # plan: [(regime, indices)]; every batch of each regime's indices read once, one pass each; a
    # "warmup" entry is read first and not timed (first-call costs: lazy imports, code pages);
    # "cold" evicts the page cache (all of it, else the files ``evict``) right before its pass
    out = {}
    for regime, idx in plan:
        if regime == "warmup":
            read_batch(idx)
            continue
        batches = [idx[b : b + mb] for b in range(0, len(idx), mb)]
        if regime == "cold":
            drop_caches(evict)

        def body():
            for b in batches:
                read_batch(b)
            return len(idx)

        out[regime] = timed(body, len(batches))
    return out


def loader_passes(plan, start_pass, mb, worker_pids, evict=()):
    # plan: [(regime, first index, samples)]; each pass takes an iterator from start_pass(start),
    # skips its first batch (worker start-up) and times the next samples // mb - 1; "cold" evicts
    # before the iterator starts and again after its first batch (what the workers read ahead
    # before that is read warm: at most prefetch batches per worker)
    out = {}
    for regime, start, samples in plan:
        steps = samples // mb - 1
        if regime == "cold":
            drop_caches(evict)
        it = start_pass(start)
        next(it)
        if regime == "cold":
            drop_caches(evict)
        pids = worker_pids()

        def body():
            for _ in range(steps):
                next(it)
            return steps * mb

        out[regime] = timed(body, steps, pids)
        del it
    return out
"""
exec(PASSES)  # the same timing code runs on both sides

PEER = PASSES + MEGATRON_DATASET + r"""
mb = a["micro_batch"]
out = {"len": len(ds)}

def read_batch(b):
    for i in b:
        ds[i]

if a["what"] == "in-process":
    out["passes"] = in_process_passes(a["plan"], read_batch, mb, a.get("evict", ()))
else:
    w = int(a["what"][-1])
    current = {}

    def sampler():
        s = current["start"]
        return iter(range(s, s + a["loader_samples"]))

    class Range:
        def __iter__(self):
            return sampler()

        def __len__(self):
            return a["loader_samples"]

    dl = torch.utils.data.DataLoader(ds, batch_size=mb, sampler=Range(), num_workers=w, persistent_workers=w > 0)
    holder = {}

    def start_pass(start):
        current["start"] = start
        holder["it"] = iter(dl)
        return holder["it"]

    out["passes"] = loader_passes(a["plan"], start_pass, mb,
                                  lambda: [p.pid for p in getattr(holder["it"], "_workers", [])], a.get("evict", ()))
if a.get("items"):
    items = [ds[i] for i in a["check"]]
    numpy.savez(a["items"], **{k: numpy.stack([it[k].numpy() for it in items]) for k in items[0]})
print(json.dumps(out))
"""


def _dataset(a: dict, read_mode: str = "mmap"):
    from tokenload.datasets import MegatronDataConfig, build_datasets

    config = MegatronDataConfig(
        sequence_length=a["seq"], random_seed=a["seed"], blend=[a["prefix"]], split="100,0,0",
        eod_id=a["vocab"] - 1, pad_id=-1, path_to_cache=a["tokenload_cache"], read_mode=read_mode,
    )
    return build_datasets(config, [None, None, None])[0]


def side_tokenload(a: dict) -> dict:
    """tokenload's measurements (one ``what``, one variant), in this fresh process."""
    variant = apply_variant(a.get("variant", "mmap"))
    ds = _dataset(a, variant["read_mode"])
    mb = a["micro_batch"]
    if a["what"] == "in-process":
        before, read = variant["before_batch"], variant["read"] or type(ds).__getitems__

        def read_batch(b):
            if before is not None:
                before(ds, b)
            read(ds, b)

        plan = [(r, np.asarray(i)) for r, i in a["plan"]]
        return {"passes": in_process_passes(plan, read_batch, mb, a.get("evict", ()))}  # noqa: F821
    from tokenload.loader import build_dataloader

    w = int(a["what"][-1])
    loader = build_dataloader(ds, micro_batch_size=mb, num_workers=w, dp_rank=0, dp_size=1,
                              persistent_workers=True, **variant["loader"])

    def start_pass(start):
        loader.restart(start)
        return iter(loader)

    try:
        return {"passes": loader_passes(a["plan"], start_pass, mb,  # noqa: F821 (from PASSES)
                                        lambda: [p.pid for p in loader.worker_processes], a.get("evict", ()))}
    finally:
        loader.close()


def window_starts(ds, tf, indices: np.ndarray) -> np.ndarray:
    """Stream position (in tokens) of each dataset index's first token."""
    samples = np.asarray(ds.shuffle_index[indices], dtype=np.int64)
    rows = np.asarray(ds.sample_index[samples], dtype=np.int64)
    seqs = np.asarray(ds.document_index[rows[:, 0]], dtype=np.int64)
    starts = tf.sequence_pointers[seqs] // tf.dtype.itemsize + rows[:, 1]
    return np.minimum(starts, tf.num_tokens - (SEQ + 1))


def sample_spans(ds, indices: np.ndarray) -> list[list[tuple[int, int]]]:
    """Per dataset index, the ``.bin`` token ranges ``(start, end)`` its window is made of (the
    ranges ``GPTDataset.read_batch`` reads: one per document piece)."""
    arrays = ds.indices.arrays()
    seqs, first, lengths, first_offsets = ds._pieces(arrays, arrays["shuffle_index"][np.asarray(indices)])[:4]
    starts = ds.source.token_starts(seqs)
    starts[first] += first_offsets
    ends = starts + lengths
    bounds = list(first.tolist()) + [starts.size]
    return [list(zip(starts[b:e].tolist(), ends[b:e].tolist())) for b, e in zip(bounds, bounds[1:])]


def side_ceiling(a: dict) -> dict:
    """The NumPy ceiling on the same windows, in this fresh process: ``plan`` holds each sample's
    first token ("slices": one contiguous S + 1 range per sample) or its document pieces ("spans":
    the ranges tokenload and megatron-core read, concatenated)."""
    mm = np.memmap(a["prefix"] + ".bin", dtype=np.uint16, mode="r")

    def read_batch(starts):
        np.stack([mm[i : i + SEQ + 1] for i in starts]).astype(np.int64)

    if a["variant"] == "spans":
        def read_batch(samples):  # noqa: F811
            np.concatenate([mm[s:e] for spans in samples for s, e in spans]).astype(np.int64)

    return {"passes": in_process_passes(a["plan"], read_batch, a["micro_batch"], a.get("evict", ()))}  # noqa: F821


def run_side(side: str, payload: dict, src: str | None = None) -> dict:
    """Run one of this file's sides in a fresh process (the payload travels as a JSON file);
    ``src``: import tokenload from that source folder (the ``--baseline-src`` side)."""
    env = None if src is None else {**os.environ, "PYTHONPATH": src}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(payload, f)
        f.flush()
        out = subprocess.run(
            [sys.executable, __file__, "--side", side, "--payload", f.name],
            capture_output=True, text=True, timeout=3600, env=env,
        )
    if out.returncode != 0:
        raise RuntimeError(f"{side} side failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_megatron(payload: dict) -> dict:
    """megatron-core's side in a fresh process of its venv (payload as a JSON file)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(payload, f)
        f.flush()
        got = run_peer(PEER.replace("json.load(open(sys.argv[1]))", f"json.load(open({f.name!r}))"), {})
    if got is None:
        sys.exit("megatron-core venv missing: run bash ../shared/tools/megatron-env.sh")
    return got


def _tolist(x):
    return x.tolist() if isinstance(x, np.ndarray) else x


def check_items(ds, indices: np.ndarray, path: str) -> list[str]:
    """Fields where tokenload's items differ from megatron-core's (empty: identical)."""
    theirs = np.load(path)
    mine = ds.__getitems__(indices)
    problems = [f"megatron-core has fields {sorted(theirs.files)}"] if sorted(theirs.files) != sorted(FIELDS) else []
    for k in FIELDS:
        if k not in theirs.files or not np.array_equal(np.asarray(mine[k]), theirs[k]):
            problems.append(k)
    return problems


def warm_files(paths: list[str]) -> None:
    """Read files back into the page cache (after a cold pass dropped it)."""
    from tokenload.format import warmup_file

    for p in paths:
        warmup_file(p)


def median(values: list) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_arguments(ap, docs=1_000_000)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--samples", type=int, default=16384, help="random in-process reads per pass")
    ap.add_argument("--loader-samples", type=int, default=8192, help="samples per DataLoader pass")
    ap.add_argument("--cold-samples", type=int, default=2048, help="samples per cold-page-cache pass")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (cells are their median)")
    ap.add_argument("--variants", nargs="*", default=list(IN_PROCESS_VARIANTS + WORKER_VARIANTS[1:]),
                    choices=[v for v in VARIANTS if v != "mmap"], help="read-path ideas to measure (tokenload only)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-page-cache regime")
    ap.add_argument("--only", nargs="+", choices=WHATS, default=list(WHATS), help="measure only these")
    ap.add_argument("--quick", action="store_true", help="small smoke run: 1 round, few samples, 2 variants")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-src", help="also measure tokenload imported from this source folder (a "
                    "worktree's src: `git worktree add /tmp/base COMMIT`), side by side: before/after")
    ap.add_argument("--side", choices=["tokenload", "ceiling"], help=argparse.SUPPRESS)
    ap.add_argument("--payload", help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    if args.side:
        side = side_tokenload if args.side == "tokenload" else side_ceiling
        print(json.dumps(side(json.loads(Path(args.payload).read_text()))))
        return
    if args.quick:
        args.samples, args.loader_samples, args.cold_samples, args.rounds = 2048, 1024, 512, 1
        args.variants = [v for v in ("pread", "prefetch8") if v in args.variants]
    results = measure(args)
    report(args, *results)


def measure(args):
    """Run every round; returns the per-round results and what describes the run."""
    from tokenload.format import TokenFile

    data = Path(args.data_dir)
    prefix = docs_file(args)
    mb = args.micro_batch
    cache = data / "loader_cache"
    payload = {
        "prefix": prefix, "cache": str(cache / "megatron"), "tokenload_cache": str(cache / "tokenload"),
        "seq": SEQ, "seed": SEED, "vocab": VOCAB, "micro_batch": mb, "loader_samples": args.loader_samples // mb * mb,
    }
    ds = _dataset(payload)
    tf = TokenFile(prefix)
    def data_paths():  # the token file and both sides' index caches (evicted for a cold pass)
        return [prefix + ".bin", prefix + ".idx"] + [str(p) for p in cache.rglob("*.npy")]

    how = None if args.no_cold else cold_method(data_paths())
    cold = how is not None
    regimes = [r for r in REGIMES if r != "cold" or cold]
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(ds))  # fresh indices: every round and regime takes its own
    taken = 0

    def fresh(n):
        nonlocal taken
        if taken + n > order.size:
            sys.exit(f"the split has {order.size} samples, too few for this many fresh reads; lower --samples")
        taken += n
        return order[taken - n : taken]

    n_loader, n_cold = payload["loader_samples"], args.cold_samples // mb * mb
    loader_base = 0  # DataLoader ranges: consecutive (already shuffled) dataset indices
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            first, cold_idx = fresh(args.samples), fresh(args.cold_samples)
            # The cold pass runs in a process of its own: neither way of evicting the page cache
            # evicts pages a process has mapped, and the first and warm passes map most of the file.
            plan_idx = [("warmup", fresh(mb).tolist()), ("first", first.tolist()), ("warm", first.tolist())]
            cold_plans = {"in-process": [("warmup", fresh(mb).tolist()), ("cold", cold_idx.tolist())]}
            starts = {}
            for what in WHATS[1:]:
                starts[what] = [("first", loader_base, n_loader), ("warm", loader_base, n_loader)]
                cold_plans[what] = [("cold", loader_base + n_loader, n_cold)]
                loader_base += 2 * n_loader
                if loader_base + 2 * n_loader > len(ds):
                    loader_base = 0
            got: dict = {}
            items = os.path.join(tmp, "items.npz") if r == 0 else ""
            for what in args.only:
                plan = plan_idx if what == "in-process" else starts[what]
                sides = [("megatron", "mmap"), ("tokenload", "mmap")]
                if args.baseline_src:
                    sides.append(("tokenload-base", "mmap"))
                if r % 2:
                    sides.reverse()
                sides += [("tokenload", v) for v in args.variants
                          if v in (IN_PROCESS_VARIANTS if what == "in-process" else WORKER_VARIANTS if what == "loader-2" else ())]
                if what == "in-process":
                    sides += [("ceiling", "mmap"), ("ceiling", "spans")]
                for side, variant in sides:
                    passes = {}
                    for part in [plan] + ([cold_plans[what]] if cold else []):
                        p = {**payload, "what": what, "plan": part, "variant": variant, "evict": data_paths()}
                        if side == "megatron":
                            if what == "in-process" and part is plan:
                                p.update(items=items, check=first[:CHECKED].tolist())
                            res = run_megatron(p)
                            payload["len_megatron"] = res["len"]
                        elif side == "ceiling":
                            where = window_starts if variant == "mmap" else lambda ds, tf, i: sample_spans(ds, i)
                            p["plan"] = [(reg, _tolist(where(ds, tf, np.asarray(i)))) for reg, i in part]
                            res = run_side("ceiling", p)
                        else:
                            res = run_side("tokenload", p, args.baseline_src if side == "tokenload-base" else None)
                        passes.update(res["passes"])
                        if part is not plan:
                            warm_files(data_paths())
                    got[(what, side, variant)] = passes
                    print(f"  round {r + 1} {what} {side} {variant}: "
                          + ", ".join(f"{k} {v['rate']:,.0f}/s" for k, v in passes.items()), file=sys.stderr)
            if r == 0:  # megatron-core's items are saved by its in-process side
                problems = check_items(ds, first[:CHECKED], items) if "in-process" in args.only else []
            rounds.append(got)
    if payload["len_megatron"] != len(ds):
        problems.append(f"length {len(ds)} vs megatron-core {payload['len_megatron']}")
    info = {"prefix": prefix, "tf": tf, "len": len(ds), "regimes": regimes, "cold": how, "loader_samples": n_loader}
    return rounds, problems, info


def report(args, rounds: list[dict], problems: list[str], info: dict) -> None:
    """Print the tables: rates, goals and diagnostics per regime, then the variants."""
    mb = args.micro_batch

    def med(what, side, variant, regime, key="rate"):
        return median([r[(what, side, variant)][regime][key] for r in rounds
                       if (what, side, variant) in r and regime in r[(what, side, variant)]])

    size = Path(info["prefix"] + ".bin").stat().st_size
    print(f"file: {info['prefix']} ({size / 1e9:.2f} GB .bin, {info['tf'].num_sequences:,} documents), S={SEQ}, "
          f"micro-batch {mb}, {info['len']:,} samples in the split; per pass {args.samples:,} in-process reads, "
          f"{info['loader_samples']:,} DataLoader samples; {args.cold_samples:,} samples per cold pass; "
          f"median of {args.rounds} rounds, each side a fresh process, sides alternating; nproc {os.cpu_count()}; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    if not info["cold"]:
        print("cold page cache: not measured (--no-cold, or dropping the page cache is not permitted here)")
    elif info["cold"] == "fadvise":
        print("cold page cache: /proc/sys/vm/drop_caches is refused here, so each cold pass evicts the token "
              "file and both index caches with posix_fadvise(DONTNEED) instead (in a fresh process per side)")
    for regime in info["regimes"]:
        name = REGIME_NAMES[regime]
        rows = []
        for what in WHATS:
            t, m = med(what, "tokenload", "mmap", regime), med(what, "megatron", "mmap", regime)
            rows.append([what, f"{t:,.0f}", f"{m:,.0f}", f"{t / m:.1f}x"])
        c = med("in-process", "ceiling", "mmap", regime)
        rows.append(["NumPy ceiling (stacked slices, in-process)", f"{c:,.0f}", "-", "-"])
        c_spans = med("in-process", "ceiling", "spans", regime)
        rows.append(["NumPy over the same document pieces (concatenated, in-process)", f"{c_spans:,.0f}", "-", "-"])
        print(f"\n### {name}\n")
        print(table(rows, ["samples/s", "tokenload", "megatron-core", "ratio"]))
        tl = {w: med(w, "tokenload", "mmap", regime) for w in WHATS}
        mc = {w: med(w, "megatron", "mmap", regime) for w in WHATS}
        cpu_t = {w: med(w, "tokenload", "mmap", regime, "cpu_us") for w in WHATS}
        cpu_m = {w: med(w, "megatron", "mmap", regime, "cpu_us") for w in WHATS}
        cpu_c = {v: med("in-process", "ceiling", v, regime, "cpu_us") for v in ("mmap", "spans")}
        goals = [
            ("in-process vs megatron-core per-item reads", tl["in-process"] / mc["in-process"],
             cpu_m["in-process"] / cpu_t["in-process"], 10.0),
            ("in-process vs NumPy stacked-slices ceiling", tl["in-process"] / c, cpu_c["mmap"] / cpu_t["in-process"], 0.75),
            ("  (vs NumPy over the same document pieces: same faults, no fields)", tl["in-process"] / c_spans,
             cpu_c["spans"] / cpu_t["in-process"], 0.75),
            ("2 workers vs 0 workers", tl["loader-2"] / tl["loader-0"], None, 1.0),
            ("2 workers vs megatron-core DataLoader, 2 workers", tl["loader-2"] / mc["loader-2"],
             cpu_m["loader-2"] / cpu_t["loader-2"], 20.0),
        ]
        print("\n" + table([[g, f"{v:.2f}", "-" if cv is None else f"{cv:.2f}", f">= {bar:g}",
                             "met" if v >= bar else "NOT met"] for g, v, cv, bar in goals],
                           [f"goal, {name}", "measured (samples/s)", "by CPU time per batch", "bar", "verdict"]))
        diag = []
        for what in WHATS:
            for side, v in (("tokenload", "mmap"), ("megatron", "mmap"), ("ceiling", "mmap"), ("ceiling", "spans")):
                if side == "ceiling" and what != "in-process":
                    continue
                label = side if side != "ceiling" else f"NumPy {'slices' if v == 'mmap' else 'pieces'}"
                diag.append([what, label] + [f"{med(what, side, v, regime, k):,.1f}"
                                             for k in ("cpu_us", "minflt", "majflt", "vcsw", "ivcsw")])
        print("\n" + table(diag, ["per micro-batch (process + workers)", "side", "CPU us", "minor faults",
                                  "major faults", "voluntary cs", "involuntary cs"]))
    if args.baseline_src:
        print(f"\n### tokenload before (`{args.baseline_src}`) and after (this checkout), same indices, same rounds\n")
        rows = []
        for regime in info["regimes"]:
            for what in WHATS:
                b, a = med(what, "tokenload-base", "mmap", regime), med(what, "tokenload", "mmap", regime)
                cb, ca = (med(what, s, "mmap", regime, "cpu_us") for s in ("tokenload-base", "tokenload"))
                rows.append([regime, what, f"{b:,.0f}", f"{a:,.0f}", f"{a / b:.2f}x", f"{cb:,.0f}", f"{ca:,.0f}",
                             f"{cb / ca:.2f}x"])
        print(table(rows, ["regime", "what", "before samples/s", "after samples/s", "speed-up",
                           "before CPU us/batch", "after CPU us/batch", "CPU saved (before/after)"]))
    if args.variants:
        print("\n### read-path ideas (tokenload only, prototyped in benchmarks/prototypes.py)\n")
        rows = []
        for what, names in (("in-process", IN_PROCESS_VARIANTS), ("loader-2", WORKER_VARIANTS)):
            for v in ("mmap",) + tuple(n for n in names if n in args.variants):
                cells = [what, v]
                for regime in info["regimes"]:
                    rate = med(what, "tokenload", v, regime)
                    base = med(what, "tokenload", "mmap", regime)
                    cells += [f"{rate:,.0f} ({rate / base:.2f}x)",
                              f"{med(what, 'tokenload', v, regime, 'cpu_us'):,.0f} / "
                              f"{med(what, 'tokenload', v, regime, 'minflt'):,.1f}"]
                rows.append(cells)
        header = ["where", "variant"]
        for regime in info["regimes"]:
            header += [f"{regime}: samples/s (vs mmap)", f"{regime}: CPU us / minor faults per batch"]
        print(table(rows, header))
        print("\n" + "\n".join(f"- {k}: {v}" for k, v in VARIANTS.items() if k == "mmap" or k in args.variants))
    print(f"\nitems of {CHECKED} indices equal to megatron-core's ({', '.join(FIELDS)}): "
          f"{'yes' if not problems else 'NO: ' + ', '.join(problems)}")
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
