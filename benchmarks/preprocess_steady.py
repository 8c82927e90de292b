"""Preprocess steady state: `tokenload preprocess` on a gigabyte corpus against the tokenizer's own
limit and DataTrove's tokenization pipeline, same input, same tokenizer, same workers (issue 27).

Usage: python benchmarks/preprocess_steady.py [--data-dir /tmp/tokenload-bench] [--mb 1024]
           [--shards 8] [--workers 2] [--rounds 3] [--big-mb 500] [--big-datatrove]
           [--sides tokenload,limit-rayon,limit-threads,datatrove,tokenload-fixed]
           [--datatrove-python /tmp/s29/dt-venv/bin/python] [--bytecode compiled|source]
           [--base-src /tmp/old-tree/src]

Corpus (made here, no download, deterministic for a given machine): every text file of the
running Python's standard library (``.py``) and of ``/usr/share/{doc,man,info,perl,vim,i18n}``
(``.gz`` decompressed; files that are not UTF-8, hold a NUL byte or are blank are left out), in an
order mixed by a hash of the path. Pass 0 writes each file as one JSONL document
(``{"text", "path", "pass"}``); pass k > 0 varies every text by its line order (odd k reverse
the lines, and k >= 2 rotate them by a k-dependent offset), and any text already written (the
same bytes, from another file or pass) is skipped, so no document repeats verbatim. Documents go
to ``--shards`` JSONL files (each to the shard with the fewest bytes so far) until the corpus
holds ``--mb`` MiB. The big corpus (``--big-mb``, 0 to skip) is one JSONL line: one document of
pass-0 texts (then pass-1 ...) joined by blank lines, at least ``--big-mb`` MiB of text.

Tokenizer: a byte-level BPE (vocab 32,000, EOD ``<|endoftext|>``), trained in-process with HF
``tokenizers`` on the first 8 MiB of the document stream (the same for any ``--mb``), saved as
tokenizer.json and reused.

Sides, each a fresh process per round, the order rotating by round:

* ``tokenload``: the CLI, ``tokenload preprocess --input DIR --workers W --append-eod`` (byte-
  compiled first, as a pip install is: see ``preprocess.py``). End to end: start, tokenizer load,
  JSON parsing, encoding, writing and publishing the ``.bin/.idx``.
* ``limit-rayon`` and ``limit-threads``, the tokenizer's own limit: gigatoken, from the same
  tokenizer.json, encoding the same texts, already in memory as UTF-8 bytes (read and parsed
  before the timer starts), with the same cores; only the encoding is timed and the ids are
  dropped. ``rayon``: its batch call on its own thread pool (``RAYON_NUM_THREADS=W``), in batches
  of consecutive texts of about 64 MiB. ``threads``: W Python threads, each taking the next 4 MiB
  of consecutive texts, sorting them by length and encoding them with the padded batch call
  (``parallel=False``), as tokenload's workers do. The limit is the faster of the two. Each
  also times the JSON parsing it did before its timer (split, orjson, UTF-8 encode; one thread):
  what any pipeline that parses with orjson adds to the encoding.
* ``datatrove``: DataTrove 0.10's ``LocalPipelineExecutor(tasks=W, workers=W)`` running
  ``JsonlReader`` -> ``DocumentTokenizer(tokenizer_name_or_path=tokenizer.json,
  eos_token=EOD, shuffle_documents=False, batch_size=1000)`` in its own venv
  (``--datatrove-python``; never a tokenload dependency). Shuffling is off so its output can be
  compared, and it is less work. ``batch_size`` 1000 is the default its docstring states; its
  code's default, 10000 documents per ``encode_batch``, held ~13 GB per worker on the 1 GiB
  corpus here and the OOM killer ended a worker (``--datatrove-batch``).
  Its rank r reads shards r, r+W, ... (``get_shard``), so the shards are balanced by bytes.
  After the rounds, its ``.ds`` files (uint16 tokens) and ``.ds.index`` (uint64 document ends)
  are reassembled in shard order and compared with tokenload's ``.bin/.idx``: every token id and
  every document length must be equal.
* ``tokenload-fixed``: the tokenload command on a one-document corpus (under 4 KiB): its fixed
  cost (interpreter, imports, tokenizer load, publishing), to show the rate beyond it.
* ``tokenload-base`` (with ``--base-src``): the ``tokenload`` side's command run with another tree
  of tokenload first on ``PYTHONPATH`` (e.g. a ``git worktree`` of the commit before a change),
  into its own folder; after the rounds its ``.bin/.idx`` must be byte-identical to the
  ``tokenload`` side's.

Before the rounds every corpus file is read once, so every side reads it from the page cache.

Each side runs under a small reaper process (``PR_SET_CHILD_SUBREAPER``) that times it from spawn
to the exit of its main process, then waits for every descendant (DataTrove's forkserver and its
workers too): CPU is user + system of the whole tree, "largest process" is the exact peak RSS of
its largest single process (``ru_maxrss``), "tree" the largest sum of RSS over its processes,
sampled every 50 ms from /proc. tokenload's workers are threads of one process, so its largest
process holds all its workers; DataTrove's largest process is one worker.
"""

