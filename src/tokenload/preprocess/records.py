"""Turn one input chunk into documents: the text of each key per record, and the bad records.

Megatron-LM's rules: each JSON line is one document; a key's value is its text, and a list of
strings is taken as the document's sentences (each one a sequence). A record that cannot give
every key a text is bad as a whole (skipping one key alone would misalign the per-key outputs).
Bad-record reasons: ``malformed_json``, ``not_utf8``, ``not_object``, ``missing_key``,
``not_text``. Blank lines of a JSONL file and empty lines of a ``lines`` file are no documents
and no error; they are counted as ``blank_line``. An empty text is a document with no sequence.

With ``strict`` the first bad record raises RecordError naming ``file:line`` and the reason;
otherwise it is counted and a few examples are kept for the log.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import RecordError
from .sources import Chunk

_SKIP_HINT = (
    "fix or remove the record, or pass `on_bad_record='skip'` to skip and count bad records"
)
_COLUMN_HINT = "name the column that holds the text in `json_keys=`"
_MAX_EXAMPLES = 5


class BadRecord(NamedTuple):
    """One bad record: where it is and why. Kept apart (not one string) so that a task which read
    a byte range of a file, and so knew only its line numbers within the range, can be shifted
    to the file's line numbers by the driver (``shifted``)."""

    path: str
    line: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}: {self.message}"

    def shifted(self, lines: int) -> BadRecord:
        return self._replace(line=self.line + lines)

    def error(self) -> RecordError:
        """The error strict mode raises; it carries this record (``error.record``)."""
        where = f"{self.path}:{self.line}"
        whole_file = self.reason == "missing_key" and self.message.startswith("no column")
        hint = _COLUMN_HINT if whole_file else _SKIP_HINT  # a column is missing from every row
        exc = RecordError(f"{self.reason}: {self.message}", path=where, hint=hint)
        exc.record = self  # type: ignore[attr-defined]
        return exc


@dataclass
class Parsed:
    """The documents of one chunk: ``columns[k][d]`` is key k's text (or sentence list) of doc d."""

    columns: list[list[Any]]
    documents: int = 0
    has_lists: bool = False
    skipped: Counter[str] = field(default_factory=Counter)
    examples: list[BadRecord] = field(default_factory=list)


class _Bad:
    """Records a bad record: raise in strict mode, count otherwise."""

    def __init__(self, parsed: Parsed, path: str, strict: bool) -> None:
        self.parsed, self.path, self.strict = parsed, path, strict

    def __call__(self, reason: str, line: int, message: str) -> None:
        record = BadRecord(self.path, line, reason, message)
        if self.strict:
            raise record.error()
        self.parsed.skipped[reason] += 1
        if len(self.parsed.examples) < _MAX_EXAMPLES:
            self.parsed.examples.append(record)


def parse_chunk(chunk: Chunk, keys: tuple[str, ...], strict: bool) -> Parsed:
    """The documents of ``chunk`` for ``keys`` (text inputs fill the single key)."""
    parsed = Parsed(columns=[[] for _ in keys])
    bad = _Bad(parsed, chunk.path, strict)
    if chunk.format == "jsonl":
        _parse_jsonl(chunk, keys, parsed, bad)
    elif chunk.format == "lines":
        _parse_lines(chunk, parsed, bad)
    elif chunk.format == "text":
        _parse_text(chunk, parsed, bad)
    else:
        _parse_parquet(chunk, keys, parsed, bad)
    return parsed


def _lines(payload: bytes) -> list[bytes]:
    lines = payload.split(b"\n")
    if payload.endswith(b"\n"):
        lines.pop()
    return lines


#: Mean line length (bytes) from which a JSONL chunk's lines are read as views of the chunk
#: rather than split out as copies: the copy costs more than the per-line call for long lines
#: (14 KB documents: 20% of parsing), and a 500 MB line is not held twice.
VIEW_LINE_BYTES = 1024


def _line_views(payload: bytes) -> Iterator[memoryview]:
    """The lines of ``payload`` as ``_lines`` gives them, as views of it (no copy)."""
    view, find = memoryview(payload), payload.find
    start, end = 0, len(payload)
    while (stop := find(b"\n", start)) >= 0:
        yield view[start:stop]
        start = stop + 1
    if start < end or end == 0:
        yield view[start:]


