"""The tokenload error tree.

Every error a user can cause is a ``TokenloadError`` that also subclasses the builtin a caller
would catch (``FormatError`` is a ``ValueError``, ``StorageError`` an ``OSError``, ...). Messages
follow one shape: what was found, what was expected, and a ``HINT:`` line saying what to do.
"""

from __future__ import annotations

import os

__all__ = [
    "TokenloadError",
    "FormatError",
    "ConfigError",
    "RecordError",
    "StorageError",
    "CacheError",
    "StateError",
    "MissingExtraError",
]


class TokenloadError(Exception):
    """Base of every error tokenload raises for bad input, configuration or environment."""

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.path = None if path is None else os.fspath(path)
        self.hint = hint
        text = message if self.path is None else f"{self.path}: {message}"
        if hint:
            text = f"{text}\nHINT: {hint}"
        super().__init__(text)

    def __reduce__(self):  # keep the keyword arguments through pickling (DataLoader workers)
        return (_rebuild, (type(self), self.message, self.path, self.hint))


def _rebuild(cls, message, path, hint):
    return cls(message, path=path, hint=hint)


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


class MissingExtraError(TokenloadError, ImportError):
    """An optional dependency is needed for the requested feature and is not installed."""


def require(module: str, extra: str, feature: str):
    """Import ``module`` or raise ``MissingExtraError`` naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{feature} needs the Python package '{module}', which is not installed ({exc})",
            hint=f"pip install 'tokenload[{extra}]'",
        ) from None
