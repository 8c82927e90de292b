"""Many small prefixes (issue 27): 100, 1,000 and 10,000 prefixes, per build policy, side by side
with megatron-core's default and fast paths; the cost per prefix should stay flat.

Usage:
    python benchmarks/prefixes.py                                   # 100,1000,10000 prefixes
    python benchmarks/prefixes.py --prefixes 100,1000 --rounds 3 --passes time,count
    MEGATRON_PYTHON=/tmp/megatron-venv-27/bin/python python benchmarks/prefixes.py ...

Data: benchmarks/startup_data.py's blends (real ``.idx`` files over sparse ``.bin`` files,
lognormal documents of mean ~600 tokens, weights = token counts) of ``--docs-per-prefix``
documents per prefix (default 200: a 120k-token, 240 KB prefix), so the work per prefix is the
same at every prefix count. S = 2048, split "80,20,0" (``--split``; under "90,10,0" one of
10,000 prefixes has a valid split of 1,946 tokens, under one sample, which the computed order
refuses), sizes scaled with the documents as benchmarks/startup.py scales them.

Sides (one rank each; benchmarks/startup.py's machinery, worker benchmarks/prefixes_worker.py):

* ``mcore-default``: megatron-core 0.19.2's builder on an empty cache (builds and writes it);
* ``mcore-default-nommap`` / ``mcore-fast-nommap``: the same with ``mmap_bin_files=False``
  (megatron-core's default maps each ``.bin`` and keeps it open: 3 descriptors per prefix, so
  10,000 prefixes need more than 30,000 open files; with it off, one per prefix);
* ``mcore-fast``: its fast path (``fast_cache_load`` + ``defer_npy_index_mmap`` + sequences
  JSON) on a cache prepared first;
* ``tl-auto-empty``: tokenload, ``build_policy="auto"``, empty cache (builds and writes it);
* ``tl-auto-warm``: tokenload, ``build_policy="auto"`` on the prepared cache (a hit);
* ``tl-none-seq``: tokenload, ``build_policy="none"`` on a prepared cache, with the sequences JSON;
* ``tl-computed``: tokenload's computed order (nothing built, nothing cached).

Per side: seconds from the build call to the first item (median of ``--rounds``, and the spread),
CPU seconds of that phase, the rank's open file descriptors after the first item, its RSS and
peak RSS, and (``count`` pass, strace) the opens, path stats and other metadata calls on the data
folder. Then the CLI's ``prepare-cache`` (one process, empty cache) and ``sequences`` on the same
blend: wall, CPU and peak RSS. Every figure is also given per prefix; the last table compares
the cost per prefix at the largest prefix count with that at the smallest.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import startup  # noqa: E402
from common import table  # noqa: E402
from startup import SIDES, Bench, Side  # noqa: E402
from startup_data import make_blend  # noqa: E402

HERE = Path(__file__).resolve().parent
startup.WORKER = str(HERE / "prefixes_worker.py")
SIDES["tl-computed"] = Side("tl-computed", "tokenload", "empty", policy="computed")
# megatron-core with mmap_bin_files=False (--no-mmap-bin-files): one descriptor per prefix, not
# three, so that 10,000 prefixes fit under a limit of 20,000 open files.
SIDES["mcore-default-nommap"] = Side("mcore-default-nommap", "megatron", "empty")
SIDES["mcore-fast-nommap"] = Side(
    "mcore-fast-nommap", "megatron", "warm", mode="fast", sequences=True
)
DEFAULT_SIDES = (
    "mcore-default",
    "mcore-fast",
    "tl-auto-empty",
    "tl-auto-warm",
    "tl-none-seq",
    "tl-computed",
)
CLI = [sys.executable, "-m", "tokenload.cli.main"]


def spread(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} ({min(values):.2f}-{max(values):.2f})"


class PrefixBench(Bench):
    """startup.py's Bench, passing ``mmap_bin_files=False`` to the ``-nommap`` sides."""

    def spec(self, side: Side, cache: str, record: str, sequences: str | None) -> dict:
        out = super().spec(side, cache, record, sequences)
        if side.name.endswith("-nommap"):
            out["mmap_bin_files"] = False
        return out


