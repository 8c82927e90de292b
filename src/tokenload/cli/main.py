"""``tokenload`` entry point: builds the argparse tree from the subcommand modules and turns
user errors into one line on stderr and exit status 2.

Each module listed in ``COMMANDS`` exposes ``register(subparsers)``, which adds its
subcommand parsers and sets ``func`` on each (a callable taking the parsed namespace and returning
an exit status). Every subcommand's ``--help`` shows its description and its defaults; a flag the
subcommand does not know is reported with that subcommand's usage and the closest flags it has.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import select
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .. import __version__
from ..errors import TokenloadError
from .vocabulary import error_in_flags

#: Modules under tokenload.cli that register subcommands, in the order ``--help`` lists them.
COMMANDS = ("demo", "preprocess", "tokenfiles", "cache", "doctor", "state", "provenance")

#: Exit status when the reader of our output goes away (``tokenload info ... | head``): the one
#: a shell reports for a process ended by SIGPIPE, as ``cat`` or ``grep`` would be.
BROKEN_PIPE_STATUS = 128 + 13


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that appends ``(default: X)`` to every option with a meaningful default (not None,
    not a store_true's False, not already written in the help text)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            or not action.option_strings
        ):
            return action.help
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


_USAGE_LINES = 8
"""A usage of more lines than this is shortened in an error (``SubcommandParser.error``)."""


class SubcommandParser(argparse.ArgumentParser):
    """The parser class of every subcommand: help with defaults, and every usage error followed by
    a "did you mean" for each flag of the command line this subcommand does not know."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)
        self._seen: list[str] = []

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> Any:
        self._seen = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if self.get_default("given_flags") is not None:  # a subcommand that asks for them
            parsed.given_flags = self.given_flags(self._seen)
        return parsed, extras

    def given_flags(self, words: Sequence[str]) -> tuple[str, ...]:
        """The flags of this subcommand that ``words`` give (an abbreviation or ``--flag=value``
        as its flag), by their long names in the parser's order: a flag given at its default
        value (``--seed 1234``) is given, which comparing the parsed value with the default
        cannot tell. ``words`` are parsed again into a namespace whose every value is a marker,
        which argparse replaces only for the flags given."""
        unset = object()
        flagged = [a for a in self._actions if a.option_strings and a.dest != argparse.SUPPRESS]
        probe = argparse.Namespace(**{a.dest: unset for a in flagged})
        argparse.ArgumentParser.parse_known_args(self, list(words), probe)
        return tuple(
            next((s for s in a.option_strings if s.startswith("--")), a.option_strings[0])
            for a in flagged
            if getattr(probe, a.dest) is not unset
        )

    def error(self, message: str) -> NoReturn:
        """The usage, then the error on its own line, as argparse prints them; a usage longer than
        a few lines (prepare-cache's flags: about 60) is one line pointing at ``--help``, so
        that the error is not lost above a screen of flags."""
        hints = did_you_mean(self, self._seen)
        usage = self.format_usage()
        if usage.count("\n") > _USAGE_LINES:
            usage = f"usage: {self.prog} [flags]  (`{self.prog} --help` lists them)\n"
        sys.stderr.write(usage)
        text = f"{message} ({hints})" if hints else message
        self.exit(2, f"{self.prog}: error: {text}\n")

    def error_about(self, message: str, flags: Sequence[str]) -> NoReturn:
        """``error`` with a "did you mean" for ``flags`` only (a training job's command line:
        its other flags are Megatron's, not typos)."""
        self._seen = list(flags)
        self.error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenload",
        description="LLM pretraining data: raw text -> Megatron token files -> batches for every"
        " rank.",
    )
    parser.add_argument("--version", action="version", version=f"tokenload {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=SubcommandParser
    )
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    for (
        choice
    ) in sub._choices_actions:  # a subcommand without its own description shows its help line
        command = sub.choices[choice.dest]
        if command.description is None and choice.help:
            command.description = choice.help[0].upper() + choice.help[1:] + "."
    return parser


def subcommand_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``command`` in the tree ``build_parser`` made."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen: argparse.ArgumentParser = action.choices[command]
            return chosen
    raise KeyError(command)


