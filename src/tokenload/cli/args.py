"""Argument types shared by the subcommands: a bad value is refused while parsing, with the
subcommand's usage, before any work starts (defined with Megatron's flags, used by every
command)."""

from __future__ import annotations

from ..megatron_args import at_least, positive

__all__ = ["at_least", "positive"]