def source_state() -> str:
    """The commit measured, and whether src/ had uncommitted changes (a shared tree)."""
    root = HERE.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--short", "--", "src"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except OSError as e:
        return f"git: {e}"
    return f"commit {head}" + (
        f", src/ modified: {dirty.splitlines()}" if dirty else ", src/ clean"
    )


def run_cli(args: list[str]) -> dict:
    """Wall, CPU and peak RSS of one CLI process."""
    t = time.time()
    proc = subprocess.Popen(
        CLI + args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    out, err = proc.communicate()
    wall = time.time() - t
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # cumulative: differences taken below
    return {
        "rc": proc.returncode,
        "wall_s": wall,
        "cpu_total": usage.ru_utime + usage.ru_stime,
        "stderr": err.decode()[-500:],
    }


def cli_costs(blend: dict, work: Path, sizes: list[int]) -> dict:
    data_args = work / "data-args.txt"
    data_args.write_text(" ".join(f"{w} {p}" for w, p in zip(blend["weights"], blend["prefixes"])))
    out = {}
    cache = work / "cli-cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    seq = work / "cli-sequences.json"
    seq.unlink(missing_ok=True)
    jobs = {
        "sequences": [
            "sequences",
            "--data-args-path",
            str(data_args),
            "--per-dataset-sequences-path",
            str(seq),
        ],
        "prepare-cache": [
            "prepare-cache",
            "--data-args-path",
            str(data_args),
            "--split",
            startup.SPLIT,
            "--seq-length",
            str(startup.SEQ),
            "--seed",
            str(startup.SEED),
            "--data-cache-path",
            str(cache),
            "--train-valid-test-num-samples",
            *map(str, sizes),
        ],
    }
    for name, args in jobs.items():
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        got = run_cli(args)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        got["cpu_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        got["maxrss_mb"] = after.ru_maxrss / 1024  # the largest child so far (reported as such)
        out[name] = got
    shutil.rmtree(cache, ignore_errors=True)
    return out


def side_rows(bench: Bench, side: Side, rounds: int, count: bool, ranks: int = 1) -> list[dict]:
    """One row per rank (rank 0 named as the side; the others ``SIDE rK``): with more than one
    rank, the non-builders (megatron-core's ranks that wait at its barriers and then load, or
    ``auto``'s ranks that build in memory) are measured too."""
    timed = [bench.run(side, ranks, traced=False) for _ in range(rounds)]
    counted = bench.run(side, ranks, traced=True) if count else None
    rows = []
    for k in range(ranks):
        recs = [t[k] for t in timed]
        ok = [r for r in recs if "error" not in r]
        name = side.name if k == 0 else f"{side.name} r{k}"
        row = {"side": name, "errors": [r["error"] for r in recs if "error" in r][:1]}
        if ok:
            row["data_s"] = [r["data_s"] for r in ok]
            row["cpu_s"] = [r["data_cpu_s"] for r in ok]
            row["fds"] = [r["result"]["fds"] for r in ok]
            row["rss_mb"] = [r["result"]["rss_kb"] / 1024 for r in ok]
            row["hwm_mb"] = [r["result"]["hwm_kb"] / 1024 for r in ok]
            row["rchar_mb"] = [r["io"]["rchar"] / 1e6 for r in ok]
        c = counted[k] if counted else None
        if c and "error" not in c and c.get("trace"):
            t = c["trace"]
            for key in ("opens", "stats", "other_meta"):
                row[key] = t.get(key, 0)
            row["maps"], row["fstats"] = t.get("maps", 0), t.get("fstats", 0)
            row["bytes_read"] = t.get("bytes_read", 0)
            row["bytes_written"] = t.get("bytes_written", 0)
        rows.append(row)
    return rows


def print_prefix_table(prefixes: int, rows: list[dict], cli: dict) -> None:
    out = []
    for r in rows:
        if "data_s" not in r:
            why = r["errors"][0][:100] if r["errors"] else "?"
            out.append([r["side"], f"FAILED: {why}"] + [""] * 8)
            continue
        med = statistics.median(r["data_s"])
        out.append(
            [
                r["side"],
                spread(r["data_s"]),
                f"{med / prefixes * 1e3:.2f}",
                spread(r["cpu_s"]),
                f"{statistics.median(r['fds']):.0f}",
                f"{statistics.median(r['rss_mb']):.0f} / {statistics.median(r['hwm_mb']):.0f}",
                str(r.get("opens", "-")),
                str(r.get("stats", "-")),
                str(r.get("other_meta", "-")),
                f"{r['bytes_written'] / 1e6:.1f}" if "bytes_written" in r else "-",
            ]
        )
    for name, got in cli.items():
        out.append(
            [
                f"CLI {name}",
                f"{got['wall_s']:.2f}",
                f"{got['wall_s'] / prefixes * 1e3:.2f}",
                f"{got['cpu_s']:.2f}",
                "-",
                f"(max child {got['maxrss_mb']:.0f})",
                "-",
                "-",
                "-",
                "-" if got["rc"] == 0 else f"rc {got['rc']}: {got['stderr'][-80:]}",
            ]
        )
    print(f"\n{prefixes} prefixes (one rank):")
    print(
        table(
            out,
            [
                "side",
                "first item s (median, range)",
                "ms per prefix",
                "CPU s",
                "open fds",
                "RSS / peak MB",
                "opens",
                "path stats",
                "other meta",
                "MB written",
            ],
        )
    )


def per_prefix(row: dict, prefixes: int) -> dict:
    """A side's load-independent and timed figures per prefix (ops, CPU ms, first item ms, fds)."""
    out = {
        "first_ms": statistics.median(row["data_s"]) / prefixes * 1e3,
        "cpu_ms": statistics.median(row["cpu_s"]) / prefixes * 1e3,
        "fds": statistics.median(row["fds"]),  # in all: the base process holds ~4-20
        "rss_mb": statistics.median(row["rss_mb"]),  # in all: megatron-core's base is ~450 MB
    }
    if "opens" in row:
        out["ops"] = (row["opens"] + row["stats"] + row["other_meta"]) / prefixes
    return out


def print_growth(results: dict) -> None:
    """Cost per prefix of every side at every prefix count it ran at (smallest to largest)."""
    counts = sorted(int(p) for p in results)
    if len(counts) < 2:
        return
    names: list[str] = []
    for p in counts:
        names += [r["side"] for r in results[str(p)]["sides"] if r["side"] not in names]
    rows = []
    for name in names:
        got = []
        for p in counts:
            r = next((r for r in results[str(p)]["sides"] if r["side"] == name), None)
            if r is not None and "data_s" in r:
                got.append((p, per_prefix(r, p)))
            elif r is not None:
                got.append((p, None))
        ok = [g for _, g in got if g]

        def chain(key: str, digits: int = 2, got=got) -> str:
            return " -> ".join(
                "failed" if g is None else ("-" if key not in g else f"{g[key]:.{digits}f}")
                for _, g in got
            )

        growth = "-"
        if len(ok) >= 2:
            growth = f"{ok[-1]['cpu_ms'] / ok[0]['cpu_ms']:.2f}x"
        rows.append(
            [
                name,
                " -> ".join(f"{p:,}" for p, _ in got),
                chain("ops"),
                chain("cpu_ms"),
                growth,
                chain("first_ms"),
                chain("fds", 0),
                chain("rss_mb", 0),
            ]
        )
    for name in ("prepare-cache", "sequences"):
        got = [(p, results[str(p)]["cli"].get(name)) for p in counts]
        got = [(p, g) for p, g in got if g]
        if len(got) >= 2:
            rows.append(
                [
                    f"CLI {name}",
                    " -> ".join(f"{p:,}" for p, _ in got),
                    "-",
                    " -> ".join(f"{g['cpu_s'] / p * 1e3:.2f}" for p, g in got),
                    f"{(got[-1][1]['cpu_s'] / got[-1][0]) / (got[0][1]['cpu_s'] / got[0][0]):.2f}x",
                    " -> ".join(f"{g['wall_s'] / p * 1e3:.2f}" for p, g in got),
                    "-",
                    "-",
                ]
            )
    print("\ncost per prefix, smallest to largest blend:")
    print(
        table(
            rows,
            [
                "side",
                "prefixes",
                "metadata ops per prefix",
                "CPU ms per prefix",
                "CPU growth",
                "first item ms per prefix",
                "open fds (all)",
                "RSS MB (all)",
            ],
        )
    )


def combine(paths: list[str]) -> dict:
    """The ``--out`` files of several runs as one result (a later file's side replaces)."""
    results: dict = {}
    for path in paths:
        for p, got in json.loads(Path(path).read_text()).items():
            into = results.setdefault(p, {"sides": [], "cli": {}, "loads": []})
            for row in got["sides"]:
                into["sides"] = [r for r in into["sides"] if r["side"] != row["side"]] + [row]
            into["cli"].update(got.get("cli", {}))
            into["loads"].append(got.get("load"))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--data-dir", default=os.path.join(tempfile.gettempdir(), "tokenload-bench", "prefixes")
    )
    ap.add_argument("--prefixes", default="100,1000,10000")
    ap.add_argument("--docs-per-prefix", type=int, default=200)
    ap.add_argument(
        "--split",
        default="80,20,0",
        help="the blend's split (80,20,0: every prefix's valid split holds at least "
        "two samples at 200 documents per prefix up to 10,000 prefixes)",
    )
    ap.add_argument("--sides", default=",".join(DEFAULT_SIDES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--ranks", type=int, default=1, help="ranks per run, started together (torchrun's way)"
    )
    ap.add_argument("--passes", default="time,count", help="time, or time,count (strace)")
    ap.add_argument("--no-cli", action="store_true", help="skip prepare-cache / sequences")
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--out", help="every record as JSON")
    ap.add_argument(
        "--combine", nargs="+", metavar="JSON", help="print the tables of earlier --out files"
    )
    args = ap.parse_args()
    if args.combine:
        results = combine(args.combine)
        for p in sorted(results, key=int):
            print(f"\n[{p} prefixes: load average at the end of each run {results[p]['loads']}]")
            print_prefix_table(int(p), results[p]["sides"], results[p]["cli"])
        print_growth(results)
        return
    sides = [SIDES[n] for n in args.sides.split(",")]
    startup.SPLIT = args.split
    count = "count" in args.passes
    results = {}
    print(
        f"load average at start: {os.getloadavg()}; {os.cpu_count()} CPUs; "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {source_state()}",
        flush=True,
    )
    for prefixes in (int(p) for p in args.prefixes.split(",")):
        docs = prefixes * args.docs_per_prefix
        t = time.time()
        blend = make_blend(args.data_dir, prefixes, docs)
        scale = docs / startup.FULL_DOCS
        sizes = [max(int(round(n * scale)), 1) for n in startup.FULL_SIZES]
        print(
            f"[{prefixes} prefixes, {docs:,} documents, {blend['tokens']:,} tokens, "
            f"sizes {sizes}: "
            f"data made/reused in {time.time() - t:.1f} s]",
            flush=True,
        )
        bench_args = argparse.Namespace(
            data_dir=args.data_dir,
            timeout=args.timeout,
            keep_logs=False,
            one_at_a_time=False,
            pg="needed",
            sizes=sizes,
        )
        bench = PrefixBench(bench_args, blend)
        # Caches prepared under one split are never reused under another.
        bench.work = bench.work.with_name(f"{bench.work.name}_split{args.split.replace(',', '-')}")
        rows = []
        for side in sides:
            t = time.time()
            rows += side_rows(bench, side, args.rounds, count, args.ranks)
            load = os.getloadavg()[0]
            print(f"  [{side.name}: {time.time() - t:.0f} s; load {load:.1f}]", flush=True)
        cli = {} if args.no_cli else cli_costs(blend, bench.work, sizes)
        results[str(prefixes)] = {
            "sides": rows,
            "cli": cli,
            "sizes": sizes,
            "load": os.getloadavg(),
        }
        print_prefix_table(prefixes, rows, cli)
    print_growth(results)
    print(f"load average at end: {os.getloadavg()}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
