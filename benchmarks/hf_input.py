"""Hugging Face datasets as preprocess input: a ``save_to_disk`` folder read directly, against the
way without it (export the dataset to JSONL with ``Dataset.to_json``, then preprocess the JSONL).

Usage: python benchmarks/hf_input.py [--mb 150] [--workers 2] [--rounds 2] [--dir /tmp/tl-hf]

Input: ``--mb`` MB of generated text (documents of 50-4,000 words from a small vocabulary, with
accents and CJK), saved with ``save_to_disk`` in 4 shards. Each side runs as its own child process
(``tokenload preprocess`` in-process there, ByteTokenizer so that reading dominates, ``--chunk-mb
1``); the figures are wall time and the child's peak RSS (``VmHWM``). The baseline's time
includes the export to JSONL, its peak is the larger of the export's and the preprocess's (the
last column: the preprocess alone). Both
outputs must be byte-identical: the script checks it. Rounds alternate the sides.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import time

CHILD = (
    "import sys, time\n"
    "t = time.perf_counter()\n"
    "if sys.argv[1] == 'export':\n"
    "    import datasets\n"
    "    datasets.disable_progress_bars()\n"
    "    datasets.load_from_disk(sys.argv[2]).to_json(sys.argv[3], force_ascii=False)\n"
    "else:\n"
    "    from tokenload.cli.main import main\n"
    "    assert main(sys.argv[2:]) == 0\n"
    "peak = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
    "print('CHILD', time.perf_counter() - t, int(peak) // 1024)\n"
)


def child(*args: str) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True)
    line = [x for x in out.stdout.splitlines() if x.startswith("CHILD")]
    if out.returncode or not line:
        raise SystemExit(out.stderr)
    _, seconds, peak = line[0].split()
    return float(seconds), int(peak)


def make(folder: str, mb: int) -> int:
    import datasets

    datasets.disable_progress_bars()
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "délta", "日本", "x1", "(z)", "\n"]
    texts, size = [], 0
    while size < mb << 20:
        text = " ".join(rng.choice(words) for _ in range(rng.randint(50, 4000)))
        texts.append(text)
        size += len(text.encode())
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(folder, num_shards=4)
    return size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=150)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/tl-hf")
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    saved = os.path.join(args.dir, "saved")
    size = make(saved, args.mb)
    print(f"dataset: {size / 2**20:.0f} MiB of text, {len(os.listdir(saved)) - 2} Arrow files")
    common = ["--tokenizer-type", "ByteTokenizer", "--append-eod", "--chunk-mb", "1",
              "--workers", str(args.workers), "--no-progress"]
    results: dict[str, list[tuple[float, int, int]]] = {"folder": [], "to_json + jsonl": []}
    for r in range(args.rounds):
        for side in results:
            out = os.path.join(args.dir, f"out-{side.split()[0]}-{r}")
            if side == "folder":
                t, p = child("run", "preprocess", "--input", saved, "--output-prefix", out, *common)
                results[side].append((t, p, p))
            else:
                jsonl = os.path.join(args.dir, "export.jsonl")
                t1, p1 = child("export", saved, jsonl)
                t2, p2 = child("run", "preprocess", "--input", jsonl, "--output-prefix", out,
                               *common)
                os.remove(jsonl)
                results[side].append((t1 + t2, max(p1, p2), p2))
    for ext in (".bin", ".idx"):
        a = open(os.path.join(args.dir, f"out-folder-0_text_document{ext}"), "rb").read()
        b = open(os.path.join(args.dir, f"out-to_json-0_text_document{ext}"), "rb").read()
        assert a == b, f"outputs differ ({ext})"
    print("outputs byte-identical")
    for side, runs in results.items():
        print(f"{side}: " + ", ".join(f"{t:.1f} s" for t, _, _ in runs))
    print("| input | wall s (median) | peak RSS MiB (max) | of which preprocess |")
    print("|---|---|---|---|")
    for side, runs in results.items():
        times = sorted(t for t, _, _ in runs)
        peak, pre = max(p for _, p, _ in runs), max(q for _, _, q in runs)
        print(f"| {side} | {times[len(times) // 2]:.1f} | {peak} | {pre} |")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - start:.0f} s")
