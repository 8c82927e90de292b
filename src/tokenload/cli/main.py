"""``tokenload`` entry point: builds the argparse tree from the subcommand modules and turns
user errors into one line on stderr and exit status 2.

Each module listed in ``COMMANDS`` exposes ``register(subparsers)``, which adds its
subcommand parsers and sets ``func`` on each (a callable taking the parsed namespace and returning
an exit status).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

from .. import __version__
from ..errors import TokenloadError

#: Modules under tokenload.cli that register subcommands, in the order ``--help`` lists them.
COMMANDS = ("demo", "preprocess", "tokenfiles")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenload",
        description="LLM pretraining data: raw text -> Megatron token files -> batches for every rank.",
    )
    parser.add_argument("--version", action="version", version=f"tokenload {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except TokenloadError as exc:
        print(f"tokenload {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tokenload {args.command}: interrupted", file=sys.stderr)
        return 130


def one_line(exc: TokenloadError) -> str:
    """The error as a single line: message, then the hint in brackets."""
    text = exc.message if exc.path is None else f"{exc.path}: {exc.message}"
    return f"{text} [HINT: {exc.hint}]" if exc.hint else text


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
