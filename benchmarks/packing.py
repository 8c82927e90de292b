"""Packed rows of whole documents (issue 33's goals), side by side in one run on the same documents.

Usage:
    python benchmarks/packing.py [--parts padding peers plan read] [--docs 200000]
                                 [--seqs 2048 8192] [--blocks 0 16384] [--grain-bins 16 256]
                                 [--plan-docs 100000000] [--rounds 1] [--out FILE.json]

Documents (benchmarks/packing_data.py, made once in ``--data-dir``): ``stdlib``, the Python
standard library's sources (``tokenload corpus``) tokenized by ``tokenload preprocess`` with a
32k BPE trained in-process, and ``web``, ``--docs`` documents of lognormal lengths (median 400
tokens, a tail past 50k). Every document ends with the EOD id.

Parts:

* ``padding``: per mix and S, the padding share, the documents cut (all, and of <= S tokens: the
  goal is 0) and documents per row, for concatenation (Megatron's windows over the documents in a
  seeded random order) and for tokenload's best-fit packing (``pack_block`` over the documents in
  blocks of ``--blocks`` documents; 0: the whole file as one block). Goal: padding <= 1%, 0 short
  documents cut.
* ``peers``: each side in a fresh process on the same token file (benchmarks/packing_sides.py):
  tokenload (rows of S + 1 slots, Megatron's ``add_extra_token``; and ``tokenload S slots``,
  ``add_extra_token=False``: rows of S slots, the peers' width), OLMo-core 3.0's ``NumpyPackedFSLDataset`` (``fragment`` and ``truncate``) and Grain
  0.2.18's ``BestFitPackIterDataset`` (``--grain-bins`` open rows), run with the peers' venv
  (``PEERS_PYTHON``, default ``/tmp/peers-venv/bin/python``: ``python3 -m venv /tmp/peers-venv &&
  /tmp/peers-venv/bin/pip install torch==2.13.0 ai2-olmo-core==3.0.0 grain==0.2.18``; never a
  project dependency). Per side: padding, cut documents (from the rows it made, by the same
  metrics), time from the process's start to its first micro-batch of 16 rows, and the peak RSS
  of the process and its children (``os.wait4``'s ``ru_maxrss``: OLMo-core packs in a process
  pool). Sides alternate their order per round; cells are the median of ``--rounds``.
* ``plan``: ``pack_block``'s own throughput (documents per second) on ``--plan-docs`` lognormal
  lengths (the web mix's law) in blocks of ``--blocks`` documents, S = 2048; and, once
  ``MegatronDataConfig(packing="best-fit")`` is accepted, the computed order's startup (a fresh
  process's build and first micro-batch) at ``--docs`` and 5M documents and a resume near the end
  of a 5M-document epoch, and the Megatron order's packed index build against today's
  concatenated build (``--build-docs``; benchmarks/index_scale.py's data and measure).
* ``read``: once packing is accepted, the loader's first-pass samples/s (a fresh process, fresh
  random samples) with packing against concatenation on the same web file, computed order
  (``--read-orders``: and the Megatron order, its index caches built before the pass), 0 and
  2 workers, in two regimes (``--read-cache``): ``cold``, the file out of the page cache as each
  side starts (``drop_caches`` as root, else ``posix_fadvise`` DONTNEED: the first epoch users
  read), and ``warm``, the file in the page cache (benchmarks/loader.py's first pass).

The machine is shared (2 cores): each part prints the load average next to its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import table
from packing_data import (
    VOCAB,
    Rows,
    concat_rows,
    document_lengths,
    eod_id,
    join,
    load_label,
    make_stdlib,
    make_web,
    metrics,
    plan_rows,
    web_lengths,
)
from packing_sides import COMPUTED_START, GRAIN, MEGATRON_BUILD, OLMO, OURS, READ

PEERS_PYTHON = os.environ.get("PEERS_PYTHON", "/tmp/peers-venv/bin/python")
MICRO_BATCH = 16


def packing_accepted() -> bool:
    """Whether this tree's ``MegatronDataConfig`` takes ``packing="best-fit"``."""
    from tokenload.datasets import MegatronDataConfig

    if "packing" not in getattr(MegatronDataConfig, "__dataclass_fields__", {}):
        return False
    try:
        from tokenload.datasets.config import PACKINGS
    except ImportError:
        return True
    return "best-fit" in PACKINGS


