"""Tokenization throughput: `tokenload preprocess` vs Megatron-LM's way, same input, same tokenizer.

Usage: python benchmarks/preprocess.py [--data-dir /tmp/tokenload-bench] [--mb 60] [--workers 2]
                                      [--rounds 3] [--bytecode compiled|source]

Input: a JSONL corpus of at least ``--mb`` MB written by ``tokenload corpus`` (the Python standard
library's own sources, 33 MB; passes after the first reverse the line order of every file, so no
document repeats verbatim and no encoder can profit from whole repeated texts). Tokenizer: a byte-level BPE (vocab 32,000, EOD
``<|endoftext|>``) trained in-process with HF ``tokenizers`` and saved as tokenizer.json.

Baseline (spec §6.1), run in megatron-core's scratch venv (``MEGATRON_PYTHON``): Megatron's
``tools/preprocess_data.py`` is not in the megatron-core package, so its method is reproduced:
``multiprocessing.Pool(workers).imap(encode, lines, 32)`` where ``encode`` parses one JSON line and
tokenizes one document with transformers' tokenizer, and every result goes through megatron-core's
``IndexedDatasetBuilder.add_document``. Both outputs must be byte-identical: the script checks it.

Rounds alternate the two sides (tokenload, Megatron, tokenload, ...); the table shows each side's
median wall time and CPU time (user + system of the process and its children), and the speed-up
of the medians. Bytecode: megatron-core and every other library run from byte-compiled
site-packages, while an editable tokenload under ``PYTHONDONTWRITEBYTECODE=1`` would compile its
own modules on every start (a pip install byte-compiles them); ``--bytecode compiled`` (default)
compiles them once (``compileall``, into the package's ``__pycache__`` folders) and times runs
that may read them, ``source`` times the uncompiled start.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import MEGATRON_PYTHON, table  # noqa: E402

EOD = "<|endoftext|>"

PEER = r"""
import json, sys, time, multiprocessing
a = json.loads(sys.argv[1])

def init():
    global TOK
    import warnings; warnings.filterwarnings("ignore")
    from transformers import PreTrainedTokenizerFast
    TOK = PreTrainedTokenizerFast(tokenizer_file=a["tokenizer"])

def encode(line):
    text = json.loads(line)["text"]
    ids = TOK.encode(text, add_special_tokens=False)
    if ids:
        ids.append(a["eod"])
    return ids, len(line)

if __name__ == "__main__":
    t0 = time.perf_counter()
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder, DType
    builder = IndexedDatasetBuilder(a["prefix"] + ".bin", dtype=DType.optimal_dtype(a["vocab"]))
    tokens = 0
    with open(a["input"], encoding="utf-8") as f, multiprocessing.Pool(a["workers"], initializer=init) as pool:
        for ids, _ in pool.imap(encode, f, 32):
            builder.add_document(numpy.array(ids, dtype=numpy.int64), [len(ids)] if ids else [])
            tokens += len(ids)
    builder.finalize(a["prefix"] + ".idx")
    print(json.dumps({"seconds": time.perf_counter() - t0, "tokens": tokens}))
"""


def train_tokenizer(corpus: Path, out: Path, vocab: int = 32_000, sample_mb: int = 8) -> Path:
    """A byte-level BPE trained on the first ``sample_mb`` MB of the corpus (reused if present)."""
    if out.exists():
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def texts():
        seen = 0
        with open(corpus, encoding="utf-8") as f:
            for line in f:
                seen += len(line)
                if seen > sample_mb << 20:
                    return
                yield json.loads(line)["text"]

    tok.train_from_iterator(texts(), trainer)
    tok.save(str(out))
    return out


def md5(path: str) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def children_cpu() -> float:
    """User + system CPU seconds of every finished child process so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], **kw) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, CPU s, result) of one child process run to its end."""
    cpu, t = children_cpu(), time.perf_counter()
    out = subprocess.run(cmd, **kw)
    return time.perf_counter() - t, children_cpu() - cpu, out


def bytecode_env(mode: str) -> dict[str, str]:
    """The environment of tokenload's timed runs (see the module docstring, "Bytecode")."""
    env = dict(os.environ)
    if mode == "source":
        return env
    import tokenload

    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(tokenload.__file__).parent)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return env


