"""Deterministic generated texts for preprocess tests (importable: ``from preprocess_texts import
make_texts``; a ``conftest`` module cannot be imported by name when pytest collects several test
folders that each have one)."""

from __future__ import annotations

import random

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "data",
    "token",
    "loader",
    "Megatron",
    "héllo",
    "wörld",
    "日本語",
    "中文",
    "Ελληνικά",
    "русский",
    "emoji🙂",
    "123",
    "4567",
    "3.14",
    "don't",
    "it's",
    "CAPS",
    "snake_case",
    "x",
    "(",
    ")",
    "{",
    "}",
    ",",
    ".",
    "!",
    "?",
    "def",
    "return",
]
SEPARATORS = [" ", " ", " ", "  ", "\n", "\t", "\n\n", " \n"]


def make_texts(n: int, seed: int = 0, max_words: int = 60) -> list[str]:
    """``n`` deterministic texts (some empty) mixing scripts, digits, code and whitespace."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        k = rng.choice([0, 1, 3, rng.randint(1, max_words)])
        parts = []
        for _ in range(k):
            parts.append(rng.choice(WORDS))
            parts.append(rng.choice(SEPARATORS))
        texts.append("".join(parts).rstrip(" ") if rng.random() < 0.5 else "".join(parts))
    return texts