def did_you_mean(command_parser: argparse.ArgumentParser, words: Sequence[str]) -> str:
    """For each flag in ``words`` that ``command_parser`` does not know, its closest known flags
    (``--append_eod`` -> ``--append-eod``), as one phrase; empty when every flag is known."""
    known = [s for a in command_parser._actions for s in a.option_strings if s.startswith("--")]
    normal = {s.replace("_", "-").lower(): s for s in known}
    hints = []
    for word in words:
        flag = word.split("=", 1)[0]
        if not flag.startswith("--") or flag in known or any(k.startswith(flag) for k in known):
            continue  # a value, a known flag, or an abbreviation argparse accepts
        key = flag.replace("_", "-").lower()
        close = (
            [normal[key]]
            if key in normal
            else [normal[c] for c in difflib.get_close_matches(key, normal, n=2)]
        )
        hints.append(
            f"{flag}: did you mean {' or '.join(close)}?" if close else f"{flag}: no such flag"
        )
    return "; ".join(hints)


#: Retries of an endpoint the command has not reached yet (refused, unknown host): 0.5 + 1 + 2 s;
#: one that accepts and stays silent is given up within TOKENLOAD_FIRST_CONTACT_TIMEOUT (50 s).
FIRST_CONTACT_RETRIES = 3


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras and getattr(args, "neox_config", None):  # a NeoX job has no Megatron command line
        from ..datasets.megatron_flags import unknown_flags

        command = subcommand_parser(parser, args.command)
        assert isinstance(command, SubcommandParser)
        try:  # a "did you mean" for the flags that are not Megatron's (typos)
            typos = unknown_flags(extras)
        except TokenloadError:
            typos = [word for word in extras if word.startswith("--")]
        command.error_about(
            f"unrecognized arguments: {' '.join(extras)} (with --neox-config the NeoX config is"
            " the job's: a Megatron training command's flags do not apply)",
            typos,
        )
    if extras and getattr(args, "megatron_job_flags", False):  # a training job's command line
        from ..datasets.megatron_flags import check_strays, unknown_flags

        command = subcommand_parser(parser, args.command)
        assert isinstance(command, SubcommandParser)
        try:  # a value after a known flag's own (an unquoted schedule) is no non-data flag's
            check_strays(command, list(sys.argv[1:] if argv is None else argv))
            unknown = unknown_flags(extras)  # Megatron's non-data flags are the job's, not typos
        except TokenloadError as exc:
            command.error_about(one_line(exc), [])
        if unknown:
            command.error_about(f"unrecognized arguments: {' '.join(unknown)}", unknown)
        extras = []
    if extras:  # the subcommand's usage, not the top-level one (argparse exits 2)
        subcommand_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extras)}")
    # Other libraries (botocore's "Found credentials", ...) speak only from WARNING up, unless -v.
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("tokenload").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    from ..storage.remote import fail_fast_before_first_contact

    fail_fast_before_first_contact(
        FIRST_CONTACT_RETRIES
    )  # a mistyped endpoint: seconds, not a minute
    try:
        return _run(args)
    finally:  # main() called in a process that goes on (a test, a notebook) leaves the library
        # as it was
        fail_fast_before_first_contact(None)


def _run(args: argparse.Namespace) -> int:
    """The subcommand, with every failure as one line and an exit status."""
    try:
        return int(args.func(args) or 0)
    except TokenloadError as exc:
        print(f"tokenload {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        return BROKEN_PIPE_STATUS
    except OSError as exc:  # the environment, not tokenload: still one line, never a traceback
        print(f"tokenload {args.command}: error: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tokenload {args.command}: interrupted", file=sys.stderr)
        return 130


def _stdout_closed() -> bool:
    """True when stdout is a pipe whose reader has gone (the kernel reports an error condition on
    its write end); stdout then points at /dev/null so that the interpreter's final flush does not
    report the same broken pipe again."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        closed = any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):  # no file descriptor behind stdout: not ours to judge
        return False
    if closed:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return closed


def one_line(exc: TokenloadError) -> str:
    """The error as a single line: message, then the hint in brackets; the configuration fields
    they name written as the flags that set them (``vocabulary``)."""
    message, hint = error_in_flags(exc)
    text = message if exc.path is None else f"{exc.path}: {message}"
    return f"{text} [HINT: {hint}]" if hint else text


def os_error_line(exc: OSError) -> str:
    """An operating-system error no layer turned into a typed one, as one line with a hint."""
    where = f"{exc.filename}: " if exc.filename else ""
    what = exc.strerror or str(exc) or type(exc).__name__
    return (
        f"{where}{what} ({type(exc).__name__}) [HINT: check that the path exists, is readable or"
        " writable as needed, and that its disk has free space]"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
