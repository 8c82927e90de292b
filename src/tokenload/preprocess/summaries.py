"""What a finished part of a preprocess job wrote, as records: the content of the markers in the
work folder (``workdir``), which the executors (``executor``) return and ``outputs`` sums.

A whole input file's marker is a ``FileSummary`` (``.done``; the local executor's also says where
the file's tokens start in the output it writes once), a byte range's (Ray's executor) a
``RangeSummary`` (``.range``). The records are the markers' JSON field for field
(``to_json``/``from_json``), so a work folder left by an earlier run reads back as the same
records and a marker's bytes do not change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PartSummary:
    """What a finished part (a whole input file, or a byte range of one) wrote."""

    path: str
    """The input file's path, as listed."""
    stamp: str
    """The input file's size, modification and change times and inode when it was read (see
    ``inputs``)."""
    documents: int
    tokens: Mapping[str, int]
    """Tokens written per key."""
    skipped: Mapping[str, int]
    """Skipped records (and blank lines, unreadable files) by reason."""

    @property
    def bad_records(self) -> int:
        """Records skipped for being bad (blank lines are no records)."""
        return sum(n for reason, n in self.skipped.items() if reason != "blank_line")

    def to_json(self) -> dict[str, Any]:
        """The marker's content."""
        return {
            "path": self.path,
            "stamp": self.stamp,
            "documents": self.documents,
            "tokens": dict(self.tokens),
            "skipped": dict(sorted(self.skipped.items())),
        }

    @staticmethod
    def _common(data: Mapping[str, Any]) -> dict[str, Any] | None:
        """The shared fields of a marker's content; None when one is missing or of a wrong type."""
        try:
            fields = {
                "path": data["path"],
                "stamp": data["stamp"],
                "documents": data["documents"],
                "tokens": dict(data["tokens"]),
                "skipped": dict(data["skipped"]),
            }
        except (KeyError, TypeError, ValueError):
            return None
        if not (isinstance(fields["path"], str) and isinstance(fields["stamp"], str)):
            return None
        return fields if isinstance(fields["documents"], int) else None


@dataclass(frozen=True)
class FileSummary(PartSummary):
    """A finished input file: its ``.done`` marker."""

    parts: tuple[str, ...] | None = None
    """Name stems of its parts in the work folder, in order; None: the one part named after the
    file's number (or none, when ``offsets`` says where its tokens are)."""
    offsets: Mapping[str, int] | None = None
    """Per key, the position (in tokens) of the file's first token in the output being written
    once (the local executor's; its work folder then keeps only the part's index, see
    ``workdir``); None: the tokens are in the parts' files."""

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        if self.parts is not None:
            data["parts"] = list(self.parts)
        if self.offsets is not None:
            data["offsets"] = dict(self.offsets)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileSummary | None:
        """The record of a ``.done`` marker's content; None when it is not one."""
        fields = cls._common(data)
        if fields is None:
            return None
        parts, offsets = data.get("parts"), data.get("offsets")
        if parts is not None and not (
            isinstance(parts, list) and all(isinstance(p, str) for p in parts)
        ):
            return None
        if offsets is not None and not (
            isinstance(offsets, dict)
            and all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in offsets.items())
        ):
            return None
        return cls(
            **fields,
            parts=None if parts is None else tuple(parts),
            offsets=None if offsets is None else dict(offsets),
        )


@dataclass(frozen=True)
class RangeSummary(PartSummary):
    """A finished byte range of an input file (Ray's executor): its ``.range`` marker."""

    span: tuple[int, int]
    """The byte range [start, end) of the file."""
    lines: int
    """Lines of the file before the range's end (numbers the file's lines for skipped records)."""

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "range": list(self.span), "lines": self.lines}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RangeSummary | None:
        """The record of a ``.range`` marker's content; None when it is not one."""
        fields = cls._common(data)
        span, lines = data.get("range"), data.get("lines")
        if fields is None or not isinstance(lines, int):
            return None
        if not (
            isinstance(span, list) and len(span) == 2 and all(isinstance(b, int) for b in span)
        ):
            return None
        return cls(**fields, span=(span[0], span[1]), lines=lines)


@dataclass(frozen=True)
class Totals:
    """What a whole run wrote: its files' summaries summed (the outputs' sidecar and the result)."""

    documents: int
    tokens: dict[str, int]
    """Tokens per key (every key present, 0 when none)."""
    skipped: dict[str, int]
    """Skipped records by reason, in sorted order."""

    @classmethod
    def of(cls, summaries: Iterable[PartSummary], keys: tuple[str, ...]) -> Totals:
        skipped: Counter[str] = Counter()
        documents, tokens = 0, Counter({k: 0 for k in keys})
        for s in summaries:
            documents += s.documents
            tokens.update(s.tokens)
            skipped.update(s.skipped)
        return cls(documents, dict(tokens), dict(sorted(skipped.items())))
