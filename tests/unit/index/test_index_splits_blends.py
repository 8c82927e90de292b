"""Split strings, split matrices, sequence ranges and blend parsing."""

from __future__ import annotations

import json

import pytest

from tokenload.errors import ConfigError, StorageError
from tokenload.index import (
    Blend,
    normalize,
    parse_blend,
    parse_split,
    read_data_args_file,
    read_per_split_data_args,
    split_matrix,
    split_ranges,
    spoofed_split_matrix,
)


def test_matrix_first_bookend_is_int_zero_and_floats_add_left_to_right():
    m = split_matrix("90/5/5")
    assert m == [(0, 0.9), (0.9, 0.9500000000000001), (0.9500000000000001, 1.0)]
    assert type(m[0][0]) is int and type(m[1][0]) is float
    assert json.dumps(m) == "[[0, 0.9], [0.9, 0.9500000000000001], [0.9500000000000001, 1.0]]"


def test_zero_weight_splits_are_none():
    assert split_matrix("80,20,0") == [(0, 0.8), (0.8, 1.0), None]
    assert split_matrix("0,50,50") == [None, (0.0, 0.5), (0.5, 1.0)]
    assert split_matrix("1") == [(0, 1.0), None, None]


def test_separators_and_spaces():
    assert parse_split("969, 30, 1") == parse_split("969/30/1") == [0.969, 0.03, 0.001]
    assert split_matrix("1,1,1") == [
        (0, 0.3333333333333333),
        (0.3333333333333333, 0.6666666666666666),
        (0.6666666666666666, 1.0),
    ]


@pytest.mark.parametrize(
    ("split", "ranges"),
    [
        ("969, 30, 1", [(0, 969), (969, 999), (999, 1000)]),
        ("99,1,0", [(0, 990), (990, 1000), None]),
    ],
)
def test_ranges_of_1000_sequences(split, ranges):
    assert split_ranges(split_matrix(split), 1000) == ranges


def test_ranges_round_half_to_even():
    # 0.5 * 5 = 2.5 -> 2 (half to even), so train gets [0, 2) and valid [2, 5)
    assert split_ranges(split_matrix("1,1"), 5) == [(0, 2), (2, 5), None]
    assert split_ranges(split_matrix("1,1,1"), 100000) == [
        (0, 33333), (33333, 66667), (66667, 100000)
    ]


def test_spoofed_matrix_for_per_split_blends():
    assert spoofed_split_matrix(1) == [None, (0.0, 1.0), None]


@pytest.mark.parametrize("bad", ["1,2,3,4", "0,0,0", "1..2,3", 7])
def test_bad_splits(bad):
    with pytest.raises(ConfigError):
        split_matrix(bad)


def test_a_minus_is_skipped_as_megatron_core_skips_it():
    assert split_matrix("90,-5,5") == split_matrix("90,5,5")  # megatron-core 0.19.2: [.9, .05, .05]


def test_normalize_is_numpy_float64():
    assert normalize([30, 70]) == [0.3, 0.7]
    assert normalize([1, 1, 1]) == [1 / 3] * 3
    with pytest.raises(ConfigError):
        normalize([0, 0])


def test_list_forms():
    assert parse_blend(["30", " p1 ", "70", "p2"]) == Blend(prefixes=("p1", "p2"),
                                                            weights=(30.0, 70.0))
    assert parse_blend("p1 p2 p3") == Blend(prefixes=("p1", "p2", "p3"))
    assert parse_blend(["p1", "p2"]) == Blend(prefixes=("p1", "p2"))  # even, non-numeric
    assert parse_blend(None) is None


def test_megatron_half_consumed_iterator_quirk():
    # the first unparsable weight comes after a parsable one: accepted as four prefixes
    assert parse_blend(["1", "p1", "x", "p2"]) == Blend(prefixes=("1", "p1", "x", "p2"))
    # a parsable weight after the first unparsable one: Megatron asserts
    with pytest.raises(ConfigError):
        parse_blend(["x", "p1", "1", "p2"])


@pytest.mark.parametrize("bad", [[], ["0", "p1"], ["-1", "p1", "2", "p2"], ["nan", "p"]])
def test_bad_blends(bad):
    with pytest.raises(ConfigError):
        parse_blend(bad)


def test_blend_weights_must_be_numbers():
    with pytest.raises(ConfigError):
        Blend(prefixes=("a",), weights=("1",))
    with pytest.raises(ConfigError):
        Blend(prefixes=("a",), weights=(True,))
    with pytest.raises(ConfigError):
        Blend(prefixes=("a", "b"), weights=(1.0,))


def test_data_args_file(tmp_path):
    path = tmp_path / "args.txt"
    path.write_text("30 p1\n70\tp2\n")
    assert read_data_args_file(path) == Blend(prefixes=("p1", "p2"), weights=(30.0, 70.0))
    with pytest.raises(StorageError):
        read_data_args_file(tmp_path / "missing.txt")


def test_per_split_json(tmp_path):
    path = tmp_path / "split.json"
    path.write_text(json.dumps({"train": "30 p1 70 p2", "valid": ["p3"], "test": None}))
    train, valid, test = read_per_split_data_args(path)
    assert train == Blend(prefixes=("p1", "p2"), weights=(30.0, 70.0))
    assert valid == Blend(prefixes=("p3",)) and test is None
    path.write_text(json.dumps({"train": "p1"}))
    with pytest.raises(ConfigError, match="train, valid, test"):
        read_per_split_data_args(path)
    path.write_text("{not json")
    with pytest.raises(ConfigError):
        read_per_split_data_args(path)


def test_to_list_round_trips():
    b = Blend(prefixes=("p1", "p2"), weights=(0.25, 3.0))
    assert parse_blend(b.to_list()) == b


@pytest.mark.parametrize(("items", "match", "hint"), [
    (["0.3", "A", "B"], "odd number of items, so every item is a prefix, '0.3' included", "give each prefix"),
    (["A_text_document.bin"], "names a file, not a token file's prefix", "write 'A_text_document'"),
    (["0.5", "a", "0.5", "b.idx"], "'b.idx' names a file", "write 'b'"),
])
def test_a_blend_megatron_would_fail_on_later_is_refused_saying_why(items, match, hint):
    """``--data-path 0.3 A B`` (a weight lost) reads '0.3' as a prefix, as Megatron does, which
    then failed as '0.3.idx: cannot read the index'; a prefix given as its '.bin' or '.idx'
    opened the pair but named the caches after the file, so a job without the suffix found no
    cache (new users' findings). Both are ConfigErrors saying what to write."""
    with pytest.raises(ConfigError, match=match) as info:
        parse_blend(items)
    assert info.value.hint.startswith(hint)
    assert parse_blend(["A", "B", "C"]) is not None and parse_blend(["1", "a", "2", "b"]) is not None
