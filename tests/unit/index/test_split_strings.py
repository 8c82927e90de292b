"""Split strings: every one accepted is read exactly as megatron-core reads it, and the rest is a
ConfigError naming ``split`` (``--split`` on the command line).

The independent model is megatron-core 0.19.2's ``parse_and_normalize_split`` written out below
(every run of digits and dots a number, missing numbers 0, ``normalize``'s float64 NumPy sum).
megatron-core reads any character between the numbers as a separator, so ``"90;10"``, ``"90 10"``
or ``"abc"`` (three zeros, then a division by zero) pass through it silently; tokenload accepts
the separators Megatron's lineage names, ``,`` (megatron-core's documented form, spaces allowed)
and ``/`` (Megatron-LM's legacy parser and GPT-NeoX split on it by name), and refuses the rest.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenload.cli.vocabulary import error_in_flags
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import ConfigError
from tokenload.index.splits import parse_split, split_matrix


def megatron_core_split(split: str) -> list[float]:
    """megatron-core's parse_and_normalize_split, operation for operation."""
    values = list(map(float, re.findall(r"[.0-9]+", split)))
    values = values + [0.0 for _ in range(3 - len(values))]
    assert len(values) == 3 and all(v >= 0.0 for v in values)
    w = np.array(values, dtype=np.float64)
    return (w / np.sum(w)).tolist()


_NUMBERS = st.one_of(
    st.integers(0, 10**6).map(str),
    st.tuples(st.integers(0, 999), st.integers(0, 999)).map(lambda t: f"{t[0]}.{t[1]}"),
    st.integers(0, 999).map(lambda n: f".{n}"),
    st.integers(0, 999).map(lambda n: f"{n}."),
)
_SPACE = st.sampled_from(["", " ", "  ", "\t"])


@st.composite
def megatron_split_strings(draw) -> str:
    """Up to 3 numbers, one separator kind (',' or '/'), spaces anywhere around the numbers."""
    numbers = draw(st.lists(_NUMBERS, min_size=1, max_size=3))
    sep = draw(st.sampled_from([",", "/"]))
    quote = draw(st.sampled_from(["", "'", '"']))  # Megatron-LM's scripts pass '99,1,0' quoted
    return quote + sep.join(f"{draw(_SPACE)}{n}{draw(_SPACE)}" for n in numbers) + quote


@given(megatron_split_strings())
def test_megatrons_forms_are_read_as_megatron_core_reads_them(split):
    if not any(float(n) > 0 for n in re.findall(r"[.0-9]+", split)):
        with pytest.raises(ConfigError) as info:
            parse_split(split)
        assert info.value.field == "split"
        return
    assert parse_split(split) == megatron_core_split(split)  # the same floats, bit for bit


@given(st.text(alphabet="0123456789.,/ ;|:-_xe\t'", max_size=12))
def test_any_string_is_megatron_cores_reading_or_a_config_error_naming_split(split):
    try:
        weights = parse_split(split)
    except ConfigError as exc:
        assert exc.field == "split" and exc.message.startswith(f"split is {split!r}")
        return
    assert weights == megatron_core_split(split)
    inner = split.strip().strip("'")  # one pair of enclosing quotes at most
    assert split.count("'") in (0, 2) and "'" not in inner
    assert not set(inner) - set("0123456789., /\t")  # only numbers, one separator kind, spaces
    assert not ("," in split and "/" in split)


@pytest.mark.parametrize(
    ("split", "found"),
    [
        ("abc", "'abc' is no number"),
        ("90;10", "'90;10' is no number"),
        ("90 10", "'90 10' is no number"),
        ("90|5|5", "'90|5|5' is no number"),
        ("90,5/5", "',' and '/' are mixed"),
        ("1e3,1", "'1e3' is no number"),
        ("99,1,0,", "'' is no number"),
        ("", "'' is no number"),
        ("0,0,0", "weights summing to 0.0"),
        ("-1,2", "a negative number"),
        ("1,2,3,4", "4 numbers"),
    ],
)
def test_other_strings_are_refused_naming_split_and_the_form(split, found):
    with pytest.raises(ConfigError) as info:
        split_matrix(split)  # what every Megatron-order and computed-order build parses
    exc = info.value
    assert exc.field == "split" and exc.message.startswith(f"split is {split!r}")
    assert found in exc.message
    message, hint = error_in_flags(exc)  # the command line's words
    assert message.startswith("--split is ")
    assert "`split=" not in (hint or "")


def test_the_documented_forms_are_accepted():
    assert parse_split("969, 30, 1") == [0.969, 0.03, 0.001] == parse_split("969/30/1")
    assert (
        parse_split("99,1,0") == parse_split("99/1") == parse_split(" 99 , 1 ") == [0.99, 0.01, 0.0]
    )
    assert parse_split("100") == [1.0, 0.0, 0.0]
    assert parse_split("'99,1,0'") == parse_split('"99,1,0"') == parse_split("99,1,0")
    with pytest.raises(ConfigError, match="is no number"):
        parse_split("'99,1,0")  # an unmatched quote


@pytest.mark.parametrize("order", ["megatron", "computed"])
def test_the_builds_refuse_it_naming_split(tmp_path, order):
    config = MegatronDataConfig(sequence_length=8, blend=["a"], split="90;10", order=order)
    with pytest.raises(ConfigError) as info:
        build_datasets(config, [10, 0, 0])  # the split is parsed before any file is opened
    assert info.value.field == "split" and "'90;10' is no number" in info.value.message
