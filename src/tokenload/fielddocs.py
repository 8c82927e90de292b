"""``help()`` for the configuration dataclasses: each field with its type, its default and the
docstring written under it in the class body (an attribute docstring, which Python itself keeps
nowhere). ``FieldDocs`` is the metaclass that appends them to the class's own docstring, read from
the class's source the first time ``__doc__`` is asked for (``help``, ``pydoc``, ``inspect``), so
importing costs nothing; without the source (a build without ``.py`` files) the class's own
docstring stands alone."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["FieldDocs", "documented", "field_docs"]


class FieldDocs(type):
    """Metaclass of a dataclass whose ``__doc__`` lists its fields (module docstring), once
    ``documented`` has marked it finished (until then, as while ``dataclass`` processes it, its
    own docstring alone)."""

    @property  # made when first read (type's own __doc__ is a plain attribute)
    def __doc__(cls) -> str | None:  # type: ignore[override]
        own: str | None = cls.__dict__.get("__doc__")
        if not cls.__dict__.get("_fields_documented"):
            return own
        made = cls.__dict__.get("_field_docs")
        if made is None:
            made = field_docs(cls)
            type.__setattr__(cls, "_field_docs", made)
        return f"{own}\n\n{made}" if own and made else own


def documented(cls: type[T]) -> type[T]:
    """Mark a finished class of metaclass ``FieldDocs``: its ``__doc__`` lists its fields from
    now on (apply it above ``@dataclass``)."""
    type.__setattr__(cls, "_fields_documented", True)
    return cls


def field_docs(cls: Any) -> str:
    """``Fields`` and a line per field (name, annotation, default) with its docstring indented
    under it, in the order of the class body; "" when the source cannot be read."""
    import ast  # (here: help() is rare, and no import pays for it)
    import inspect
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(cls))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return ""
    body = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    if body is None:
        return ""
    lines = ["Fields:"]
    items = body.body
    for node, after in zip(items, [*items[1:], None]):
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        annotation = ast.get_source_segment(source, node.annotation) or "?"
        default = "" if node.value is None else f" = {ast.get_source_segment(source, node.value)}"
        lines.append(f"    {node.target.id}: {annotation}{default}")
        doc = after.value.value if _is_docstring(after) else None  # type: ignore[union-attr]
        if doc:
            lines.extend(f"        {line}".rstrip() for line in inspect.cleandoc(doc).splitlines())
    return "\n".join(lines) if len(lines) > 1 else ""


def _is_docstring(node: Any) -> bool:
    import ast

    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )
