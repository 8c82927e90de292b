"""The token file prefixes near one that does not exist: what a "no such index" error suggests.

A user most often misses a prefix by giving the output prefix of ``preprocess`` (``out/corpus``,
whose files are ``out/corpus_text_document.bin/.idx``), a folder (``out`` or ``out/``), or a
typo. The existing prefixes of the folder it names (a pair ``NAME.idx`` + ``NAME.bin``) are
ranked: those that start with the name given, shortest first, then the closest spellings
(``difflib``), then the rest in name order. One listing of one local folder; a URL is not listed.
"""

from __future__ import annotations

import difflib
import os

_SHOWN = 3


def nearest_prefixes(prefix: str, limit: int = _SHOWN) -> list[str]:
    """Up to ``limit`` existing token file prefixes nearest to ``prefix`` (in its folder, or in
    it when it is a folder), written as the user would pass them; [] when there are none."""
    if "://" in prefix:
        return []
    if os.path.isdir(prefix):
        folder, stem = prefix, ""
    else:
        folder, stem = os.path.split(prefix)
    try:
        names = set(os.listdir(folder or "."))
    except OSError:
        return []
    stems = sorted(n[:-4] for n in names if n.endswith(".idx") and n[:-4] + ".bin" in names)
    starting = sorted((s for s in stems if stem and s.startswith(stem)), key=lambda s: (len(s), s))
    close = difflib.get_close_matches(stem, stems, n=limit, cutoff=0.6) if stem else []
    ranked = list(dict.fromkeys([*starting, *close, *stems]))
    return [os.path.join(folder, s) if folder else s for s in ranked[:limit]]


def missing_prefix_hint(prefix: str) -> str | None:
    """The hint for a prefix whose ``.idx`` does not exist: the nearest existing prefixes, or
    that its folder holds none; None for a URL (not listed)."""
    if "://" in prefix:
        return None
    near = nearest_prefixes(prefix)
    where = prefix if os.path.isdir(prefix) else os.path.dirname(prefix) or "."
    if not near:
        return (
            f"{where} holds no token files (PREFIX.idx + PREFIX.bin); check the path prefix: it"
            " names both files, without the extension"
        )
    others = f" (other prefixes there: {', '.join(near[1:])})" if len(near) > 1 else ""
    return (
        f"did you mean {near[0]}?{others}; a prefix names PREFIX.idx and PREFIX.bin, without the"
        " extension"
    )


def folder_message(prefix: str) -> str | None:
    """The message for a folder given where a prefix was expected; None when it is none."""
    if "://" in prefix or not os.path.isdir(prefix):
        return None
    return f"{prefix} is a folder, not a token file prefix (PREFIX names PREFIX.idx and PREFIX.bin)"