def ours_rows(lengths: np.ndarray, seq: int, block: int) -> Rows:
    """tokenload's packed rows of the documents, in blocks of ``block`` (0: one block)."""
    from tokenload.index.packing import pack_block

    block = block or lengths.size
    parts = []
    for b in range(0, lengths.size, block):
        plan = pack_block(lengths[b : b + block], seq + 1, extra=1)
        parts.append(plan_rows(plan, np.arange(b, min(b + block, lengths.size))))
    return join(parts)


def rounded(v):
    return round(v, 3) if isinstance(v, float) else v


def pct(x: float) -> str:
    return f"{100 * x:.3f}%"


def metric_cells(m: dict) -> list:
    return [
        f"{m['rows']:,}",
        pct(m["padding"]),
        f"{m['cut']:,}",
        f"{m['short_cut']:,}",
        f"{m['long_docs']:,}",
        f"{m['dropped_tokens']:,}",
        f"{m['docs_per_row_p50']:g} / {m['docs_per_row_p99']:g}",
        f"{m['incomplete_docs']:,}",
    ]


METRIC_HEADER = [
    "rows",
    "padding",
    "docs cut",
    "docs <= S cut",
    "docs > S",
    "tokens dropped",
    "docs per row p50 / p99",
    "docs not wholly held",
]


def part_padding(args, mixes: dict) -> list[dict]:
    out, rows = [], []
    for name, prefix in mixes.items():
        lengths = document_lengths(prefix)
        for seq in args.seqs:
            m = metrics(concat_rows(lengths, seq), lengths, seq)
            rows.append([name, f"{seq:,}", "concatenation (Megatron windows)", *metric_cells(m)])
            out.append({"mix": name, "seq": seq, "side": "concat", **m})
            for block in args.blocks:
                t = time.perf_counter()
                r = ours_rows(lengths, seq, block)
                secs = time.perf_counter() - t
                m = metrics(r, lengths, seq)
                label = (
                    f"tokenload best-fit, {'one block' if not block else f'blocks of {block:,}'}"
                )
                rows.append([name, f"{seq:,}", label, *metric_cells(m)])
                out.append(
                    {"mix": name, "seq": seq, "side": "ours", "block": block, "plan_s": secs, **m}
                )
    print(f"\n## padding and cut documents (load {load_label()})\n")
    print(table(rows, ["mix", "S", "side", *METRIC_HEADER]), flush=True)
    return out


def run_side(python: str, code: str, payload: dict, timeout: int = 3600) -> dict:
    """One side in a fresh process: its JSON, plus the peak RSS of it and its children."""
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        payload = {**payload, "time0": time.time()}
        proc = subprocess.Popen(
            [python, "-c", code, json.dumps(payload)],
            stdout=so,
            stderr=se,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        so.seek(0)
        se.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"side failed ({proc.returncode}):\n{se.read()[-3000:]}")
        got = json.loads(so.read().strip().splitlines()[-1])
    got["tree_maxrss_mb"] = usage.ru_maxrss / 1024
    got["load"] = os.getloadavg()[0]
    return got


def olmo_rows(npz, lengths: np.ndarray, seq: int) -> Rows:
    """OLMo-core's plan (its document-indices, instance-offsets and documents-by-instance
    arrays) as rows over our documents: its documents are fragments found by its EOS scan."""
    frags = npz["frags"].reshape(-1, 2)
    inst = npz["instances"].reshape(-1, 2)
    docs = npz["docs"]
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    pieces = frags[docs]
    # the document a fragment belongs to (empty documents share a start with the next one)
    doc = np.searchsorted(starts, pieces[:, 0], side="right") - 1
    per_row = inst[:, 1] - inst[:, 0]
    held = int((pieces[:, 1] - pieces[:, 0]).sum())
    return Rows(
        slots=seq,
        offsets=np.r_[0, np.cumsum(per_row)],
        doc=doc,
        start=pieces[:, 0] - starts[doc],
        length=pieces[:, 1] - pieces[:, 0],
        dropped=int(lengths.sum()) - held,
    )