def make_corpus(data: Path, mb: int) -> Path:
    """The benchmark's JSONL corpus (see the module docstring), written once and reused."""
    corpus = data / f"corpus_{mb}mb.jsonl"
    if corpus.exists():
        return corpus
    raw = data / f"corpus_{mb}mb.raw.jsonl"
    subprocess.run([sys.executable, "-m", "tokenload.cli.main", "corpus", "--output", str(raw),
                    "--min-mb", str(mb), "--max-mb", str(mb + 8)], check=True)
    with open(raw, encoding="utf-8") as src, open(corpus, "w", encoding="utf-8") as dst:
        for line in src:
            record = json.loads(line)
            if record.get("pass", 0) % 2:
                record["text"] = "\n".join(reversed(record["text"].split("\n")))
            dst.write(json.dumps(record) + "\n")
    raw.unlink()
    return corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="/tmp/tokenload-bench")
    ap.add_argument("--mb", type=int, default=60)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per side (medians)")
    ap.add_argument("--bytecode", choices=("compiled", "source"), default="compiled")
    args = ap.parse_args()
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(data, args.mb)
    tokenizer = train_tokenizer(corpus, data / "bpe32k.json")
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(tokenizer))
    eod, vocab = hf.token_to_id(EOD), hf.get_vocab_size()
    mb = corpus.stat().st_size / 2**20
    if not os.path.exists(MEGATRON_PYTHON):
        sys.exit(f"{MEGATRON_PYTHON} missing: run bash ../shared/tools/megatron-env.sh")

    out_ours = data / "pre_ours"
    out_ours.mkdir(exist_ok=True)
    prefix = out_ours / "corpus"
    ours_cmd = [sys.executable, "-m", "tokenload.cli.main", "preprocess", "--input", str(corpus),
                "--output-prefix", str(prefix), "--tokenizer-type", "huggingface",
                "--tokenizer-model", str(tokenizer), "--eod-token", EOD, "--append-eod",
                "--workers", str(args.workers), "--no-resume", "--no-progress"]
    peer_prefix = str(data / "pre_megatron")
    peer_cmd = [MEGATRON_PYTHON, "-c", PEER, json.dumps({
        "input": str(corpus), "tokenizer": str(tokenizer), "eod": eod, "vocab": vocab,
        "workers": args.workers, "prefix": peer_prefix})]
    env = bytecode_env(args.bytecode)
    ours, peer = [], []
    for _ in range(args.rounds):
        for f in out_ours.iterdir():
            if f.is_file():
                f.unlink()
        wall, cpu, _ = timed(ours_cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        ours.append((wall, cpu))
        wall, cpu, out = timed(peer_cmd, capture_output=True, text=True)
        if out.returncode:
            sys.exit(out.stderr[-3000:])
        peer.append((wall, cpu))
    ours_prefix = f"{prefix}_text_document"
    tokens = json.loads(Path(ours_prefix + ".json").read_text())["tokens"]
    peer_tokens = json.loads(out.stdout.strip().splitlines()[-1])["tokens"]

    identical = all(md5(ours_prefix + e) == md5(peer_prefix + e) for e in (".bin", ".idx"))
    ours_s, peer_s = (statistics.median(w for w, _ in side) for side in (ours, peer))
    ours_cpu, peer_cpu = (statistics.median(c for _, c in side) for side in (ours, peer))
    print(f"input: {corpus} ({mb:.1f} MB, {tokens:,} tokens), tokenizer: byte-level BPE vocab {vocab}, "
          f"workers: {args.workers}, nproc: {os.cpu_count()}, rounds: {args.rounds}, "
          f"tokenload bytecode: {args.bytecode}\n")
    rows = [
        ["tokenload preprocess", f"{ours_s:.2f}", f"{ours_cpu:.2f}", f"{tokens / ours_s:,.0f}",
         f"{mb / ours_s:.2f}", f"{peer_s / ours_s:.1f}x"],
        ["Megatron way (Pool.imap + transformers + IndexedDatasetBuilder)", f"{peer_s:.2f}",
         f"{peer_cpu:.2f}", f"{peer_tokens / peer_s:,.0f}", f"{mb / peer_s:.2f}", "1.0x"],
    ]
    print(table(rows, ["pipeline", "wall s (median)", "CPU s (median)", "tokens/s", "MB/s", "speed-up"]))
    print("\nper round (tokenload wall s, Megatron wall s, ratio): " + "; ".join(
        f"{o:.2f}, {p:.2f}, {p / o:.1f}x" for (o, _), (p, _) in zip(ours, peer)))
    print(f"outputs byte-identical (.bin and .idx md5): {identical}")
    if not identical:
        sys.exit(1)

if __name__ == "__main__":
    main()
