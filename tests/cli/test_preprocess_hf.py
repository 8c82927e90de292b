"""`tokenload preprocess --input DIR` on Hugging Face dataset folders, as real commands: a run
killed with SIGKILL and rerun gives the bytes of an uninterrupted run; peak memory does not grow
with the dataset; the folder path never imports the ``datasets`` package."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets

from support import run_cli

datasets.disable_progress_bars()
BYTES = ("--tokenizer-type", "ByteTokenizer")
# Runs the CLI in this interpreter, then reports its peak RSS and whether `datasets` was imported.
PROBE = (
    "import sys\n"
    "from tokenload.cli.main import main\n"
    "rc = main(sys.argv[1:])\n"
    "peak = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
    "print('PROBE', rc, peak, 'datasets' in sys.modules)\n"
)


def texts(n: int, seed: int, words: int = 40) -> list[str]:
    rng = random.Random(seed)
    vocab = ["alpha", "beta", "gamma", "délta", "日本", "x1", "y22", "(z)", "\n"]
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, words))) for _ in range(n)]


def same(a: str, b: str) -> bool:
    return all(Path(a + e).read_bytes() == Path(b + e).read_bytes() for e in (".bin", ".idx"))


def probe(*args) -> tuple[int, int, bool]:
    """(exit code, peak RSS in KiB, datasets imported) of ``tokenload ARGS`` in a child."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, timeout=300
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("PROBE")]
    assert line, out.stderr
    _, rc, peak, imported = line[0].split()
    return int(rc), int(peak), imported == "True"


def test_json_keys_pick_the_column_of_a_saved_dataset_without_importing_datasets(tmp_path):
    body, title = texts(200, seed=1), [f"title {i} ü" for i in range(200)]
    datasets.Dataset.from_dict({"body": body, "title": title}).save_to_disk(
        str(tmp_path / "saved"), num_shards=2
    )
    (tmp_path / "ref.jsonl").write_text(
        "".join(json.dumps({"body": b}) + "\n" for b in body), encoding="utf-8"
    )
    ref = run_cli("preprocess", "--input", tmp_path / "ref.jsonl", "--output-prefix",
                  tmp_path / "ref", "--json-keys", "body", *BYTES, "--append-eod", "--no-progress")
    assert ref.returncode == 0, ref.stderr
    rc, _, imported = probe("preprocess", "--input", tmp_path / "saved", "--output-prefix",
                            tmp_path / "out", "--json-keys", "body", *BYTES, "--append-eod",
                            "--no-progress")
    assert rc == 0 and not imported
    assert same(f"{tmp_path}/ref_body_document", f"{tmp_path}/out_body_document")
    assert not Path(f"{tmp_path}/out_title_document.bin").exists()


def test_peak_memory_does_not_grow_with_the_dataset(tmp_path):
    """Twice the rows in one Arrow file (about 24 vs 48 MiB of text, 1 MiB chunks): the peak RSS
    grows by less than half the extra data (measured ~1/3 on a busy machine), where reading
    a file whole would add all of it."""
    base = texts(3000, seed=2, words=2000)  # ~8 KiB a document
    datasets.Dataset.from_dict({"text": base * 2}).save_to_disk(str(tmp_path / "one"))
    datasets.Dataset.from_dict({"text": base * 4}).save_to_disk(str(tmp_path / "two"))
    sizes = {n: (tmp_path / n / "data-00000-of-00001.arrow").stat().st_size for n in ("one", "two")}
    peaks = {}
    for name in ("one", "two"):
        rc, peaks[name], _ = probe("preprocess", "--input", tmp_path / name, "--output-prefix",
                                   tmp_path / name, *BYTES, "--chunk-mb", "1", "--workers", "2",
                                   "--no-progress")
        assert rc == 0
    grown = (peaks["two"] - peaks["one"]) * 1024
    extra = sizes["two"] - sizes["one"]
    print(f"peak RSS {peaks['one'] >> 10} MiB for {sizes['one'] >> 20} MiB, {peaks['two'] >> 10}"
          f" MiB for {sizes['two'] >> 20} MiB")
    assert grown < extra / 2, (peaks, sizes)


def _slow_tokenizer(path: Path, corpus) -> str:
    """A byte-level BPE tokenizer.json; encoded with --engine native it is slow enough to kill."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                            show_progress=False),
    )
    tok.save(str(path))
    return str(path)


def test_killed_run_on_a_saved_dataset_resumes_to_the_same_bytes(tmp_path):
    tokenizer = _slow_tokenizer(tmp_path / "tok.json", texts(300, seed=99))
    datasets.Dataset.from_dict({"text": texts(10000, seed=3)}).save_to_disk(
        str(tmp_path / "saved"), num_shards=40
    )
    args = ["preprocess", "--input", str(tmp_path / "saved"), "--tokenizer-type",
            "HuggingFaceTokenizer", "--tokenizer-model", tokenizer, "--engine", "native",
            "--append-eod", "--workers", "1", "--no-progress"]
    clean = run_cli(*args, "--output-prefix", tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr

    prefix = tmp_path / "killed"
    work = Path(str(prefix) + ".tokenload-work")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenload.cli.main", *args, "--output-prefix", str(prefix)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and len(
            list(work.glob("*.done"))
        ) < 3:
            time.sleep(0.005)
        still_running = proc.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    finished = len(list(work.glob("*.done")))
    assert still_running and 3 <= finished < 40, f"not killed mid-run ({finished} files done)"
    assert not Path(str(prefix) + "_text_document.idx").exists()

    resumed = run_cli(*args, "--output-prefix", prefix)
    assert resumed.returncode == 0, resumed.stderr
    assert f"from 40 input file(s) ({finished} resumed)" in resumed.stdout
    assert same(str(prefix) + "_text_document", str(tmp_path / "clean") + "_text_document")
    assert not work.exists()
