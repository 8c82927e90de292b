"""Argument types shared by the subcommands: a bad value is refused while parsing, with the
subcommand's usage, before any work starts."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive(kind: Callable[[str], int | float]) -> Callable[[str], int | float]:
    """An argparse ``type`` that parses with ``kind`` and refuses zero and negative values."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            noun = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse
