"""The tokenload error tree.

Every error a user can cause is a ``TokenloadError`` that also subclasses the builtin a caller
would catch (``FormatError`` is a ``ValueError``, ``StorageError`` an ``OSError``, ...). Messages
follow one shape: what was found, what was expected, and a ``HINT:`` line saying what to do.

Messages speak the library's vocabulary: a setting is named by the keyword argument that sets it,
written between backticks with an ``=`` (``FIELD``): `` `inputs=` ``, or with the value to give,
as Python writes it or a placeholder, `` `on_bad_record='skip'` ``, `` `eod_id=N` ``. A message
that states a field's bad value begins with the field, ``workers is 0, expected at least 1``, and
the error names it (``field="workers"``). The command line shows the same errors with each such
field rewritten as its flag (one table, ``tokenload.cli.vocabulary``: ``--on-bad-record skip``,
``--workers is 0``). A hint that asks to run a command quotes the command as typed
(`` `tokenload verify --hashes` ``): it names no field.
"""

from __future__ import annotations

import os
import re
from types import ModuleType
from typing import Any

__all__ = [
    "TokenloadError",
    "FormatError",
    "ConfigError",
    "RecordError",
    "StorageError",
    "CacheError",
    "StateError",
    "MissingExtraError",
    "FIELD",
    "fields_named",
]

#: A configuration field in a message or hint: its keyword and ``=`` between backticks, then the
#: value to give (Python's spelling or a placeholder such as ``N``) or nothing. Group 1 is the
#: keyword, group 2 the value ('' when none). (A reST literal in double backticks is none.)
FIELD = re.compile(r"(?<!`)`([A-Za-z_][A-Za-z0-9_]*)=([^`]*)`(?!`)")


def fields_named(text: str) -> list[str]:
    """The configuration fields ``text`` names (see ``FIELD``), in order of appearance."""
    return [match.group(1) for match in FIELD.finditer(text)]


class TokenloadError(Exception):
    """Base of every error tokenload raises for bad input, configuration or environment."""

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        hint: str | None = None,
        field: str | None = None,
    ) -> None:
        """``field``: the configuration field whose value ``message`` states, as its first word."""
        self.message = message
        self.path = None if path is None else os.fspath(path)
        self.hint = hint
        self.field = field
        text = message if self.path is None else f"{self.path}: {message}"
        if hint:
            text = f"{text}\nHINT: {hint}"
        super().__init__(text)

    @property
    def fields(self) -> list[str]:
        """The configuration fields the message and hint name (each one's keyword)."""
        stated = [self.field] if self.field else []
        return stated + fields_named(self.message) + fields_named(self.hint or "")

    def __reduce__(self) -> tuple[Any, ...]:  # keep the keyword arguments through pickling
        return (_rebuild, (type(self), self.message, self.path, self.hint, self.field))


def _rebuild(
    cls: type[TokenloadError],
    message: str,
    path: str | None,
    hint: str | None,
    field: str | None = None,
) -> TokenloadError:
    return cls(message, path=path, hint=hint, field=field)


class FormatError(TokenloadError, ValueError):
    """A token file (``.bin``/``.idx``/sidecar/cache file) is not what its format requires."""


class ConfigError(TokenloadError, ValueError):
    """A configuration value, blend, split or option combination is invalid."""


class RecordError(TokenloadError, ValueError):
    """An input record (a JSON line, a parquet row, a text file) cannot be turned into tokens."""


class StorageError(TokenloadError, OSError):
    """Bytes could not be read from or written to where they live (disk or object storage)."""


class CacheError(ConfigError):
    """An index cache is stale (and policy forbids a rebuild), unreadable, or cannot be written
    where the configuration points: a configuration problem, hence a ConfigError."""


class StateError(TokenloadError, ValueError):
    """A saved loader state does not match the data or configuration it is loaded into."""


class ForeignStateError(StateError):
    """A state saved for other data or another order (its fingerprint differs): the loader's
    refusal names what this dataset reads (``loader.state.refusal_hint``)."""


class MissingExtraError(TokenloadError, ImportError):
    """An optional dependency is needed for the requested feature and is not installed."""


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise ``MissingExtraError`` naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{feature} needs the Python package '{module}', which is not installed ({exc})",
            hint=f"tokenload is not on a package index: pip install '.[{extra}]' in its clone",
        ) from None