from __future__ import annotations

import argparse
import filecmp
import gzip
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import table
from preprocess import bytecode_env

EOD = "<|endoftext|>"
MIB = 1 << 20
DATATROVE_PYTHON = os.environ.get("DATATROVE_PYTHON", "/tmp/s29/dt-venv/bin/python")
SIDES = (
    "tokenload",
    "limit-rayon",
    "limit-threads",
    "datatrove",
    "tokenload-fixed",
    "tokenload-base",
)

#: The text on this machine the corpus is made of: (name, folder, file name suffixes or None).
SOURCES = (
    ("stdlib", sysconfig.get_paths()["stdlib"], (".py",)),
    ("doc", "/usr/share/doc", None),
    ("man", "/usr/share/man", None),
    ("info", "/usr/share/info", None),
    ("perl", "/usr/share/perl", None),
    ("vim", "/usr/share/vim", None),
    ("i18n", "/usr/share/i18n", None),
)
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}

# Runs one side: spawns it, times it to its main process's exit, reaps every descendant (this
# process is their subreaper), samples the tree's RSS from /proc, prints one JSON line.
REAPER = r"""
import ctypes, json, os, resource, subprocess, sys, threading, time
cmd, env_extra, out_path, err_path = json.loads(sys.argv[1])
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
me = os.getpid()
peaks, state, stop = {}, {"sum": 0}, threading.Event()

def tree():
    found, stack = [], [me]
    while stack:
        pid = stack.pop()
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
                stack += kids
                found += kids
        except OSError:
            pass
    return found

def poll():
    while not stop.is_set():
        total = 0
        for pid in tree():
            try:
                with open(f"/proc/{pid}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    name = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
            except OSError:
                continue
            rss = int(fields.get("VmRSS", "0 kB").split()[0])
            hwm = int(fields.get("VmHWM", "0 kB").split()[0])
            total += rss
            if hwm > peaks.get(pid, (0, ""))[0]:
                peaks[pid] = (hwm, name)
        state["sum"] = max(state["sum"], total)
        stop.wait(0.05)

threading.Thread(target=poll, daemon=True).start()
env = dict(os.environ, **env_extra)
t0 = time.perf_counter()
with open(out_path, "wb") as out, open(err_path, "wb") as err:
    rc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env).wait()
wall = time.perf_counter() - t0
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
stop.set()
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": rc, "wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "sys": ru.ru_stime,
                  "max_rss_mb": ru.ru_maxrss / 1024, "tree_rss_mb": state["sum"] / 1024,
                  "processes": sorted(((m / 1024, name) for m, name in peaks.values()),
                                      reverse=True)}))
"""