def part_peers(args, mixes: dict, work: Path) -> list[dict]:
    have_peers = os.path.exists(PEERS_PYTHON)
    if not have_peers:
        print(f"[peers skipped: {PEERS_PYTHON} not found; see the module docstring]")
    dataset = packing_accepted()
    out, rows = [], []
    for name, prefix in mixes.items():
        lengths = document_lengths(prefix)
        eod = eod_id(prefix)
        keep_side = args.sides
        npy = work / f"{name}.npy"  # OLMo-core reads raw token arrays named .npy: the .bin's bytes
        if not npy.exists():
            npy.symlink_to(prefix + ".bin")
        offsets = work / f"{name}.offsets.npy"
        np.save(offsets, np.r_[0, np.cumsum(lengths)])
        for seq in args.seqs:
            ours = {
                "prefix": prefix,
                "block": args.peer_block,
                "dataset": dataset,
                "samples": max(int(lengths.sum()) // (seq + 1) // 2, MICRO_BATCH),
            }
            sides: dict[str, tuple[str, str, dict]] = {
                "tokenload": (sys.executable, OURS, ours),
                # rows of S slots (add_extra_token=False): the row width of OLMo-core and Grain
                "tokenload S slots": (sys.executable, OURS, {**ours, "extra": 0}),
            }
            if have_peers:
                for strategy in ("fragment", "truncate"):
                    sides[f"OLMo-core {strategy}"] = (
                        PEERS_PYTHON,
                        OLMO,
                        {"npy": str(npy), "vocab": VOCAB, "strategy": strategy},
                    )
                for bins in args.grain_bins:
                    sides[f"Grain {bins} bins"] = (
                        PEERS_PYTHON,
                        GRAIN,
                        {
                            "offsets": str(offsets),
                            "bin": prefix + ".bin",
                            "bins": bins,
                            "max_rows": args.grain_rows,
                        },
                    )
            if keep_side:
                sides = {k: v for k, v in sides.items() if k in keep_side}
            runs: dict[str, list[dict]] = {s: [] for s in sides}
            facts: dict[str, dict] = {}
            names = list(sides)
            for r in range(args.rounds):
                for side in names[r % len(names) :] + names[: r % len(names)]:
                    python, code, extra = sides[side]
                    folder = Path(tempfile.mkdtemp(prefix="side-", dir=work))
                    payload = {
                        "seq": seq,
                        "eod": eod,
                        "micro_batch": MICRO_BATCH,
                        "rows": str(folder / "rows.npz"),
                        "work": str(folder / "work"),
                        **extra,
                    }
                    got = run_side(python, code, payload)
                    runs[side].append(got)
                    print(
                        f"  {name} S={seq} round {r + 1} {side}:",
                        json.dumps({k: rounded(v) for k, v in got.items()}),
                        flush=True,
                    )
                    if side not in facts and (folder / "rows.npz").exists():
                        lens = lengths
                        with np.load(folder / "rows.npz") as npz:
                            if side.startswith("OLMo"):
                                rws = olmo_rows(npz, lengths, seq)
                            else:
                                rws = Rows(
                                    slots=int(npz["slots"]),
                                    offsets=npz["offsets"],
                                    doc=npz["doc"],
                                    start=npz["start"],
                                    length=npz["length"],
                                )
                                seen = np.unique(rws.doc)  # Grain's first rows: their documents
                                rws.dropped = int(lengths[seen].sum()) - covered_tokens(rws)
                                if got.get("whole_epoch") is False:
                                    keep = np.zeros(lengths.size, bool)
                                    keep[seen] = True
                                    rws, lens = restrict(rws, keep), lengths[keep]
                        facts[side] = metrics(rws, lens, seq)
                    subprocess.run(["rm", "-rf", str(folder)], check=False)
            for side in names:
                got = runs[side]
                m = facts.get(side)
                first = statistics.median(g["first_s"] for g in got)
                data = statistics.median(g["pack_s"] for g in got)
                own = statistics.median(g["rss_first_mb"][0] for g in got)
                child = statistics.median(g["rss_first_mb"][1] for g in got)
                cells = [
                    f"{m['rows']:,} ({m['rows_over_floor']:+,})",
                    f"{m['inputs_per_token']:.6f}",
                    pct(m["padding"]),
                    f"{100 * m['padded_inputs']:.4f}%",
                    f"{100 * m['masked_labels']:.4f}%",
                    f"{m['cut']:,}",
                    f"{m['short_cut']:,}",
                    f"{m['dropped_tokens']:,}",
                ]
                if got[0].get("whole_epoch") is False:
                    # a prefix of the stream: the long documents it began are not finished, so
                    # cuts and drops are not the epoch's (Grain cuts every document > S, by the
                    # split it needs, and drops nothing); the per-row measures are of those rows
                    cells[1] = "-"  # a prefix of the documents: not the epoch's cost
                    cells[2] += f" (first {got[0]['rows_read']:,} rows)"
                    cells[5] = f"{m['cut']:,} in those rows"
                    cells[7] = "-"
                rows.append(
                    [
                        name,
                        f"{seq:,}",
                        side,
                        *cells,
                        f"{first:.2f}",
                        f"{data:.2f}",
                        f"{own:,.0f} / {child:,.0f}",
                        f"{statistics.median(g['load'] for g in got):.1f}",
                    ]
                )
                out.append({"mix": name, "seq": seq, "side": side, "runs": got, "metrics": m})
    print(f"\n## against the peers (load {load_label()})\n")
    print(
        table(
            rows,
            [
                "mix",
                "S",
                "side",
                "rows (over the fewest that hold its pieces)",
                "input positions per document token (rows x S / tokens)",
                "padding (empty slots of the side's own slots)",
                "padded input positions (of rows x S)",
                "masked label positions (loss_mask 0, of rows x S: loader.metrics()'s padding)",
                "docs cut",
                "docs <= S cut",
                "tokens dropped",
                "first micro-batch s (process start)",
                "of which plan + read s (imports excluded)",
                "peak RSS MB at the first micro-batch (process / largest child)",
                "load",
            ],
        ),
        flush=True,
    )
    return out


def restrict(rows: Rows, keep: np.ndarray) -> Rows:
    """The rows as they are, their documents renumbered to those ``keep`` marks (so that the
    metrics count only documents the rows hold some of: a prefix of Grain's stream)."""
    new = np.cumsum(keep) - 1
    return Rows(
        slots=rows.slots,
        offsets=rows.offsets,
        doc=new[rows.doc],
        start=rows.start,
        length=rows.length,
        dropped=rows.dropped,
    )


def covered_tokens(rows: Rows) -> int:
    """Distinct document tokens the rows hold (pieces of a document may overlap)."""
    order = np.lexsort((rows.start, rows.doc))
    d, s = rows.doc[order], rows.start[order]
    e = s + rows.length[order]
    if not d.size:
        return 0
    prev_same = np.r_[False, d[1:] == d[:-1]]
    prev_e = np.r_[0, e[:-1]]
    overlap = np.where(prev_same, np.clip(prev_e - s, 0, None), 0)
    return int((e - s).sum() - overlap.sum())


def part_plan(args) -> list[dict]:
    from tokenload.index.packing import pack_block

    out, rows = [], []
    lengths = web_lengths(args.plan_docs if args.plan_blocks else 0, seed=7)
    for block in args.plan_blocks:
        size = block or lengths.size
        seq = 2048
        t = time.perf_counter()
        c0 = time.process_time()
        n = 0
        deadline = t + args.plan_seconds
        for b in range(0, lengths.size, size):
            pack_block(lengths[b : b + size], seq + 1, extra=1)
            n += min(size, lengths.size - b)
            if time.perf_counter() > deadline:
                break
        wall, cpu = time.perf_counter() - t, time.process_time() - c0
        rows.append(
            [
                f"{size:,}",
                f"{seq:,}",
                f"{n:,}",
                f"{wall:.1f}",
                f"{cpu:.1f}",
                f"{n / wall:,.0f}",
                f"{n / cpu:,.0f}",
                f"{args.plan_docs / n * cpu:,.0f}",
                f"{os.getloadavg()[0]:.1f}",
            ]
        )
        out.append({"block": size, "seq": seq, "docs": n, "wall_s": wall, "cpu_s": cpu})
    print(f"\n## pack_block throughput, web-mix lengths (load {load_label()})\n")
    print(
        table(
            rows,
            [
                "block (documents)",
                "S",
                "documents packed",
                "wall s",
                "CPU s",
                "documents/s (wall)",
                "documents/s (CPU)",
                f"projected CPU s for {args.plan_docs:,}",
                "load",
            ],
        ),
        flush=True,
    )
    del lengths
    if not packing_accepted():
        print(
            "\n[computed-order startup/resume and the Megatron-order packed build: not run, "
            "MegatronDataConfig does not accept packing='best-fit' in this tree]"
        )
        return out
    return out + part_startup(args) + part_build(args)


def blend_prefix(args, docs: int) -> tuple[str, int]:
    """benchmarks/startup_data.py's one-prefix file of ``docs`` documents (made once): its
    prefix and tokens."""
    from startup_data import make_blend

    blend = make_blend(args.scale_dir, 1, docs)
    return blend["prefixes"][0], int(blend["tokens"])


def part_startup(args) -> list[dict]:
    """The computed order's start and resume in fresh processes, concatenated and packed."""
    seq = 2048
    cases = []
    for docs in args.start_docs:
        prefix, tokens = blend_prefix(args, docs)
        for at_share in (0.0, args.resume_at):
            for packing in ("concat", "best-fit"):
                cases.append((docs, at_share, packing, prefix, tokens))
    runs: dict[tuple, list[dict]] = {c[:3]: [] for c in cases}
    for r in range(args.rounds):
        for docs, at_share, packing, prefix, tokens in cases[r % 2 :] + cases[: r % 2]:
            payload = {
                "prefix": prefix,
                "seq": seq,
                "packing": packing,
                "eod": 50256,
                "samples": tokens // (seq + 1),
                "at_share": at_share,
                "micro_batch": MICRO_BATCH,
            }
            got = run_side(sys.executable, COMPUTED_START, payload)
            runs[(docs, at_share, packing)].append(got)
            print(
                f"  computed {docs:,} docs at {at_share:g} {packing}:",
                json.dumps({k: rounded(v) for k, v in got.items()}),
                flush=True,
            )
    rows, out = [], []
    for key, got in runs.items():
        docs, at_share, packing = key
        med = {k: statistics.median(g[k] for g in got) for k in ("first_s", "data_s", "build_s")}
        rows.append(
            [
                f"{docs:,}",
                "start" if not at_share else f"resume at row {got[0]['at']:,}",
                packing,
                f"{med['first_s']:.2f}",
                f"{med['data_s']:.3f}",
                f"{med['build_s']:.3f}",
                f"{statistics.median(g['rss_first_mb'][0] for g in got):,.0f}",
                f"{statistics.median(g['load'] for g in got):.1f}",
            ]
        )
        out.append({"docs": docs, "at_share": at_share, "packing": packing, "runs": got})
    print(
        f"\n## computed order: start and resume, S = {seq} (load {load_label()}; "
        f"medians of {args.rounds})\n"
    )
    print(
        table(
            rows,
            [
                "documents",
                "case",
                "packing",
                "process start to first micro-batch s",
                "build + first micro-batch s",
                "of which build s",
                "peak RSS MB",
                "load",
            ],
        ),
        flush=True,
    )
    return out


def part_build(args) -> list[dict]:
    """The Megatron order's index build, packed against concatenated, one fresh process each
    on an empty cache folder (benchmarks/index_scale.py's data, request and measure)."""
    from startup import NULL_TOKENIZER

    seq = 2048
    rows, out = [], []
    for docs in args.build_docs:
        prefix, tokens = blend_prefix(args, docs)
        with open(prefix + ".idx", "rb") as f:  # both sides find the .idx in the page cache
            while f.read(64 << 20):
                pass
        runs: dict[str, list[dict]] = {"concat": [], "best-fit": []}
        for r in range(args.build_rounds):
            for packing in list(runs)[r % 2 :] + list(runs)[: r % 2]:
                cache = Path(tempfile.mkdtemp(prefix="build-", dir=args.scale_dir))
                try:
                    got = run_side(
                        sys.executable,
                        MEGATRON_BUILD,
                        {
                            "prefix": prefix,
                            "seq": seq,
                            "cache": str(cache),
                            "policy": args.build_policy,
                            "tokenizer": NULL_TOKENIZER,
                            "packing": packing,
                            "size": tokens // seq // 2,
                        },
                    )
                finally:
                    subprocess.run(["rm", "-rf", str(cache)], check=False)
                runs[packing].append(got)
                print(
                    f"  megatron build {docs:,} docs {packing}:",
                    json.dumps({k: rounded(v) for k, v in got.items()}),
                    flush=True,
                )
        for packing, got in runs.items():
            rows.append(
                [
                    f"{docs:,}",
                    packing,
                    args.build_policy,
                    f"{statistics.median(g['s'] for g in got):.1f}",
                    f"{statistics.median(g['cpu'] for g in got):.1f}",
                    f"{statistics.median(g['hwm_mb'] for g in got):,.0f}",
                    f"{got[0]['len']:,}",
                    f"{statistics.median(g['load'] for g in got):.1f}",
                ]
            )
            out.append({"docs": docs, "packing": packing, "runs": got})
    print(
        f"\n## Megatron order: index build, S = {seq}, half an epoch requested "
        f"(load {load_label()})\n"
    )
    print(
        table(
            rows,
            [
                "documents",
                "packing",
                "build_policy",
                "build s",
                "CPU s",
                "peak RSS MB",
                "samples",
                "load",
            ],
        ),
        flush=True,
    )
    return out


def part_read(args, mixes: dict) -> list[dict]:
    """The loader's first pass, packed against concatenated, on the same web file (module
    docstring): fresh processes, sides alternating per round, the file in the page cache
    (``warm``) or out of it (``cold``: evicted by each side's process before it starts)."""
    return [
        got
        for order in args.read_orders
        for cache in args.read_cache
        for got in _read_regime(args, mixes["web"], cache, order)
    ]


def _read_regime(args, prefix: str, cache: str, order: str = "computed") -> list[dict]:
    from common import PROBE, cold_method

    from tokenload.format import warmup_file

    lengths = document_lengths(prefix)
    seq = 2048
    evict = cold_method([prefix + ".bin", prefix + ".idx"]) if cache == "cold" else None
    if cache == "cold" and evict is None:
        print("  cold read regime: this machine can neither drop caches nor fadvise; skipped")
        return []
    epoch = int(lengths.sum()) // (seq + 1)
    sides = [(p, w) for w in args.read_workers for p in ("concat", "best-fit")]
    runs: dict[tuple, list[dict]] = {s: [] for s in sides}
    rng = np.random.default_rng(5)
    for r in range(args.rounds):
        # a start of its own per round, the same for every side of the round (fresh rows)
        start = int(rng.integers(0, max(epoch - args.read_samples - 2 * MICRO_BATCH, 1)))
        start -= start % MICRO_BATCH
        for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
            packing, workers = side
            if cache == "warm":
                warmup_file(prefix + ".idx")
                warmup_file(prefix + ".bin")
            payload = {
                "cold": cache == "cold",
                "order": order,
                "index_cache": str(Path(args.data_dir) / "read-index-cache"),
                "prefix": prefix,
                "seq": seq,
                "packing": packing,
                "eod": eod_id(prefix),
                "request": epoch,
                "micro_batch": MICRO_BATCH,
                "workers": workers,
                "start": start,
                "samples": args.read_samples,
                "probe": PROBE,
            }
            got = run_side(sys.executable, READ, payload)
            runs[side].append(got)
            print(
                f"  read {cache} round {r + 1} {packing} {workers} workers from {start:,}:",
                json.dumps({k: rounded(v) for k, v in got.items()}),
                flush=True,
            )
    rows, out = [], []
    for workers in args.read_workers:
        concat, packed = runs[("concat", workers)], runs[("best-fit", workers)]
        ratio = [p["rate"] / c["rate"] for p, c in zip(packed, concat)]
        cpu = [c["cpu_us"] / p["cpu_us"] for p, c in zip(packed, concat)]
        for packing, got in (("concat", concat), ("best-fit", packed)):
            rows.append(
                [
                    f"{workers}",
                    packing,
                    f"{statistics.median(g['rate'] for g in got):,.0f}",
                    f"{statistics.median(g['cpu_us'] for g in got):,.0f}",
                    ""
                    if packing == "concat"
                    else f"{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})",
                    "" if packing == "concat" else f"{statistics.median(cpu):.2f}",
                    f"{statistics.median(g['load'] for g in got):.1f}",
                ]
            )
        sides_of = {"concat": concat, "best-fit": packed}
        out.append({"order": order, "cache": cache, "workers": workers, **sides_of})
    regime = (
        "file in the page cache"
        if cache == "warm"
        else f"file out of the page cache ({evict}) as each side starts"
    )
    print(
        f"\n## loader first pass, {order} order, S = {seq}, micro-batch {MICRO_BATCH}, "
        f"{args.read_samples:,} samples per pass, {regime} (load {load_label()}; medians of "
        f"{args.rounds})\n"
    )
    print(
        table(
            rows,
            [
                "workers",
                "packing",
                "samples/s",
                "CPU us per micro-batch",
                "best-fit / concat samples/s (per round: range)",
                "by CPU (concat CPU / best-fit CPU)",
                "load",
            ],
        ),
        flush=True,
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="/tmp/tokenload-bench/packing")
    ap.add_argument(
        "--parts",
        nargs="+",
        default=["padding", "peers", "plan", "read"],
        choices=["padding", "peers", "plan", "read"],
    )
    ap.add_argument("--mixes", nargs="+", default=["stdlib", "web"], choices=["stdlib", "web"])
    ap.add_argument("--docs", type=int, default=200_000, help="documents of the web mix")
    ap.add_argument("--seqs", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument(
        "--blocks",
        type=int,
        nargs="+",
        default=[0],
        help="pack_block's block sizes in documents (0: the whole file as one block)",
    )
    ap.add_argument(
        "--peer-block",
        type=int,
        default=0,
        help="tokenload side's block (documents) when the packed dataset is missing",
    )
    ap.add_argument("--grain-bins", type=int, nargs="+", default=[16, 256])
    ap.add_argument(
        "--grain-rows",
        type=int,
        default=5000,
        help="rows of Grain's stream its metrics count (0: the whole epoch)",
    )
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--plan-docs", type=int, default=100_000_000)
    ap.add_argument(
        "--plan-seconds",
        type=float,
        default=60.0,
        help="stop each pack_block throughput case after this long (a rate still)",
    )
    ap.add_argument(
        "--plan-blocks",
        type=int,
        nargs="*",
        default=[1 << 16, 1 << 20],
        help="pack_block's blocks for its throughput (the computed order's and the"
        " Megatron order's defaults)",
    )
    ap.add_argument("--start-docs", type=int, nargs="*", default=[200_000, 5_000_000])
    ap.add_argument(
        "--resume-at",
        type=float,
        default=0.98,
        help="the resume's row, as a share of the first epoch's rows",
    )
    ap.add_argument("--build-docs", type=int, nargs="*", default=[100_000_000])
    ap.add_argument("--build-rounds", type=int, default=1)
    ap.add_argument("--build-policy", default="auto", choices=["auto", "every-rank"])
    ap.add_argument(
        "--scale-dir",
        default="/tmp/tokenload-bench/index-scale",
        help="benchmarks/startup_data.py's files (shared with index_scale.py)",
    )
    ap.add_argument("--sides", nargs="+", help="peers part: only these sides (by table name)")
    ap.add_argument("--read-workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument(
        "--read-orders",
        nargs="+",
        default=["computed"],
        choices=["computed", "megatron"],
        help="the orders the read part measures (the Megatron order's index caches are built,"
        " untimed, in --data-dir/read-index-cache before each pass)",
    )
    ap.add_argument(
        "--read-cache",
        nargs="+",
        default=["cold", "warm"],
        choices=["cold", "warm"],
        help="the token file out of the page cache as each side starts (the first epoch users"
        " read), or in it",
    )
    ap.add_argument(
        "--read-samples",
        type=int,
        default=32768,
        help="samples per timed pass (the computed order packs a block of 131,072"
        " documents, ~60k rows at S = 2048, as reading reaches it: most passes this long"
        " pay one)",
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    print(
        f"load average at start {os.getloadavg()}; {os.cpu_count()} CPUs; "
        f"packing accepted by MegatronDataConfig: {packing_accepted()}",
        flush=True,
    )
    mixes = {}
    if "stdlib" in args.mixes:
        mixes["stdlib"] = make_stdlib(data)
    if "web" in args.mixes:
        mixes["web"] = make_web(data, args.docs)
    for name, prefix in mixes.items():
        lengths = document_lengths(prefix)
        print(
            f"{name}: {lengths.size:,} documents, {int(lengths.sum()):,} tokens, median "
            f"{np.median(lengths):.0f}, mean {lengths.mean():.0f}, max {lengths.max():,}, "
            f"> 50k: {(lengths > 50_000).sum()}",
            flush=True,
        )
    results: dict[str, object] = {}
    if "padding" in args.parts:
        results["padding"] = part_padding(args, mixes)
    if "peers" in args.parts:
        work = data / "peers-work"
        work.mkdir(exist_ok=True)
        results["peers"] = part_peers(args, mixes, work)
    if "plan" in args.parts:
        results["plan"] = part_plan(args)
    if "read" in args.parts:
        if not packing_accepted():
            print("\n[read path: not run, MegatronDataConfig does not accept packing='best-fit']")
        elif "web" in mixes:
            results["read"] = part_read(args, mixes)
    print(f"\nload average at end {os.getloadavg()}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
