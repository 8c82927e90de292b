"""Split strings: read exactly as megatron-core 0.19.2 reads them, and a ConfigError naming
``split`` (``--split`` on the command line) where megatron-core raises.

megatron-core's ``parse_and_normalize_split`` takes every run of digits and dots as a number,
whatever lies between them (``"99:1"``, ``"99 1 0"``, ``"90;10"`` and even ``"-1,2"`` or
``"1e3"``, read as 1 and 3), pads to 3 with zeros and normalizes with a float64 NumPy sum. It
raises on a run ``float`` cannot read (``"1.2.3"``) and on more than 3 numbers; weights summing
to 0 (``""``, ``"abc"``) give NaN fractions on which its builder raises. The reference is
megatron-core's own output in tests/fixtures/megatron/split_strings.json, and its function
written out below for the generated strings.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

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
    with np.errstate(invalid="ignore", divide="ignore"):  # a sum of 0: NaN, as there
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


FIXTURE = Path(__file__).parents[2] / "fixtures" / "megatron" / "split_strings.json"
FIXTURE_CASES = json.loads(FIXTURE.read_text())["cases"]


@pytest.mark.parametrize("case", FIXTURE_CASES, ids=[repr(c["split"]) for c in FIXTURE_CASES])
def test_split_strings_as_megatron_core_reads_them(case):
    """Its vector and split matrix, the same floats (and the int 0 the matrix starts with)."""
    split = case["split"]
    if "megatron_error" in case:
        with pytest.raises(ConfigError) as info:
            split_matrix(split)
        assert info.value.field == "split" and info.value.message.startswith(f"split is {split!r}")
        return
    assert parse_split(split) == case["vector"]
    matrix = split_matrix(split)
    assert [None if b is None else list(b) for b in matrix] == case["matrix"]
    assert [type(b[0]) for b in matrix if b] == [type(b[0]) for b in case["matrix"] if b]


def test_the_fixture_holds_the_forms_in_question():
    splits = {c["split"] for c in FIXTURE_CASES if "megatron_error" not in c}
    assert {"99:1", "99 1 0", "99,1", "1", "0.5,0.5", "969,30,1", "100,0,0", "-1,2"} <= splits
    refused = {c["split"] for c in FIXTURE_CASES if "megatron_error" in c}
    assert {"1,1,1,1", "", "a,b", "1.2.3", "0,0,0"} <= refused


@given(megatron_split_strings())
def test_megatrons_forms_are_read_as_megatron_core_reads_them(split):
    if not any(float(n) > 0 for n in re.findall(r"[.0-9]+", split)):
        with pytest.raises(ConfigError) as info:
            parse_split(split)
        assert info.value.field == "split"
        return
    assert parse_split(split) == megatron_core_split(split)  # the same floats, bit for bit


@given(st.text(alphabet="0123456789.,/ ;|:-_xe\t'", max_size=12))
def test_any_string_is_megatron_cores_reading_or_a_config_error_where_it_raises(split):
    try:
        expected = megatron_core_split(split)
    except (ValueError, AssertionError):
        expected = None
    if expected is None or any(np.isnan(expected)):
        with pytest.raises(ConfigError) as info:
            parse_split(split)
        assert info.value.field == "split" and info.value.message.startswith(f"split is {split!r}")
        return
    assert parse_split(split) == expected


@pytest.mark.parametrize(
    ("split", "found"),
    [
        ("abc", "read as the weights [0.0, 0.0, 0.0] summing to 0.0"),
        ("", "summing to 0.0"),
        ("0,0,0", "summing to 0.0"),
        ("1.2.3", "'1.2.3' is no number"),
        ("99,1,0,.", "'.' is no number"),
        ("1,2,3,4", "4 numbers"),
    ],
)
def test_what_megatron_core_raises_on_is_refused_naming_split(split, found):
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
    assert parse_split("99:1") == parse_split("99 1 0") == parse_split("99,1") == [0.99, 0.01, 0.0]
    assert parse_split("100") == [1.0, 0.0, 0.0]
    assert parse_split("'99,1,0'") == parse_split('"99,1,0"') == parse_split("99,1,0")
    assert parse_split("'99,1,0") == [0.99, 0.01, 0.0]  # an unmatched quote is skipped too


def test_a_skipped_sign_or_exponent_is_read_as_megatron_core_reads_it_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tokenload"):
        assert parse_split("-1,2") == megatron_core_split("-1,2") == [1 / 3, 2 / 3, 0.0]
        assert parse_split("1e3") == [0.25, 0.75, 0.0]
    messages = [r.getMessage() for r in caplog.records]
    assert any("'-1,2' is read as megatron-core reads it" in m and "'-'" in m for m in messages)
    assert any("'1e3'" in m and "'e'" in m for m in messages)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tokenload"):
        parse_split("99:1")
        parse_split(" '98 / 2' ")
    assert not caplog.records  # separators, spaces and quotes need no warning


@pytest.mark.parametrize("order", ["megatron", "computed"])
def test_the_builds_refuse_it_naming_split(tmp_path, order):
    config = MegatronDataConfig(sequence_length=8, blend=["a"], split="9.0.1;10", order=order)
    with pytest.raises(ConfigError) as info:
        build_datasets(config, [10, 0, 0])  # the split is parsed before any file is opened
    assert info.value.field == "split" and "'9.0.1' is no number" in info.value.message
