"""Shared benchmark helpers: synthetic token files, timing, peer (megatron-core) subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MEGATRON_PYTHON = os.environ.get("MEGATRON_PYTHON", "/tmp/megatron-venv/bin/python")


def _synthetic(prefix: str | Path, chunks, *, mean_len: int, seed: int, vocab: int) -> str:
    """Write a uint16 token file (reused if present) whose document lengths come from
    ``chunks(draw)``: it yields arrays of lengths, ``draw(n)`` gives n lognormal lengths."""
    from tokenload.format import TokenFileWriter

    prefix = str(prefix)
    if os.path.exists(prefix + ".idx") and os.path.exists(prefix + ".bin"):
        return prefix
    rng = np.random.default_rng(seed)
    sigma = 1.0
    mu = np.log(mean_len) - sigma**2 / 2

    def draw(n: int) -> np.ndarray:
        return np.maximum(rng.lognormal(mu, sigma, size=n).astype(np.int64), 1)

    with TokenFileWriter(prefix, np.uint16) as w:
        for lens in chunks(draw):
            w.add_documents(rng.integers(0, vocab, size=int(lens.sum()), dtype=np.uint16), lens)
    return prefix


def synthetic_token_file(prefix: str | Path, *, tokens: int, mean_len: int = 600, seed: int = 0, vocab: int = 50257) -> str:
    """A uint16 token file of about ``tokens`` tokens, lognormal document lengths; reused if present."""

    def chunks(draw):
        written = 0
        while written < tokens:
            lens = draw(100_000)
            lens = lens[np.cumsum(lens) <= tokens - written] if written + lens.sum() > tokens else lens
            if lens.size == 0:
                break
            yield lens
            written += int(lens.sum())

    return _synthetic(prefix, chunks, mean_len=mean_len, seed=seed, vocab=vocab)


def synthetic_docs_file(prefix: str | Path, *, docs: int, mean_len: int = 600, seed: int = 0, vocab: int = 50257) -> str:
    """A uint16 token file of exactly ``docs`` documents, lognormal lengths (mean ``mean_len``);
    reused if present. 1M documents of mean 600 tokens is the ~1.2 GB file of issue 15."""

    def chunks(draw):
        for begin in range(0, docs, 100_000):
            yield draw(min(100_000, docs - begin))

    return _synthetic(prefix, chunks, mean_len=mean_len, seed=seed, vocab=vocab)


def add_data_arguments(ap, gb: float = 1.0, docs: int | None = None) -> None:
    """``--data-dir`` and ``--gb`` (or ``--docs``): where the synthetic token file lives and its
    size, in GiB of tokens or in documents (``--docs`` wins when given)."""
    ap.add_argument("--data-dir", default="/tmp/tokenload-bench")
    ap.add_argument("--gb", type=float, default=gb)
    ap.add_argument("--docs", type=int, default=docs, help="documents in the file (instead of --gb)")


def docs_file(args, warm: bool = True) -> str:
    """The prefix of the synthetic token file in ``--data-dir`` (``--docs`` documents, else
    ``--gb`` GiB; made once, reused), with both files read into the page cache unless ``warm``
    is False."""
    from tokenload.format import warmup_file

    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    if getattr(args, "docs", None):
        prefix = synthetic_docs_file(Path(args.data_dir) / f"docs_{args.docs}", docs=args.docs)
    else:
        prefix = synthetic_token_file(Path(args.data_dir) / f"docs_{args.gb:g}gb", tokens=int(args.gb * 2**30 / 2))
    if not warm:
        return prefix
    warmup_file(prefix + ".idx")
    warmup_file(prefix + ".bin")
    return prefix


def best_of(fn, repeats: int = 3) -> float:
    """Fastest wall time of ``repeats`` calls of ``fn`` (seconds)."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def run_peer(script: str, payload: dict, timeout: int = 3600) -> dict | None:
    """Run ``script`` (Python source reading JSON argv[1], printing JSON) with megatron-core's venv."""
    if not os.path.exists(MEGATRON_PYTHON):
        print(f"[peer skipped: {MEGATRON_PYTHON} not found; run bash ../shared/tools/megatron-env.sh]", file=sys.stderr)
        return None
    out = subprocess.run(
        [MEGATRON_PYTHON, "-c", script, json.dumps(payload)],
        capture_output=True, text=True, timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"peer failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[list], header: list[str]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# Measurement code that runs on both sides (tokenload's venv and megatron-core's, where it is
# exec'd from this text), so both count the same things the same way.
PROBE = r'''
import os, resource, time

_TICK = os.sysconf("SC_CLK_TCK")
USAGE_KEYS = ("cpu_s", "minflt", "majflt", "vcsw", "ivcsw")


def usage(pids=()):
    # CPU seconds, minor and major page faults, voluntary and involuntary context switches of
    # this process (all threads) plus processes ``pids`` (loader workers; a gone one counts 0)
    r = resource.getrusage(resource.RUSAGE_SELF)
    total = [r.ru_utime + r.ru_stime, r.ru_minflt, r.ru_majflt, r.ru_nvcsw, r.ru_nivcsw]
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                s = f.read().rsplit(")", 1)[1].split()
            total[0] += (int(s[11]) + int(s[12])) / _TICK
            total[1] += int(s[7])
            total[2] += int(s[9])
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches"):
                            total[3] += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches"):
                            total[4] += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def drop_caches(paths=()):
    # evict the page cache: all of it where the machine allows (root), else the pages of ``paths``
    # (posix_fadvise DONTNEED: any user). Neither evicts pages a process has mapped, so a cold
    # pass needs a process that has not read the files yet. False when nothing was evicted.
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        pass
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return bool(paths)


def timed(body, batches, pids=()):
    # run body() (it reads ``batches`` micro-batches and returns the samples read); samples/s and,
    # per micro-batch, CPU us, faults and context switches of this process and ``pids``
    u0, t = usage(pids), time.perf_counter()
    n = body()
    wall = time.perf_counter() - t
    u1 = usage(pids)
    out = {"rate": n / wall, "wall_s": wall}
    for k, a, b in zip(USAGE_KEYS, u0, u1):
        out["cpu_us" if k == "cpu_s" else k] = (b - a) / max(batches, 1) * (1e6 if k == "cpu_s" else 1)
    return out
'''


# megatron-core's side of loader.py and data_wait.py: reads its payload ``a`` (a JSON file named
# by argv[1]) and builds ``ds``, the one-epoch train split of ``a["prefix"]`` (split 100,0,0,
# NullTokenizer, no attention mask), with its own builder and cache folder.
MEGATRON_DATASET = r'''
import json, logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
import numpy, torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.tokenizers import MegatronTokenizer

a = json.load(open(sys.argv[1]))
tok = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=a["vocab"], pad_id=-1)
cfg = GPTDatasetConfig(
    random_seed=a["seed"], sequence_length=a["seq"], blend=([a["prefix"]], None), split="100,0,0",
    path_to_cache=a["cache"], tokenizer=tok, reset_position_ids=False, reset_attention_mask=False,
    eod_mask_loss=False, create_attention_mask=False)
ds = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, cfg).build()[0]
'''


def can_drop_caches() -> bool:
    """Whether this process may drop the page cache (root on a machine that allows it)."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def cold_method(paths: list[str]) -> str | None:
    """How a cold pass evicts the page cache here: "drop_caches" (all of it), "fadvise" (the pages
    of ``paths``, posix_fadvise DONTNEED, where drop_caches is refused), or None (neither)."""
    if can_drop_caches():
        return "drop_caches"
    return "fadvise" if paths and hasattr(os, "posix_fadvise") else None