# gigatoken alone: the same texts from memory, the same tokenizer.json, W cores; times only the
# encoding and prints one JSON line.
LIMIT = r"""
import itertools, json, os, sys, threading, time
a = json.loads(sys.argv[1])
import numpy as np, orjson
texts, read_s, parse_s, parse_cpu = [], 0.0, 0.0, 0.0
for path in a["files"]:  # one file at a time: read, then JSON-parse and UTF-8 encode (timed apart)
    t = time.perf_counter()
    with open(path, "rb") as f:
        blob = f.read()
    read_s += time.perf_counter() - t
    t, c = time.perf_counter(), time.process_time()
    lines = [line for line in blob.split(b"\n") if line.strip()]
    texts += [orjson.loads(line)["text"].encode("utf-8") for line in lines]
    parse_s += time.perf_counter() - t
    parse_cpu += time.process_time() - c
    del blob, lines
import gigatoken
from gigatoken.gigatoken_rs import BytesSource, PadTruncate
with open(a["tokenizer"], "rb") as f:
    backend = gigatoken.Tokenizer.from_json(f.read()).backend

def batches(limit):
    out, lo, size = [], 0, 0
    for i, t in enumerate(texts):
        size += len(t)
        if size >= limit:
            out.append((lo, i + 1))
            lo, size = i + 1, 0
    if lo < len(texts):
        out.append((lo, len(texts)))
    return out

if a["mode"] == "rayon":
    import awkward  # noqa: F401  (imported by the batch call's result; not timed)
    work = batches(64 << 20)
    tokens = 0
    start, cpu = time.perf_counter(), time.process_time()
    for lo, hi in work:
        arr = backend.encode_batch(BytesSource(texts[lo:hi]), parallel=True)
        tokens += len(arr.layout.content)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
else:
    work = batches(4 << 20)
    rules, group_chars = PadTruncate(0), 1 << 20
    counts, taken = [], itertools.count()

    def worker():
        got = 0
        while (k := next(taken)) < len(work):
            lo, hi = work[k]
            chunk = sorted(texts[lo:hi], key=len)
            start = 0
            while start < len(chunk):
                stop = start + 1
                while stop < len(chunk) and len(chunk[stop]) * (stop + 1 - start) <= group_chars:
                    stop += 1
                _, lengths = backend.encode_batch_padded(BytesSource(chunk[start:stop]), rules,
                                                         parallel=False)
                got += int(lengths.sum())
                start = stop
        counts.append(got)

    threads = [threading.Thread(target=worker) for _ in range(a["workers"])]
    start, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = sum(counts)
print(json.dumps({"seconds": seconds, "encode_cpu": cpu, "read_s": read_s, "parse_s": parse_s,
                  "parse_cpu": parse_cpu,
                  "tokens": tokens, "documents": len(texts),
                  "bytes": sum(map(len, texts))}))
"""

DATATROVE = r"""
import json, sys
a = json.loads(sys.argv[1])
if __name__ == "__main__":
    from datatrove.executor.local import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    LocalPipelineExecutor(
        pipeline=[
            JsonlReader(a["input"], glob_pattern="*.jsonl", text_key="text"),
            DocumentTokenizer(output_folder=a["output"], tokenizer_name_or_path=a["tokenizer"],
                              eos_token=a["eod"], shuffle_documents=False,
                              batch_size=a["batch_size"]),
        ],
        tasks=a["workers"], workers=a["workers"], logging_dir=a["logs"], skip_completed=False,
    ).run()
"""


# ---------------------------------------------------------------------------------------------
# Corpus


def source_files() -> list[str]:
    """Every candidate file of ``SOURCES``, in an order mixed by a hash of the path."""
    paths = []
    for _, root, suffixes in SOURCES:
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
            for name in sorted(names):
                path = os.path.join(folder, name)
                if os.path.islink(path) or (suffixes and not name.endswith(suffixes)):
                    continue
                paths.append(path)
    return sorted(paths, key=lambda p: hashlib.sha1(p.encode()).digest())


