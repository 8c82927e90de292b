"""Startup at scale: build policies and megatron-core's paths on 1-16 local ranks, one run.

Usage:
    python benchmarks/startup.py --quick                      # 10 prefixes, 100k documents, ranks 1,2,4
    python benchmarks/startup.py                              # 100 prefixes, 3M documents, ranks 1..16
    python benchmarks/startup.py --sides mcore-fast,tl-none --ranks 1,16 --passes count

Data (benchmarks/startup_data.py): a blend of ``--prefixes`` token files, ``--docs`` documents
in all (lognormal lengths, mean ~600 tokens), real ``.idx`` files over sparse ``.bin`` files,
weights = token counts. S=2048, seed 1234, sizes [2,000,000, 20,480, 5,120] (scaled with the
documents in --quick), split "99,1,0" (so 100 prefixes x 2 splits, as the issue's measurement).

Sides (``--sides``; each runs at every rank count of ``--ranks``):

* ``mcore-default``: megatron-core 0.19.2, ``BlendedMegatronDatasetBuilder(...).build()`` with
  gloo initialised, on an empty cache: rank 0 builds and writes, the others wait at barriers.
* ``mcore-fast`` / ``mcore-fast-noseq``: its fast path: per-split blends (which
  ``fast_cache_load`` requires: train and valid over all prefixes), a cache prepared first by one
  process without torch.distributed (what ``tools/prepare_cache.py`` does), then
  ``fast_cache_load`` + ``defer_npy_index_mmap``, with / without the per-dataset sequences JSON.
* ``tl-POLICY-STATE``: tokenload's ``build_datasets`` with ``build_policy=POLICY`` (``default``:
  the field is not passed, today's behaviour) on an ``empty`` cache or a ``warm`` one (prepared
  first by one process with the same configuration); ``tl-none-seq`` adds ``sequences_path``
  (the file ``tokenload sequences`` writes). ``tl-local-rank0`` runs as two simulated nodes
  (LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK, one cache folder per node). Sides whose policy needs a
  barrier (rank0, local-rank0) initialise gloo; the others do not unless ``--pg always``.

Each rank is a separate process started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT; OMP_NUM_THREADS=1), running
benchmarks/startup_worker.py in its side's venv. Each (side, ranks) runs twice (``--passes``):

* ``time``: no tracer. Wall times, CPU time of the data phase, /proc/self/io, the audit-hook
  count of Python-level opens, writers and collectives.
* ``count``: the same with strace attached to each rank for its data phase only
  (``strace -f -y -p PID``, benchmarks/startup_trace.py; the imports run untraced): the
  data phase's opens, stat calls (path stats; fd stats apart), bytes read and written by
  read/write syscalls (mmap page faults are not syscalls: not counted), renames, other metadata
  calls and maps, on paths under ``--data-dir`` only (token files and caches), and the files
  each process wrote. Times of this pass are not reported (the tracer slows every traced call).

Output: a table per side and rank count (median and max over ranks), the goal checks of issue 11
as PASS/FAIL with their numbers, and every record as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import MEGATRON_PYTHON, table  # noqa: E402
from startup_data import make_blend  # noqa: E402
from startup_trace import STRACE_ARGS, phase_counts  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "startup_worker.py")
TOKENLOAD_PYTHON = sys.executable
SEQ, SEED, VOCAB, SPLIT = 2048, 1234, 50257, "99,1,0"
FULL_SIZES = (2_000_000, 20_480, 5_120)
FULL_DOCS = 3_000_000
NULL_TOKENIZER = {"class": "megatron.core.tokenizers.text.models.default_tokenizer.DefaultTokenizerText",
                  "tokenizer_path": None, "vocab_size": str(VOCAB), "pad_id": "-1"}
POLICIES = ("auto", "rank0", "local-rank0", "every-rank", "none")
BARRIER_POLICIES = ("rank0", "local-rank0")


@dataclasses.dataclass(frozen=True)
class Side:
    name: str
    lib: str  # "megatron" | "tokenload"
    cache: str  # "empty" | "warm"
    mode: str = "default"  # megatron: "default" | "fast"
    policy: str | None = None  # tokenload's build_policy; "default" = not passed
    sequences: bool = False
    nodes: int = 1


SIDES = {s.name: s for s in [
    Side("mcore-default", "megatron", "empty"),
    Side("mcore-fast", "megatron", "warm", mode="fast", sequences=True),
    Side("mcore-fast-noseq", "megatron", "warm", mode="fast"),
    Side("tl-default-empty", "tokenload", "empty", policy="default"),
    Side("tl-default-warm", "tokenload", "warm", policy="default"),
    Side("tl-auto-empty", "tokenload", "empty", policy="auto"),
    Side("tl-auto-warm", "tokenload", "warm", policy="auto"),
    Side("tl-rank0", "tokenload", "empty", policy="rank0"),
    Side("tl-local-rank0", "tokenload", "empty", policy="local-rank0", nodes=2),
    Side("tl-every-rank", "tokenload", "empty", policy="every-rank"),
    Side("tl-none", "tokenload", "warm", policy="none"),
    Side("tl-none-seq", "tokenload", "warm", policy="none", sequences=True),
]}
TODAY_SIDES = ("mcore-default", "mcore-fast", "tl-default-empty", "tl-default-warm")
POLICY_SIDES = ("mcore-default", "mcore-fast", "tl-auto-empty", "tl-auto-warm",
                "tl-rank0", "tl-local-rank0", "tl-every-rank", "tl-none", "tl-none-seq")


def tokenload_features() -> dict[str, bool]:
    """Which of issue 11's config fields today's tokenload has."""
    from tokenload.datasets import MegatronDataConfig

    names = {f.name for f in dataclasses.fields(MegatronDataConfig)}
    return {"build_policy": "build_policy" in names, "sequences_path": "sequences_path" in names}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bench:
    def __init__(self, args, blend: dict) -> None:
        self.args = args
        self.blend = blend
        self.root = str(Path(args.data_dir).resolve()) + "/"
        self.work = Path(args.data_dir).resolve() / f"startup_{len(blend['prefixes'])}x{blend['documents']}"
        self.sizes = list(args.sizes)
        self.prepared: dict[str, str] = {}
        self.notes: list[str] = []

    # -- caches -------------------------------------------------------------------------------
    def spec(self, side: Side, cache: str, record: str, sequences: str | None) -> dict:
        return {
            "lib": side.lib, "mode": side.mode, "policy": side.policy, "root": self.root,
            "prefixes": self.blend["prefixes"], "weights": self.blend["weights"], "seq": SEQ,
            "seed": SEED, "vocab": VOCAB, "split": SPLIT, "sizes": self.sizes, "cache": cache,
            "per_split": side.lib == "megatron" and side.mode != "default",
            "tokenizer": NULL_TOKENIZER, "sequences_path": sequences, "record": record,
            "pg": side.lib == "megatron" or side.policy in BARRIER_POLICIES or self.args.pg == "always",
        }

    def prepare(self, side: Side) -> str:
        """The warm cache folder of ``side`` (megatron: per-split config, built once by one
        process without torch.distributed; tokenload: the run's config, one process)."""
        key = side.lib
        if key in self.prepared:
            return self.prepared[key]
        folder = self.work / f"prepared-{key}"
        done = folder / ".complete"
        if key == "tokenload" or not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            prep = dataclasses.replace(side, mode="prepare" if key == "megatron" else side.mode,
                                       policy="default" if key == "tokenload" else None)
            rec = self.work / f"prepare-{key}.json"
            spec = self.spec(prep, str(folder), str(rec), None)
            spec["pg"] = False
            spec["per_split"] = key == "megatron"
            t = time.time()
            self.launch([spec], [{}], traced=False, tag=f"prepare-{key}")
            got = json.loads(rec.read_text())
            if "error" in got:
                raise SystemExit(f"preparing the {key} cache failed: {got['error']}")
            files = list(folder.iterdir())
            print(f"[prepared {key} cache: {len(files)} files, "
                  f"{sum(f.stat().st_size for f in files) / 1e6:.0f} MB, {time.time() - t:.1f} s "
                  f"(data phase {got['data_s']:.1f} s)]", flush=True)
            done.touch()
        self.prepared[key] = str(folder)
        return str(folder)

    def sequences_file(self, side: Side) -> str | None:
        if not side.sequences:
            return None
        if side.lib == "megatron":
            return self.blend["megatron_sequences"]
        out = self.work / "sequences-tokenload.json"
        if not out.exists():
            data_path = [x for w, p in zip(self.blend["weights"], self.blend["prefixes"]) for x in (str(w), p)]
            cmd = [str(Path(TOKENLOAD_PYTHON).parent / "tokenload"), "sequences", "--data-path", *data_path,
                   "--per-dataset-sequences-path", str(out)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                # No CLI yet: the same file through the format API the CLI is built on.
                from tokenload.format import TokenFile
                from tokenload.format.sequences import counts_of, write_sequences

                write_sequences(out, {p: counts_of(TokenFile(p)) for p in self.blend["prefixes"]})
                self.notes.append(f"sequences JSON written by format.sequences.write_sequences "
                                  f"(tokenload sequences: {done.stderr.strip()[-200:]})")
        return str(out)

    # -- runs ---------------------------------------------------------------------------------
    def launch(self, specs: list[dict], envs: list[dict], traced: bool, tag: str, one_at_a_time: bool = False) -> None:
        """Start one process per spec at once (as torchrun does) and wait for all; with
        ``one_at_a_time``, each after the previous ended (same work, no CPU contention)."""
        logs = self.work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        procs = []
        for i, (spec, env) in enumerate(zip(specs, envs)):
            spec_path = logs / f"{tag}-r{i}.spec.json"
            if traced:
                spec = {**spec, "strace": STRACE_ARGS, "trace_log": str(logs / f"{tag}-r{i}.strace")}
            spec_path.write_text(json.dumps(spec))
            python = MEGATRON_PYTHON if spec["lib"] == "megatron" else TOKENLOAD_PYTHON
            cmd = [python, WORKER, str(spec_path)]
            full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **env}
            with open(logs / f"{tag}-r{i}.stderr", "w") as err:
                procs.append(subprocess.Popen(cmd, env=full_env, stdout=err, stderr=err,
                                              start_new_session=True))
            if one_at_a_time:
                procs[-1].wait(timeout=self.args.timeout)
        deadline = time.time() + self.args.timeout
        for p in procs:
            try:
                p.wait(timeout=max(deadline - time.time(), 1))
            except subprocess.TimeoutExpired:
                for q in procs:
                    if q.poll() is None:
                        os.killpg(q.pid, 9)
                for q in procs:
                    q.wait()
                break

    def run(self, side: Side, ranks: int, traced: bool) -> list[dict]:
        tag = f"{side.name}-{ranks}-{'count' if traced else 'time'}"
        run_dir = self.work / "runs" / tag
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        nodes = side.nodes if ranks >= side.nodes else 1
        per_node = ranks // nodes
        port = free_port()
        if side.cache == "warm":
            caches = [self.prepare(side)] * nodes
        else:
            caches = [str(run_dir / (f"cache-node{n}" if nodes > 1 else "cache")) for n in range(nodes)]
            for c in caches:
                Path(c).mkdir(parents=True)
        sequences = self.sequences_file(side)
        specs, envs = [], []
        for r in range(ranks):
            node = r // per_node
            specs.append(self.spec(side, caches[node], str(run_dir / f"rank{r}.json"), sequences))
            envs.append({"RANK": str(r), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(r % per_node),
                         "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(node),
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        alone = self.args.one_at_a_time and side.lib == "tokenload" and side.policy in ("none", "every-rank")
        self.launch(specs, envs, traced, tag, one_at_a_time=alone)
        records = []
        for r in range(ranks):
            path = run_dir / f"rank{r}.json"
            rec = json.loads(path.read_text()) if path.exists() else {
                "rank": r, "error": "no record (crashed or timed out): see " + str(self.work / "logs" / f"{tag}-r{r}.stderr")}
            if traced:
                log = self.work / "logs" / f"{tag}-r{r}.strace"
                rec["trace"] = phase_counts(str(log), self.root) if log.exists() else {}
                if log.exists() and not self.args.keep_logs:
                    log.unlink()
            rec["node"] = r // per_node
            records.append(rec)
        if side.cache == "empty":
            rec_files = [f for c in caches for f in Path(c).rglob("*") if f.is_file()]
            records[0]["cache_files_after"] = len(rec_files)
            records[0]["cache_bytes_after"] = sum(f.stat().st_size for f in rec_files)
            for c in caches:
                shutil.rmtree(c, ignore_errors=True)
        return records


# -- summaries ----------------------------------------------------------------------------------
def med_max(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    return statistics.median(values), max(values)


def fmt(pair: tuple[float, float], digits: int = 2) -> str:
    a, b = pair
    if a != a:
        return "-"
    if digits == 0:
        return f"{a:,.0f} / {b:,.0f}"
    return f"{a:.{digits}f} / {b:.{digits}f}"


def writers_of(records: list[dict], key: str) -> tuple[int, list[str]]:
    """How many processes wrote cache files, and the files written by more than one process
    (per node folder: the names include the folder)."""
    by_file: dict[str, set[int]] = {}
    writers = set()
    for rec in records:
        if key == "trace":
            files = rec.get("trace", {}).get("written", [])
        else:
            renamed_from = {src for src, _ in rec.get("audit_renamed", [])}
            files = [dst for _, dst in rec.get("audit_renamed", [])]
            files += [p for p in rec.get("audit_written", []) if p not in renamed_from]
        for f in files:
            by_file.setdefault(f, set()).add(rec["rank"])
        if files:
            writers.add(rec["rank"])
    return len(writers), sorted(f for f, who in by_file.items() if len(who) > 1)


def summarize(side: str, ranks: int, timed: list[dict], counted: list[dict] | None) -> dict:
    ok = [r for r in timed if "error" not in r]
    errors = [r for r in timed + (counted or []) if "error" in r]
    s: dict = {"side": side, "ranks": ranks, "errors": len(errors),
               "error": errors[0]["error"] if errors else None}
    if ok:
        startup = [r["imports_done"] - r["proc_start"] - r.get("pg_init_s", 0.0) for r in ok]
        s["data_s"] = med_max([r["data_s"] for r in ok])
        s["startup_s"] = med_max(startup)
        s["first_s"] = med_max([a + r["data_s"] for a, r in zip(startup, ok)])
        s["imports_s"] = med_max([r.get("import_torch_s", 0) + r["import_lib_s"] + r["tokenizer_s"] for r in ok])
        s["cpu_s"] = med_max([r["data_cpu_s"] for r in ok])
        s["rchar_mb"] = med_max([r["io"]["rchar"] / 1e6 for r in ok])
        s["wchar_mb"] = med_max([r["io"]["wchar"] / 1e6 for r in ok])
        s["audit_opens"] = med_max([r["audit"].get("opens", 0) for r in ok])
        s["collectives_max"] = max(sum(r["collectives"].values()) for r in ok)
        s["collectives_total"] = sum(sum(r["collectives"].values()) for r in ok)
        s["writers"], s["multi_written"] = writers_of(ok, "audit")
        s["torch_loaded"] = any(r.get("torch_loaded") for r in ok)
        s["cache_files_after"] = timed[0].get("cache_files_after")
        s["cache_bytes_after"] = timed[0].get("cache_bytes_after")
    if counted:
        good = [r for r in counted if "error" not in r and r.get("trace")]
        if good:
            t = [r["trace"] for r in good]
            for k in ("opens", "stats", "fstats", "reads", "bytes_read", "writes", "bytes_written",
                      "renames", "other_meta", "maps"):
                s[k] = med_max([x.get(k, 0) for x in t])
            s["meta_ops"] = med_max([x.get("opens", 0) + x.get("stats", 0) + x.get("other_meta", 0) for x in t])
            s["writers_traced"], s["multi_written_traced"] = writers_of(good, "trace")
            writer_ranks = {r["rank"] for r in good if r["trace"].get("written")}
            others = [r["trace"] for r in good if r["rank"] not in writer_ranks]
            s["nonwriter_meta_max"] = max((x.get("opens", 0) + x.get("stats", 0) + x.get("other_meta", 0)
                                           for x in others), default=None)
            s["nonwriter_bytes_written_max"] = max((x.get("bytes_written", 0) for x in others), default=None)
    return s


def print_tables(summaries: list[dict]) -> None:
    rows = []
    for s in summaries:
        if "data_s" not in s:
            rows.append([s["side"], s["ranks"], f"FAILED: {s['error']}"] + [""] * 10)
            continue
        writes = f"{s['writers']} ({len(s['multi_written'])} files by >1)"
        if "writers_traced" in s:
            writes = f"{s['writers_traced']} ({len(s['multi_written_traced'])} files by >1)"
        rows.append([
            s["side"], s["ranks"], fmt(s["data_s"]), fmt(s["cpu_s"]), fmt(s["first_s"]),
            fmt(s.get("opens", s["audit_opens"]), 0), fmt(s.get("stats", (float("nan"),) * 2), 0),
            fmt(s.get("fstats", (float("nan"),) * 2), 0),
            fmt(tuple(v / 1e6 for v in s["bytes_read"])) if "bytes_read" in s else "-",
            fmt(tuple(v / 1e6 for v in s["bytes_written"])) if "bytes_written" in s else "-",
            writes, f"{s['collectives_total']} (max {s['collectives_max']}/rank)",
            (f"{s['errors']} errors: {s['error'][:80]}" if s["errors"] else ""),
        ])
    print(table(rows, [
        "side", "ranks", "data phase s (med / max)", "CPU s/rank", "process start to first item s",
        "opens/rank", "stats/rank", "fstats/rank", "MB read/rank", "MB written/rank",
        "writers (processes)", "collectives", "errors"]))


def check(label: str, ok: bool | None, detail: str) -> dict:
    verdict = "n/a " if ok is None else ("PASS" if ok else "FAIL")
    print(f"  {verdict}  {label}: {detail}")
    return {"goal": label, "verdict": verdict.strip(), "detail": detail}


def goals(summaries: list[dict], prefixes: int) -> list[dict]:
    """Issue 11's goals, each PASS/FAIL (n/a where a side or rank count was not run)."""
    by = {(s["side"], s["ranks"]): s for s in summaries if "data_s" in s}
    ranks = sorted({r for _, r in by})
    out = []
    print("\ngoals (issue 11):")
    none_side = "tl-none-seq" if any(k[0] == "tl-none-seq" for k in by) else "tl-none"
    for r in ranks:
        a, b = by.get((none_side, r)), by.get(("mcore-fast", r))
        if a is None or b is None:
            continue
        if "opens" in a and "opens" in b:
            ok = a["opens"][0] <= 0.5 * b["opens"][0] and a["stats"][0] <= 0.5 * b["stats"][0]
            out.append(check(f"{none_side} vs mcore-fast, {r} ranks: <= half the opens and stats/rank", ok,
                             f"opens {a['opens'][0]:.0f} vs {b['opens'][0]:.0f}, stats {a['stats'][0]:.0f} vs {b['stats'][0]:.0f}"))
        out.append(check(f"{none_side} vs mcore-fast, {r} ranks: CPU/rank no more", a["cpu_s"][0] <= b["cpu_s"][0],
                         f"{a['cpu_s'][0]:.3f} s vs {b['cpu_s'][0]:.3f} s (median)"))
        out.append(check(f"{none_side} vs mcore-fast, {r} ranks: data phase no longer",
                         a["data_s"][1] <= b["data_s"][1],
                         f"max {a['data_s'][1]:.3f} s vs {b['data_s'][1]:.3f} s (median {a['data_s'][0]:.3f} vs {b['data_s'][0]:.3f})"))
    for r in (1, 16):
        a, b = by.get((none_side, r)), by.get(("mcore-fast", r))
        if a and b:
            out.append(check(f"process start to first item, {r} ranks: >= 3x shorter than mcore-fast",
                             a["first_s"][0] * 3 <= b["first_s"][0],
                             f"{a['first_s'][0]:.2f} s vs {b['first_s'][0]:.2f} s (median; {b['first_s'][0] / a['first_s'][0]:.1f}x)"))
    auto = "tl-auto-empty" if any(k[0] == "tl-auto-empty" for k in by) else "tl-default-empty"
    for r in ranks:
        a = by.get((auto, r))
        if a is None:
            continue
        writers = a.get("writers_traced", a["writers"])
        out.append(check(f"{auto}, {r} ranks: exactly one writer", writers == 1, f"{writers} processes wrote"))
        if a.get("nonwriter_meta_max") is not None:
            limit = 10 * prefixes
            out.append(check(f"{auto}, {r} ranks: non-writers write nothing, O(prefixes) metadata ops",
                             a["nonwriter_bytes_written_max"] == 0 and a["nonwriter_meta_max"] <= limit,
                             f"max {a['nonwriter_bytes_written_max']} bytes written, max {a['nonwriter_meta_max']} "
                             f"opens+stats+other (limit 10 per prefix = {limit})"))
        out.append(check(f"{auto}, {r} ranks: no collective storm (<= 1 per rank)", a["collectives_max"] <= 1,
                         f"{a['collectives_total']} collectives, max {a['collectives_max']} per rank"))
    a, b = by.get((auto, 2)), by.get(("mcore-default", 2))
    if a and b:
        out.append(check(f"{auto} vs mcore-default, 2 ranks: critical path no longer", a["data_s"][1] <= b["data_s"][1],
                         f"slowest rank {a['data_s'][1]:.2f} s vs {b['data_s'][1]:.2f} s"))
    top = max(ranks) if ranks else None
    for side in sorted({k[0] for k in by if k[0].startswith("tl-")}):
        a, b = by.get((side, 1)), by.get((side, top))
        if not a or not b or top == 1:
            continue
        cpu_ok = a["cpu_s"][0] <= 0 or b["cpu_s"][0] <= 1.2 * a["cpu_s"][0]
        detail = f"CPU {a['cpu_s'][0]:.3f} -> {b['cpu_s'][0]:.3f} s"
        ops_ok = True
        if "meta_ops" in a and "meta_ops" in b:
            ops_ok = b["meta_ops"][0] <= 1.2 * max(a["meta_ops"][0], 1)
            detail += f", ops {a['meta_ops'][0]:.0f} -> {b['meta_ops'][0]:.0f}"
        detail += f" (medians); wall {a['data_s'][0]:.2f} -> {b['data_s'][0]:.2f} s (reported, not judged)"
        out.append(check(f"{side}: flat from 1 to {top} ranks (<= 1.2x)", cpu_ok and ops_ok, detail))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="/tmp/tokenload-bench/startup")
    ap.add_argument("--quick", action="store_true", help="10 prefixes, 100k documents, ranks 1,2,4")
    ap.add_argument("--prefixes", type=int)
    ap.add_argument("--docs", type=int)
    ap.add_argument("--ranks", help="comma list (default 1,2,4,8,16; --quick 1,2,4)")
    ap.add_argument("--sides", help=f"comma list of {', '.join(SIDES)} (default: every side today's "
                    "tokenload supports)")
    ap.add_argument("--passes", default="time,count", help="time, count or both (count needs strace)")
    ap.add_argument("--pg", choices=("needed", "always"), default="needed",
                    help="initialise gloo for every tokenload side, not only rank0/local-rank0")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per (side, ranks) launch")
    ap.add_argument("--keep-logs", action="store_true", help="keep the strace logs")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="start the ranks of tokenload's none/every-rank sides one after another (they need no "
                         "peer): each rank's CPU without the contention of N processes on few cores")
    ap.add_argument("--out", help="write every record and summary as JSON here")
    args = ap.parse_args()
    args.prefixes = args.prefixes or (10 if args.quick else 100)
    args.docs = args.docs or (100_000 if args.quick else FULL_DOCS)
    ranks = [int(x) for x in (args.ranks or ("1,2,4" if args.quick else "1,2,4,8,16")).split(",")]
    scale = args.docs / FULL_DOCS
    args.sizes = [max(int(round(n * scale)), 1) for n in FULL_SIZES]
    features = tokenload_features()
    names = args.sides.split(",") if args.sides else list(POLICY_SIDES if features["build_policy"] else TODAY_SIDES)
    sides = [SIDES[n] for n in names]
    for s in sides:
        if s.lib == "tokenload" and s.policy not in (None, "default") and not features["build_policy"]:
            raise SystemExit(f"{s.name}: tokenload has no build_policy yet (run the tl-default-* sides)")
        if s.lib == "tokenload" and s.sequences and not features["sequences_path"]:
            raise SystemExit(f"{s.name}: tokenload has no sequences_path yet")
    passes = args.passes.split(",")
    if "count" in passes and shutil.which("strace") is None:
        raise SystemExit("strace not found: apt-get install strace, or --passes time")
    t = time.time()
    blend = make_blend(args.data_dir, args.prefixes, args.docs)
    print(f"data: {args.prefixes} prefixes, {args.docs:,} documents, {blend['tokens']:,} tokens "
          f"(made/reused in {time.time() - t:.1f} s); S={SEQ}, seed {SEED}, split {SPLIT!r}, sizes {args.sizes}; "
          f"ranks {ranks}; passes {passes}; {os.cpu_count()} CPUs; tokenload features {features}", flush=True)
    bench = Bench(args, blend)
    summaries, raw = [], []
    for side in sides:
        for r in ranks:
            t = time.time()
            timed = bench.run(side, r, traced=False) if "time" in passes else []
            counted = bench.run(side, r, traced=True) if "count" in passes else None
            s = summarize(side.name, r, timed or counted, counted)
            summaries.append(s)
            raw.append({"side": side.name, "ranks": r, "timed": timed, "counted": counted})
            print(f"[{side.name} x{r}: {time.time() - t:.0f} s"
                  + (f"; data phase med/max {fmt(s['data_s'])} s" if "data_s" in s else "")
                  + (f"; {s['errors']} errors: {s['error'][:300]}" if s["errors"] else "") + "]", flush=True)
    print()
    print_tables(summaries)
    results = goals(summaries, args.prefixes)
    for note in bench.notes:
        print(f"note: {note}")
    if args.out:
        Path(args.out).write_text(json.dumps({"summaries": summaries, "goals": results, "records": raw,
                                              "features": features, "sizes": args.sizes}, default=str))


if __name__ == "__main__":
    main()
