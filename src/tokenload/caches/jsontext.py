"""``json.dumps`` text, byte for byte, made by orjson where that is certain.

The cache files' JSON (Megatron's description, ``indent=4``; the sidecar, ``indent=1`` with
sorted keys; the build manifest, ``indent=1``) must keep its bytes: the description's md5 is
the cache key. With ``indent`` set, ``json.dumps`` runs its pure-Python encoder (~8 ms for the
description of a 100-prefix blend, ~0.1 ms per sidecar); orjson writes the same text in
microseconds when the value holds nothing the two spell differently. ``dumps`` checks that
first (``_plain``) and otherwise calls ``json.dumps`` itself:

* orjson indents by 2 and has no ``ensure_ascii``: its output is re-indented by replacing each
  pair of spaces, which is exact when no string holds two spaces in a row, and it must be
  printable ASCII (``json.dumps`` escapes everything else, DEL included);
* floats: both print the shortest round-trip digits, but below 1e-4 Python uses an exponent
  (``1e-05``) where orjson may not (``0.00001``): when the value holds such a float, every float
  token of orjson's text (outside strings, found by one regular expression that consumes strings
  whole) is rewritten as ``repr(float(token))``, which is ``json.dumps``'s spelling because the
  token reads back as exactly the same float; NaN and infinity differ: those go to ``json.dumps``;
* keys must be ``str`` and integers fit 64 bits; any other type (a numpy scalar, an enum)
  goes to ``json.dumps`` (which raises for what it cannot encode, as before).

``loads`` parses with orjson and falls back to ``json.loads`` on what orjson refuses
(``NaN``, an infinite number) and on text holding a run of 19 digits or more, where orjson
would read an integer beyond 64 bits as a float: both give the same values.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

__all__ = ["dumps", "loads", "plain_copy"]

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_INF = float("inf")
_LONG_DIGITS = re.compile(r"[0-9]{19}")
_LONG_DIGITS_BYTES = re.compile(rb"[0-9]{19}")


# A JSON string (kept as it is) or a number token with a fraction or an exponent (a float).
_STRING_OR_FLOAT = re.compile(
    rb'"[^"\\]*(?:\\.[^"\\]*)*"|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)'
)


def _float_as_python(match: re.Match[bytes]) -> bytes:
    token = match.group()
    if token[:1] == b'"':
        return token
    return repr(float(token)).encode("ascii")


_PLAIN, _SMALL_FLOATS = 1, 2


def _plain(obj: Any) -> bool:
    """Whether orjson's text of ``obj`` re-indented is ``json.dumps``'s (module docstring)."""
    return _kind(obj) != 0


def _kind(obj: Any) -> int:
    """0: not for orjson; ``_PLAIN``: orjson's text re-indented is ``json.dumps``'s;
    ``_SMALL_FLOATS``: the same once its float tokens are spelled as Python spells them."""
    kind = _PLAIN
    stack = [obj]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is str:
            if "  " in x:
                return 0
        elif t is dict or t.__base__ is dict:  # dict, OrderedDict
            for k, v in x.items():
                if type(k) is not str or "  " in k:
                    return 0
                stack.append(v)
        elif t is list or t is tuple:
            stack.extend(x)
        elif t is float:
            if not (x == 0.0 or 1e-4 <= abs(x) < _INF):  # NaN fails too
                if not 0.0 < abs(x) < 1e-4:  # NaN, infinity
                    return 0
                kind = _SMALL_FLOATS
        elif t is int:
            if not _INT_MIN <= x <= _INT_MAX:
                return 0
        elif x is not None and t is not bool:
            return 0
    return kind


def dumps(obj: Any, *, indent: int, sort_keys: bool = False) -> str:
    """``json.dumps(obj, indent=indent, sort_keys=sort_keys)``, the same text."""
    kind = _kind(obj) if indent >= 1 else 0
    if kind:
        option = orjson.OPT_INDENT_2 | (orjson.OPT_SORT_KEYS if sort_keys else 0)
        try:
            raw = orjson.dumps(obj, option=option)
        except (orjson.JSONEncodeError, TypeError):
            raw = b""
        if raw and raw.isascii() and b"\x7f" not in raw:
            if kind == _SMALL_FLOATS:
                raw = _STRING_OR_FLOAT.sub(_float_as_python, raw)
            return raw.replace(b"  ", b" " * indent).decode("ascii")
    return json.dumps(obj, indent=indent, sort_keys=sort_keys)


def loads(data: bytes | str) -> Any:
    """``json.loads(data)``: the same values."""
    long_digits = _LONG_DIGITS_BYTES if isinstance(data, bytes) else _LONG_DIGITS
    if long_digits.search(data) is None:  # type: ignore[arg-type]  # the pattern fits the type
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def plain_copy(obj: Any) -> Any:
    """``json.loads(json.dumps(obj))``: ``obj`` as it reads back from JSON (tuples as lists)."""
    if _plain(obj):
        try:
            return orjson.loads(orjson.dumps(obj))
        except (orjson.JSONEncodeError, TypeError):
            pass
    return json.loads(json.dumps(obj))