def read_text(path: str) -> str | None:
    """The file's text (``.gz`` decompressed), or None if it is not UTF-8 text or is blank."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if path.endswith(".gz"):
            raw = gzip.decompress(raw)
        if b"\0" in raw:
            return None
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None
    return text if text.strip() else None


def vary(text: str, k: int) -> str:
    """Pass ``k``'s variant of ``text``: its lines reversed (odd k) and rotated (k >= 2)."""
    if k == 0:
        return text
    lines = text.split("\n")
    if k % 2:
        lines.reverse()
    n = len(lines)
    shift = (k // 2) * max(1, n // 7) % n
    return "\n".join(lines[shift:] + lines[:shift])


def documents(paths: list[str]):
    """(path, pass, text) of the document stream: pass 0, 1, ... of every file, no text twice."""
    seen: set[bytes] = set()
    for k in range(1 << 20):
        added = 0
        for path in paths:
            text = read_text(path)
            if text is None:
                continue
            text = vary(text, k)
            digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
            if digest in seen:
                continue
            seen.add(digest)
            added += 1
            yield path, k, text
        if not added:
            return


def make_corpus(data: Path, mb: int, shards: int) -> tuple[Path, dict]:
    """The ``--mb`` corpus folder of ``shards`` JSONL files and its manifest (made once)."""
    folder = data / f"steady_corpus_{mb}mb_{shards}shards"
    manifest_path = folder.with_suffix(".manifest.json")
    if manifest_path.exists():
        return folder, json.loads(manifest_path.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    files = [open(folder / f"shard_{i:03d}.jsonl", "wb") for i in range(shards)]  # noqa: SIM115
    sizes, docs = [0] * shards, [0] * shards
    md5s = [hashlib.md5() for _ in range(shards)]
    passes = 0
    for path, k, text in documents(source_files()):
        line = (
            json.dumps({"text": text, "path": path, "pass": k}, ensure_ascii=False) + "\n"
        ).encode()
        s = sizes.index(min(sizes))
        files[s].write(line)
        md5s[s].update(line)
        sizes[s] += len(line)
        docs[s] += 1
        passes = max(passes, k + 1)
        if sum(sizes) >= mb * MIB:
            break
    for f in files:
        f.close()
    manifest = {
        "files": [str(folder / f"shard_{i:03d}.jsonl") for i in range(shards)],
        "documents": docs,
        "bytes": sizes,
        "md5": [m.hexdigest() for m in md5s],
        "passes": passes,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return folder, manifest


def make_tiny(data: Path) -> Path:
    """A corpus of one small document (the stream's first under 4 KiB): tokenload's fixed cost."""
    folder = data / "steady_tiny"
    path = folder / "shard_000.jsonl"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        text = next(t for _, _, t in documents(source_files()) if len(t) < 4096)
        path.write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    return folder


def make_big(data: Path, mb: int) -> tuple[Path, dict]:
    """The one-document corpus: pass-0 texts (then pass 1, ...) joined by blank lines until the
    text holds ``mb`` MiB, written as one JSONL line without holding it in memory."""
    folder = data / f"steady_big_{mb}mb"
    manifest_path = folder.with_suffix(".manifest.json")
    if manifest_path.exists():
        return folder, json.loads(manifest_path.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = folder / "one_document.jsonl"
    text_bytes = pieces = 0
    md5 = hashlib.md5()
    with open(path, "wb") as f:

        def put(b: bytes) -> None:
            f.write(b)
            md5.update(b)

        put(b'{"text": "')
        for _, _, text in documents(source_files()):
            if pieces:
                put(b"\\n\\n")
                text_bytes += 2
            put(json.dumps(text, ensure_ascii=False)[1:-1].encode())
            text_bytes += len(text.encode("utf-8", "surrogatepass"))
            pieces += 1
            if text_bytes >= mb * MIB:
                break
        put(b'"}\n')
    manifest = {
        "files": [str(path)],
        "documents": [1],
        "bytes": [path.stat().st_size],
        "text_bytes": text_bytes,
        "pieces": pieces,
        "md5": [md5.hexdigest()],
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return folder, manifest


def train_tokenizer(out: Path, vocab: int = 32_000, sample_mb: int = 8) -> Path:
    """A byte-level BPE trained on the first ``sample_mb`` MiB of the document stream (reused)."""
    if out.exists():
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[EOD], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )

    def texts():
        seen = 0
        for _, _, text in documents(source_files()):
            seen += len(text)
            if seen > sample_mb * MIB:
                return
            yield text

    tok.train_from_iterator(texts(), trainer)
    tmp = out.with_suffix(".tmp")
    tok.save(str(tmp))
    tmp.rename(out)
    return out


# ---------------------------------------------------------------------------------------------
# Runs


def run_side(
    cmd: list[str], log: Path, env_extra: dict | None = None, env: dict | None = None
) -> dict:
    """Run ``cmd`` under the reaper: wall, CPU, RSS (see the module docstring) and its stdout."""
    out, err = log.with_suffix(".out"), log.with_suffix(".err")
    args = json.dumps([cmd, env_extra or {}, str(out), str(err)])
    done = subprocess.run(
        [sys.executable, "-c", REAPER, args], capture_output=True, text=True, env=env
    )
    if done.returncode:
        sys.exit(f"reaper failed: {done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["rc"]:
        sys.exit(f"{cmd[:4]} failed (rc {result['rc']}): {err.read_text()[-3000:]}")
    result["stdout"] = out.read_text()
    return result


def clear(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


class Bench:
    """The commands of every side for one corpus."""

    def __init__(self, args, data: Path, name: str, corpus: Path, manifest: dict, tokenizer: Path):
        self.args, self.corpus, self.manifest, self.tokenizer = args, corpus, manifest, tokenizer
        self.data = data
        self.work = data / f"steady_runs_{name}"
        self.work.mkdir(exist_ok=True)
        self.env = bytecode_env(args.bytecode)
        self.ours_dir, self.dt_dir = self.work / "tokenload", self.work / "datatrove"
        self.base_dir, self.base_env = self.work / "tokenload_base", dict(self.env)
        if args.base_src:
            self.base_env["PYTHONPATH"] = args.base_src
            subprocess.run(
                [sys.executable, "-m", "compileall", "-q", args.base_src],
                check=True,
                env=self.base_env,
                stdout=subprocess.DEVNULL,
            )
        self.prefix = self.ours_dir / "corpus"
        self.dt_script = self.work / "datatrove_pipeline.py"
        self.dt_script.write_text(DATATROVE)

    def run(self, side: str, tag: str) -> dict:
        a = self.args
        log = self.work / f"{side}.{tag}"
        if side in ("tokenload", "tokenload-fixed", "tokenload-base"):
            fixed = side == "tokenload-fixed"
            out = self.work / "tokenload_fixed" if fixed else self.ours_dir
            env = self.env
            if side == "tokenload-base":
                out, env = self.base_dir, self.base_env
            clear(out)
            prefix = out / "corpus"
            cmd = [
                sys.executable,
                "-m",
                "tokenload.cli.main",
                "preprocess",
                "--input",
                str(make_tiny(self.data) if fixed else self.corpus),
                "--output-prefix",
                str(prefix),
                "--tokenizer-type",
                "huggingface",
                "--tokenizer-model",
                str(self.tokenizer),
                "--eod-token",
                EOD,
                "--append-eod",
                "--workers",
                str(a.workers),
                "--no-resume",
                "--no-progress",
            ]
            r = run_side(cmd, log, env=env)
            summary = json.loads(Path(f"{prefix}_text_document.json").read_text())
            r["tokens"] = summary["tokens"]
            r["seconds"] = r["wall"]
            return r
        if side.startswith("limit-"):
            mode = side.split("-", 1)[1]
            payload = {
                "files": self.manifest["files"],
                "tokenizer": str(self.tokenizer),
                "mode": mode,
                "workers": a.workers,
            }
            r = run_side(
                [sys.executable, "-c", LIMIT, json.dumps(payload)],
                log,
                env_extra={"RAYON_NUM_THREADS": str(a.workers)},
            )
            r["process_cpu"] = r["cpu"]
            r.update(json.loads(r["stdout"].strip().splitlines()[-1]))
            r["cpu"] = r["encode_cpu"]
            return r
        if side == "datatrove":
            clear(self.dt_dir)
            logs = self.work / "datatrove_logs"
            shutil.rmtree(logs, ignore_errors=True)
            payload = {
                "input": str(self.corpus),
                "output": str(self.dt_dir),
                "tokenizer": str(self.tokenizer),
                "eod": EOD,
                "workers": a.workers,
                "logs": str(logs),
                "batch_size": a.datatrove_batch,
            }
            r = run_side([a.datatrove_python, str(self.dt_script), json.dumps(payload)], log)
            r["seconds"] = r["wall"]
            metadata = [p.read_text() for p in self.dt_dir.glob("*.ds.metadata")]
            r["tokens"] = sum(int(text.split("\n")[1]) for text in metadata)
            return r
        raise ValueError(side)

    def compare_base(self) -> tuple[bool, str]:
        """Whether the ``tokenload`` and ``tokenload-base`` sides wrote the same bytes (token
        file pair and sidecar)."""
        names = [f"corpus_text_document.{ext}" for ext in ("bin", "idx", "json")]
        same = [filecmp.cmp(self.ours_dir / n, self.base_dir / n, shallow=False) for n in names]
        sizes = [(self.ours_dir / n).stat().st_size for n in names]
        return all(same), ", ".join(f"{n} {z:,} bytes {s}" for n, z, s in zip(names, sizes, same))

    def compare_datatrove(self) -> tuple[bool, str]:
        """Whether DataTrove's ids and document lengths equal tokenload's, document by document."""
        import numpy as np

        from tokenload.format import TokenFile, document_token_counts

        tf = TokenFile(f"{self.prefix}_text_document")
        ours = np.memmap(tf.bin_path, dtype=tf.dtype, mode="r")
        ours_lengths = document_token_counts(tf)
        docs = self.manifest["documents"]
        w = self.args.workers
        doc_start = np.concatenate(([0], np.cumsum(docs)))
        tok_start = np.concatenate(([0], np.cumsum(ours_lengths)))
        ranks = {}
        for r in range(min(w, len(docs))):
            name = self.dt_dir / f"{r:05d}_unshuffled.ds"
            ends = np.fromfile(f"{name}.index", dtype="<u8").astype(np.int64)
            ranks[r] = (np.memmap(name, dtype="<u2", mode="r"), ends, [0, 0])  # doc, token cursors
        if sum(len(e) for _, e, _ in ranks.values()) != len(ours_lengths):
            return (
                False,
                f"documents: datatrove {sum(len(e) for _, e, _ in ranks.values())}, "
                f"tokenload {len(ours_lengths)}",
            )
        for s, n in enumerate(docs):
            tokens, ends, cursor = ranks[s % w]
            d0, t0 = cursor
            theirs_ends = ends[d0 : d0 + n]
            theirs_lengths = np.diff(np.concatenate(([t0], theirs_ends)))
            mine = ours_lengths[doc_start[s] : doc_start[s] + n]
            if not np.array_equal(theirs_lengths, mine):
                bad = int(np.flatnonzero(theirs_lengths != mine)[0])
                return (
                    False,
                    f"shard {s} document {bad}: {theirs_lengths[bad]} vs {mine[bad]} tokens",
                )
            t1 = int(theirs_ends[-1]) if n else t0
            a_ids = tokens[t0:t1]
            b_ids = ours[tok_start[doc_start[s]] : tok_start[doc_start[s] + n]]
            if not np.array_equal(a_ids, b_ids):
                return (
                    False,
                    f"shard {s}: token ids differ at {int(np.flatnonzero(a_ids != b_ids)[0])}",
                )
            cursor[:] = [d0 + n, t1]
        return True, f"{len(ours_lengths):,} documents, {int(tok_start[-1]):,} tokens equal"


def describe_corpus(name: str, corpus: Path, manifest: dict) -> tuple[str, float]:
    mb = sum(manifest["bytes"]) / MIB
    return (
        f"{name}: {corpus} ({len(manifest['files'])} files, {mb:,.1f} MiB JSONL, "
        f"{sum(manifest['documents']):,} documents, md5 of file 0 {manifest['md5'][0][:12]})"
    ), mb


def _med(rows: list[dict], key: str = "seconds") -> float:
    return statistics.median(r[key] for r in rows)


def report(results: dict[str, list[dict]], mb: float, title: str, workers: int) -> None:
    """The table of every side (medians, range, RSS) and the ratios of the goals."""
    sides = list(results)
    med = {s: _med(results[s]) for s in sides}
    rows = []
    for s in sides:
        rs = results[s]
        secs = [r["seconds"] for r in rs]
        rows.append(
            [
                s,
                f"{med[s]:.2f}",
                f"{min(secs):.2f}-{max(secs):.2f}",
                f"{_med(rs, 'cpu'):.1f}",
                f"{mb / med[s]:.1f}",
                f"{_med(rs, 'tokens') / med[s] / 1e6:.2f}",
                f"{max(r['max_rss_mb'] for r in rs):,.0f}",
                f"{max(r['tree_rss_mb'] for r in rs):,.0f}",
            ]
        )
    print(f"\n{title}")
    head = ["side", "s (median)", "s (range)", "CPU s", "MiB/s", "M tokens/s"]
    print(table(rows, [*head, "peak RSS largest process MiB", "peak RSS tree MiB"]))
    print(
        "(limit-*: time and CPU of the encoding only, texts in memory; their RSS is the whole "
        "process, which holds the corpus; tokenload-fixed: tokenload on one small document)"
    )
    n = min(len(v) for v in results.values())
    limits = [s for s in sides if s.startswith("limit-")]
    if "tokenload" in results and limits:
        ours = results["tokenload"]
        best = min(limits, key=lambda s: med[s])
        limit = med[best]
        per_round = [
            min(results[s][i]["seconds"] for s in limits) / ours[i]["seconds"] for i in range(n)
        ]
        print(
            f"tokenload / gigatoken limit (limit s / tokenload s; the limit is the faster mode, "
            f"{best}): {limit / med['tokenload']:.2f} of the medians; per round "
            + ", ".join(f"{x:.2f}" for x in per_round)
        )
        enc_cpu, parse = _med(results[best], "cpu"), _med(results[best], "parse_cpu")
        print(
            f"by CPU (limit encode CPU / tokenload CPU): {enc_cpu / _med(ours, 'cpu'):.2f}; JSON "
            f"parsing of the same corpus (split, orjson, UTF-8 encode; one thread, page cache; "
            f"before the limit's timer): {parse:.2f} CPU s = {parse / enc_cpu:.0%} of the limit's "
            f"encode CPU: a pipeline that parses with orjson and encodes with gigatoken reaches at "
            f"most encode / (encode + parse) = {enc_cpu / (enc_cpu + parse):.2f} of the limit on "
            f"{workers} fully used cores"
        )
        if "tokenload-fixed" in results:
            fixed = med["tokenload-fixed"]
            print(
                f"tokenload's fixed cost (one small document): {fixed:.2f} s; beyond it, "
                f"tokenload / limit = {limit / (med['tokenload'] - fixed):.2f}"
            )
    if "tokenload" in results and "datatrove" in results:
        ours, dt = results["tokenload"], results["datatrove"]
        per_round = [dt[i]["seconds"] / ours[i]["seconds"] for i in range(n)]
        print(
            f"tokenload vs DataTrove (DataTrove s / tokenload s): "
            f"{med['datatrove'] / med['tokenload']:.1f}x of the medians; per round "
            + ", ".join(f"{x:.1f}x" for x in per_round)
            + f"; by CPU {_med(dt, 'cpu') / _med(ours, 'cpu'):.1f}x"
        )
    for s in sides:
        procs = max(results[s], key=lambda r: r["max_rss_mb"])["processes"]
        print(
            f"  {s} processes by peak RSS (MiB): "
            + "; ".join(f"{m:,.0f} {name.split(' -c ')[0][-60:]}" for m, name in procs[:4])
        )


def run_rounds(bench: Bench, sides: list[str], rounds: int, rotate: bool) -> dict[str, list[dict]]:
    """``rounds`` rounds of every side (the order rotating by round when ``rotate``), the corpus
    read once first so that every side reads it from the page cache."""
    for path in bench.manifest["files"]:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    results: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(rounds):
        order = sides[r % len(sides) :] + sides[: r % len(sides)] if rotate else sides
        for s in order:
            res = bench.run(s, f"r{r}")
            results[s].append(res)
            print(
                f"round {r + 1} {s}: {res['seconds']:.2f} s, CPU {res['cpu']:.1f} s (system"
                f" {res['sys']:.1f} s, whole process), largest "
                f"process {res['max_rss_mb']:,.0f} MiB, tree {res['tree_rss_mb']:,.0f} MiB, "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    return results


def check_limit_counts(results: dict[str, list[dict]], manifest: dict) -> None:
    """Each limit's token count plus one EOD per document must be tokenload's count."""
    if "tokenload" not in results:
        return
    ours = results["tokenload"][-1]["tokens"]
    for s, rs in results.items():
        if s.startswith("limit-"):
            theirs = rs[-1]["tokens"] + sum(manifest["documents"])
            print(f"{s} tokens + one EOD per document = tokenload's: {theirs == ours} ({theirs:,})")


def compare_base(bench: Bench, sides: list[str], equal: bool | None) -> bool | None:
    """Print whether tokenload-base wrote tokenload's bytes; fold it into ``equal``."""
    if "tokenload-base" not in sides or "tokenload" not in sides:
        return equal
    ok, detail = bench.compare_base()
    print(f"tokenload-base's output byte-identical to tokenload's: {ok} ({detail})")
    return equal is not False and ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="/tmp/tokenload-bench")
    ap.add_argument("--mb", type=int, default=1024, help="corpus size, MiB of JSONL")
    ap.add_argument("--shards", type=int, default=8, help="JSONL files of the corpus")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-mb", type=int, default=500, help="one-document corpus, MiB (0: skip)")
    ap.add_argument(
        "--big-datatrove",
        action="store_true",
        help="also run DataTrove on the one-document corpus (HF tokenizers held ~3 GB for one "
        "16 MiB document here: a 500 MiB one needs far more memory than this machine has)",
    )
    ap.add_argument("--sides", help=f"comma-separated, of {','.join(SIDES)} (default: all)")
    ap.add_argument("--datatrove-python", default=DATATROVE_PYTHON)
    ap.add_argument(
        "--datatrove-batch",
        type=int,
        default=1000,
        help="DocumentTokenizer's batch_size (documents per encode_batch call): 1000 as its "
        "docstring says; its code's default, 10000, held ~13 GB per worker on the 1 GiB corpus and "
        "the OOM killer ended a worker on this 24 GiB machine",
    )
    ap.add_argument("--bytecode", choices=("compiled", "source"), default="compiled")
    ap.add_argument(
        "--base-src",
        help="another tokenload tree's src folder: adds the side tokenload-base (the tokenload "
        "side run with it on PYTHONPATH), whose output must equal tokenload's byte for byte",
    )
    args = ap.parse_args()
    default_sides = [s for s in SIDES if s != "tokenload-base" or args.base_src]
    sides = [s for s in (args.sides or ",".join(default_sides)).split(",") if s]
    for s in sides:
        if s not in SIDES:
            sys.exit(f"unknown side {s}; choose from {','.join(SIDES)}")
    if "tokenload-base" in sides and not args.base_src:
        sys.exit("the side tokenload-base needs --base-src")
    if "datatrove" in sides and not os.path.exists(args.datatrove_python):
        sys.exit(
            f"{args.datatrove_python} missing: python3 -m venv /tmp/s29/dt-venv && "
            "/tmp/s29/dt-venv/bin/pip install 'datatrove==0.10.*' tokenizers orjson"
        )
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    corpus, manifest = make_corpus(data, args.mb, args.shards)
    tokenizer = train_tokenizer(data / "steady_bpe32k.json")
    line, mb = describe_corpus("corpus", corpus, manifest)
    print(line)
    print(
        f"tokenizer: {tokenizer} (byte-level BPE, vocab 32,000), workers: {args.workers}, "
        f"nproc: {os.cpu_count()}, rounds: {args.rounds}, load average: {os.getloadavg()}"
    )
    bench = Bench(args, data, f"{args.mb}mb", corpus, manifest, tokenizer)
    results = run_rounds(bench, sides, args.rounds, rotate=True)
    title = f"corpus {mb:,.0f} MiB, {args.rounds} rounds, load {os.getloadavg()}"
    report(results, mb, title, args.workers)
    equal = None
    if "datatrove" in sides and "tokenload" in sides:
        equal, detail = bench.compare_datatrove()
        print(f"DataTrove ids equal to tokenload's: {equal} ({detail})")
    check_limit_counts(results, manifest)
    equal = compare_base(bench, sides, equal)

    if args.big_mb:
        big, big_manifest = make_big(data, args.big_mb)
        line, big_mb = describe_corpus("one-document corpus", big, big_manifest)
        print("\n" + line)
        big_sides = [
            s for s in sides if s != "tokenload-fixed" and (s != "datatrove" or args.big_datatrove)
        ]
        big_bench = Bench(args, data, f"big{args.big_mb}mb", big, big_manifest, tokenizer)
        big_results = run_rounds(big_bench, big_sides, args.rounds, rotate=False)
        text_mb = big_manifest["text_bytes"] / MIB
        title = f"one document of {text_mb:,.0f} MiB, load {os.getloadavg()}"
        report(big_results, big_mb, title, args.workers)
        if "datatrove" in big_sides and "tokenload" in big_sides:
            ok, detail = big_bench.compare_datatrove()
            print(f"DataTrove ids equal to tokenload's: {ok} ({detail})")
            equal = equal is not False and ok
        check_limit_counts(big_results, big_manifest)
        equal = compare_base(big_bench, big_sides, equal)
    if equal is False:
        sys.exit(1)


if __name__ == "__main__":
    main()
