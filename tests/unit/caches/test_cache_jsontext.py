"""caches.jsontext: json.dumps's bytes, made by orjson where certain, json.dumps otherwise."""

from __future__ import annotations

import enum
import json
import math
import random
from collections import OrderedDict

import numpy as np
import pytest

from tokenload.caches import jsontext


class Colour(enum.IntEnum):
    RED = 1


CASES = [
    {},
    [],
    {"a": [], "b": {}, "c": [1, {"d": None}], "e": (1, 2.5, True, False)},
    OrderedDict([("z", 1), ("a", OrderedDict([("y", [0.8, 0.0, 1.0]), ("b", None)]))]),
    {"s": 'a b/c\\d"e\tf\ng\x00h\x1f\b\f', "n": -(2**63), "m": 2**64 - 1},
    {"floats": [0.1, 1 / 3, 1e-4, 1e15, 1e16, 1.5e300, -0.0, 123456789012345680.0, 5e-324]},
    # floats below 1e-4: orjson spells them 0.0000..., rewritten as Python spells them
    {"tiny": 1e-05},
    {"tiny": [2.5e-07, -3e-9, 1.2345678901234567e-05, 9.99e-05, 2.5e-310]},
    {"looks like a float 0.00001": ["0.00001", 'q"0.00005', "\\", 1e-05, "1e-05"]},
    # json.dumps's own cases: spelled differently by orjson, so never taken from it
    {"nan": float("nan"), "inf": math.inf},
    {"big": 2**64},
    {"neg": -(2**63) - 1},
    {"two  spaces": 1},
    {"k": "two  spaces"},
    {"é": "ü", "\u2028": "x"},
    {"del": "\x7f"},
    {1: "int key"},
    {"enum": Colour.RED},
]


@pytest.mark.parametrize("indent", [1, 2, 4])
@pytest.mark.parametrize("sort_keys", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_dumps_is_json_dumps_byte_for_byte(case, indent, sort_keys):
    obj = CASES[case]
    assert jsontext.dumps(obj, indent=indent, sort_keys=sort_keys) == json.dumps(
        obj, indent=indent, sort_keys=sort_keys
    )


def test_dumps_random_nested_values():
    rng = random.Random(7)

    def value(depth):
        kind = rng.randrange(7 if depth < 4 else 4)
        if kind == 0:
            return rng.choice([None, True, False, 0, -1, 2**40])
        if kind == 1:
            return rng.uniform(-1, 1) * 10 ** rng.uniform(-8, 20)
        if kind == 2:
            return "".join(rng.choice('ab /\\"\n\t ') for _ in range(rng.randrange(6)))
        if kind == 3:
            return rng.randrange(-(10**12), 10**12)
        if kind == 4:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        if kind == 5:
            return tuple(value(depth + 1) for _ in range(rng.randrange(3)))
        return {f"k{rng.randrange(50)}": value(depth + 1) for _ in range(rng.randrange(4))}

    for _ in range(2000):
        obj = value(0)
        for indent, sort_keys in [(1, True), (4, False), (1, False)]:
            assert jsontext.dumps(obj, indent=indent, sort_keys=sort_keys) == json.dumps(
                obj, indent=indent, sort_keys=sort_keys
            )


def test_small_floats_are_spelled_by_orjson_then_rewritten(monkeypatch):
    """A blend of 10,000 prefixes has weights below 1e-4: its description and manifest must not
    fall back to json's pure-Python encoder (seconds for a 22 MB manifest)."""
    weights = [1.0 / 20_000 + i * 1e-9 for i in range(10_000)]
    obj = {"weights": weights, "paths": [f"/d/p{i:05d} 0.00001" for i in range(10_000)]}

    def refuse(*args, **kwargs):
        raise AssertionError("json.dumps called")

    want = json.dumps(obj, indent=4)
    monkeypatch.setattr(jsontext.json, "dumps", refuse)
    assert jsontext.dumps(obj, indent=4) == want


def test_dumps_raises_what_json_raises():
    with pytest.raises(TypeError):
        jsontext.dumps({"a": np.int64(3)}, indent=1)
    with pytest.raises(TypeError):
        jsontext.dumps({"a": {1, 2}}, indent=1)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_plain_copy_and_loads_are_jsons(case):
    obj = CASES[case]
    want = json.loads(json.dumps(obj))
    got = jsontext.plain_copy(obj)
    assert json.dumps(got) == json.dumps(want)  # NaN != NaN: compare the texts
    text = json.dumps(obj, indent=1)
    assert json.dumps(jsontext.loads(text)) == json.dumps(json.loads(text))
    assert json.dumps(jsontext.loads(text.encode())) == json.dumps(json.loads(text.encode()))


@pytest.mark.parametrize(
    "text",
    [
        "1e400",
        "[-1e400, 1E5, 1.0e-400]",
        "-9223372036854775809",
        "18446744073709551615",
        '{"h": "1234567890123456789012"}',
        "[NaN, Infinity]",
    ],
)
def test_loads_reads_what_json_reads(text):
    assert repr(jsontext.loads(text)) == repr(json.loads(text))
    assert repr(jsontext.loads(text.encode())) == repr(json.loads(text.encode()))


def test_loads_refuses_what_json_refuses():
    with pytest.raises(ValueError):
        jsontext.loads(b"{not json")
