"""Small generated corpora for the Ray tests, and the comparison of two runs' outputs."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ["the", "cat", "sat", "héllo", "wörld", "日本語", "emoji🙂", "123", "def", "return", "(", ")"]


def docs(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"text": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 40))), "id": i} for i in range(n)]


def jsonl_bytes(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


def train_tokenizer(path: Path) -> Path:
    """A byte-level BPE tokenizer.json trained in-process on the corpus words (about 0.1 s)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([d["text"] for d in docs(2000, 99)], trainer)
    tok.save(str(path))
    return path


def same_outputs(a: Path, b: Path) -> None:
    """The two runs wrote byte-identical .bin and .idx files, and not empty ones."""
    for ext in (".bin", ".idx"):
        left, right = Path(str(a) + ext).read_bytes(), Path(str(b) + ext).read_bytes()
        assert left == right, f"{ext} differs: {len(left)} vs {len(right)} bytes"
        assert len(left) > 100


def rerun_resumes(command: list[str], env: dict, killed_stderr: str, kept: int) -> None:
    """Run ``command`` again after a killed driver that left ``kept`` finished parts: it must
    succeed, say it resumed at least those parts, and submit at least 2 tasks fewer."""
    import re
    import subprocess

    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150)
    assert again.returncode == 0, again.stderr
    resumed = re.search(r"\((\d+) resumed\)", again.stdout)
    assert resumed and int(resumed.group(1)) >= kept >= 2  # tasks of the dead driver may finish late
    assert _tasks(again.stderr) <= _tasks(killed_stderr) - 2  # finished parts are not redone


def _tasks(stderr: str) -> int:
    return int(stderr.split("ray: ")[1].split(" task(s)")[0])