def _parse_jsonl(chunk: Chunk, keys: tuple[str, ...], parsed: Parsed, bad: _Bad) -> None:
    from orjson import JSONDecodeError, loads

    columns = parsed.columns
    payload = chunk.payload
    long_lines = len(payload) >= VIEW_LINE_BYTES * (payload.count(b"\n") + 1)
    lines: Iterable[bytes | memoryview] = _line_views(payload) if long_lines else _lines(payload)
    for number, line in enumerate(lines, chunk.first):
        try:
            record = loads(line)
        except JSONDecodeError as exc:
            record, error = _MISSING, exc
            if isinstance(line, memoryview):  # the bytes of the line decide, as without views
                line = bytes(line)
                try:
                    record = loads(line)
                except JSONDecodeError as again:
                    error = again
            if record is _MISSING:
                _not_a_record(line, number, error, parsed, bad)
                continue
        if type(record) is not dict:
            bad("not_object", number, f"a JSON {_json_type(record)} where an object was expected")
            continue
        values = []
        for key in keys:
            value = record.get(key, _MISSING)
            if type(value) is not str and _check_value(value, key, record, number, bad, parsed):
                break
            values.append(value)
        else:
            for column, value in zip(columns, values):
                column.append(value)
            parsed.documents += 1


_MISSING = object()


def _not_a_record(line: bytes, number: int, error: Exception, parsed: Parsed, bad: _Bad) -> None:
    """Count or report a line that is no JSON: blank, not UTF-8, or malformed."""
    if not line.strip():
        parsed.skipped["blank_line"] += 1
    elif problem := _utf8_error(line):
        bad("not_utf8", number, problem)
    else:
        bad("malformed_json", number, f"not valid JSON ({error})")


def _check_value(
    value: Any, key: str, record: dict[str, Any], number: int, bad: _Bad, parsed: Parsed
) -> bool:
    """True (after reporting) when ``value`` is not a text; a list of strings is one."""
    if value is _MISSING:
        present = ", ".join(repr(k) for k in list(record)[:8]) or "none"
        bad("missing_key", number, f"no key {key!r} (keys present: {present})")
        return True
    if type(value) is list and all(type(v) is str for v in value):
        parsed.has_lists = True
        return False
    bad(
        "not_text",
        number,
        f"key {key!r} holds a JSON {_json_type(value)}, expected a string or a list of strings",
    )
    return True


def _json_type(value: Any) -> str:
    names = {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "number",
        float: "number",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def _utf8_error(line: bytes) -> str | None:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            f"not valid UTF-8 (byte 0x{line[exc.start]:02x} at byte offset {exc.start} of the line)"
        )
    return None


def _parse_lines(chunk: Chunk, parsed: Parsed, bad: _Bad) -> None:
    column = parsed.columns[0]
    try:  # the whole chunk at once; line by line only when some line is not UTF-8
        lines: list[Any] = chunk.payload.decode("utf-8").split("\n")
        if chunk.payload.endswith(b"\n"):
            lines.pop()
    except UnicodeDecodeError:
        lines = _lines(chunk.payload)
    for number, text in enumerate(lines, chunk.first):
        if isinstance(text, bytes):
            problem = _utf8_error(text)
            if problem:
                bad("not_utf8", number, problem)
                continue
            text = text.decode("utf-8")
        if text.endswith("\r"):
            text = text[:-1]
        if not text:
            parsed.skipped["blank_line"] += 1
            continue
        column.append(text)
        parsed.documents += 1


def _parse_text(chunk: Chunk, parsed: Parsed, bad: _Bad) -> None:
    try:
        text = chunk.payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = chunk.payload.count(b"\n", 0, exc.start) + 1
        bad("not_utf8", line, f"not valid UTF-8 (byte 0x{chunk.payload[exc.start]:02x})")
        return
    parsed.columns[0].append(text)
    parsed.documents += 1


def _parse_parquet(chunk: Chunk, keys: tuple[str, ...], parsed: Parsed, bad: _Bad) -> None:
    if isinstance(chunk.payload, dict):  # a requested column is missing from the file
        missing = next(k for k in keys if k not in chunk.payload["names"])
        present = ", ".join(repr(n) for n in chunk.payload["names"][:8])
        for row in range(chunk.payload["rows"]):
            bad("missing_key", chunk.first + row, f"no column {missing!r} (columns: {present})")
        return
    values = [chunk.payload.column(k).to_pylist() for k in keys]
    for row, record in enumerate(zip(*values)):
        number = chunk.first + row
        texts = []
        for key, value in zip(keys, record):
            if type(value) is bytes:
                problem = _utf8_error(value)
                if problem:
                    bad("not_utf8", number, f"column {key!r}: {problem}")
                    break
                value = value.decode("utf-8")
            if type(value) is not str and _check_value(value, key, {}, number, bad, parsed):
                break
            texts.append(value)
        else:
            for column, text in zip(parsed.columns, texts):
                column.append(text)
            parsed.documents += 1
