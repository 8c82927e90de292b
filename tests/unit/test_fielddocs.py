"""``help()`` of the configuration dataclasses lists every field with its type, default and the
docstring written under it in the class body (``tokenload.fielddocs``)."""

from __future__ import annotations

import dataclasses
import pydoc

import pytest

from tokenload.datasets import MegatronDataConfig
from tokenload.datasets.flat import FlatDatasetConfig
from tokenload.fielddocs import FieldDocs, documented
from tokenload.loader import LoaderConfig


@pytest.mark.parametrize("cls", [MegatronDataConfig, LoaderConfig, FlatDatasetConfig])
def test_help_lists_every_field_with_its_default_and_docstring(cls) -> None:
    shown = pydoc.render_doc(cls, renderer=pydoc.TextDoc())
    own = cls.__dict__["__doc__"]
    assert own.splitlines()[0] in shown  # the class's own docstring comes first
    assert shown.index(own.splitlines()[0]) < shown.index("Fields:")
    fields = dataclasses.fields(cls)
    assert fields
    for field in fields:
        assert f"    {field.name}: " in shown, field.name
    doc = cls.__doc__
    assert doc.startswith(own)
    listed = [
        line.strip().split(":")[0] for line in doc.split("Fields:")[1].splitlines() if line[4:5] != " "
    ]
    assert [f for f in listed if f] == [f.name for f in fields]  # in the class body's order


def test_megatron_fields_show_their_defaults_and_their_own_words() -> None:
    doc = MegatronDataConfig.__doc__ or ""
    assert '    packing: str = "concat"\n        How a sample is made of documents' in doc
    assert "    sequence_length: int\n        Tokens per sample (``--seq-length``)." in doc
    assert "    random_seed: int = 1234\n" in doc


def test_a_class_without_source_keeps_its_own_docstring() -> None:
    namespace: dict = {"dataclass": dataclasses.dataclass, "FieldDocs": FieldDocs}
    exec(
        "@dataclass\nclass Made(metaclass=FieldDocs):\n    'Its own words.'\n    x: int = 1\n"
        "    'Not reachable: no source file.'\n",
        namespace,
    )
    made = documented(namespace["Made"])
    assert made.__doc__ == "Its own words."
    assert made(x=2).x == 2


def test_until_marked_finished_the_class_s_own_docstring_stands_alone() -> None:
    """``dataclass`` reads ``__doc__`` while it processes the class: the fields are listed only
    once ``documented`` marks it finished (and the source is read then, not at import)."""

    @dataclasses.dataclass
    class Plain(metaclass=FieldDocs):
        """Plain words."""

        y: int = 3
        """A field."""

    assert Plain.__doc__ == "Plain words."
    documented(Plain)
    assert Plain.__doc__ == "Plain words.\n\nFields:\n    y: int = 3\n        A field."
