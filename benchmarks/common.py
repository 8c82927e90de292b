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


def synthetic_token_file(prefix: str | Path, *, tokens: int, mean_len: int = 600, seed: int = 0, vocab: int = 50257) -> str:
    """A uint16 token file of about ``tokens`` tokens, lognormal document lengths; reused if present."""
    from tokenload.format import TokenFileWriter

    prefix = str(prefix)
    if os.path.exists(prefix + ".idx") and os.path.exists(prefix + ".bin"):
        return prefix
    rng = np.random.default_rng(seed)
    sigma = 1.0
    mu = np.log(mean_len) - sigma**2 / 2
    with TokenFileWriter(prefix, np.uint16) as w:
        written = 0
        while written < tokens:
            lens = np.maximum(rng.lognormal(mu, sigma, size=100_000).astype(np.int64), 1)
            lens = lens[np.cumsum(lens) <= tokens - written] if written + lens.sum() > tokens else lens
            if lens.size == 0:
                break
            w.add_documents(rng.integers(0, vocab, size=int(lens.sum()), dtype=np.uint16), lens)
            written += int(lens.sum())
    return prefix


def add_data_arguments(ap, gb: float = 1.0) -> None:
    """``--data-dir`` and ``--gb``: where the synthetic token file lives and its size."""
    ap.add_argument("--data-dir", default="/tmp/tokenload-bench")
    ap.add_argument("--gb", type=float, default=gb)


def docs_file(args) -> str:
    """The prefix of the ``--gb`` synthetic token file in ``--data-dir`` (made once, reused),
    with both files read into the page cache."""
    from tokenload.format import warmup_file

    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    prefix = synthetic_token_file(Path(args.data_dir) / f"docs_{args.gb:g}gb", tokens=int(args.gb * 2**30 / 2))
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
