"""``tokenload state STATE_FILE`` on a damaged state file that still parses as JSON: a renamed
key, a missing field, ``sources`` not a list of objects, a wrong type anywhere. The command
exits 0 (the damage is in a field it does not read) or 2 with one line, a StateError naming the
field, never a traceback; a hypothesis property mutates a real state's JSON at random."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import run_cli, write_documents
from tokenload.cli.main import main
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.loader import build_dataloader


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> dict:
    """A real loader state: a computed blend of three files with a weights schedule, a skip and
    96 samples served, so every field ``tokenload state`` prints is present."""
    folder = tmp_path_factory.mktemp("state")
    rng = np.random.default_rng(1)
    blend = []
    for name in ("a", "b", "c"):
        docs = [rng.integers(1, 500, size=int(k)) for k in rng.integers(5, 60, size=80)]
        blend += ["1", write_documents(folder / name, docs)]
    config = MegatronDataConfig(
        sequence_length=16,
        blend=blend,
        split="100,0,0",
        order="computed",
        weights_schedule=[(0, [1, 1, 0]), (48, [0, 1, 2])],
    )
    train = build_datasets(config, [400, 0, 0])[0]
    assert train is not None
    loader = build_dataloader(train, micro_batch_size=4, num_workers=0)
    loader.skip(samples=8)
    it = iter(loader)
    for _ in range(24):
        next(it)
    saved = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    assert saved["accounting"]["sources"] and saved["accounting"]["schedule"] is not None
    return saved


def _run(state, tmp_path: Path, capsys, *flags: str) -> tuple[int, str, str]:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    code = main(["state", *flags, str(path)])  # an exception here is the traceback a user saw
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenload state: error: "), err
    return lines[0]


DAMAGE = {
    "a renamed key": (
        lambda s: s["accounting"].update(sources_=s["accounting"].pop("sources")),
        "field accounting.sources is missing, expected a list of objects",
    ),
    "a missing field": (
        lambda s: s["accounting"]["sources"][1].pop("drawn"),
        "field accounting.sources[1].drawn is missing, expected an integer",
    ),
    "sources not a list": (
        lambda s: s["accounting"].update(sources={"a": 1}),
        "field accounting.sources is {'a': 1} (dict), expected a list of objects",
    ),
    "a source not an object": (
        lambda s: s["accounting"]["sources"].__setitem__(0, "a"),
        "field accounting.sources[0] is 'a' (str), expected an object",
    ),
    "a string count": (
        lambda s: s["accounting"]["sources"][2].update(samples="12"),
        "field accounting.sources[2].samples is '12' (str), expected an integer",
    ),
    "a skip without samples": (
        lambda s: s["accounting"]["skips"][0].pop("samples"),
        "field accounting.skips[0].samples is missing",
    ),
    "weights not numbers": (
        lambda s: s["accounting"]["schedule"].update(weights=["x"]),
        "field accounting.schedule.weights is ['x'] (list), expected a list of",
    ),
    "a schedule not an object": (
        lambda s: s["accounting"].update(schedule=[1]),
        "field accounting.schedule is [1] (list), expected an object",
    ),
    "a renamed schedule key": (
        lambda s: s["accounting"]["schedule"].update(at=s["accounting"]["schedule"].pop("entry")),
        "field accounting.schedule.entry is missing",
    ),
    "accounting a list": (
        lambda s: s.update(accounting=[]),
        "field accounting is [] (list), expected an object",
    ),
    "consumed_samples a string": (
        lambda s: s.update(consumed_samples="96"),
        "field consumed_samples is '96' (str), expected an integer",
    ),
    # what the loader refuses of any state, whatever its data (red-team findings: exit 0)
    "another version": (
        lambda s: s.update(version=999),
        "loader state version is 999, expected 1",
    ),
    "malformed skips": (
        lambda s: s.update(skips=[[5, -3]]),
        "loader state 'skips' is malformed",
    ),
    "consumed_samples not the mixture's": (
        lambda s: s.update(consumed_samples=10**30),
        "the state's mixture was saved after 104 samples, its consumed_samples is 10000",
    ),
}


def test_the_real_state_prints(state, tmp_path, capsys):
    code, out, err = _run(state, tmp_path, capsys)
    assert code == 0 and err == "" and "global samples consumed" in out


@pytest.mark.parametrize("case", DAMAGE)
def test_each_damage_is_one_state_error_naming_the_field(state, tmp_path, capsys, case):
    damaged = copy.deepcopy(state)
    damage, expected = DAMAGE[case]
    damage(damaged)
    line = _one_line_error(*_run(damaged, tmp_path, capsys)[::2])
    assert expected in line, line
    assert "HINT:" in line


def test_the_command_line_prints_one_line_and_exits_2(state, tmp_path):
    damaged = copy.deepcopy(state)
    damaged["accounting"]["sources"] = [{"name": "x"}]
    path = tmp_path / "state.json"
    path.write_text(json.dumps(damaged))
    out = run_cli("state", path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "field accounting.sources[0].drawn is missing" in out.stderr


# -- random damage ---------------------------------------------------------------------------------

_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(0, 5), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _paths(value, prefix=()) -> list[tuple]:
    """Every path to a value inside a JSON document (the root excluded)."""
    out = []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        out.append((*prefix, key))
        out += _paths(item, (*prefix, key))
    return out


def _mutate(document, data) -> None:
    """One random damage: a value replaced, a key removed or renamed, a list emptied."""
    paths = _paths(document)
    path = data.draw(st.sampled_from(paths))
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    action = data.draw(st.sampled_from(["replace", "remove", "rename", "empty"]))
    if action == "replace":
        parent[key] = data.draw(_VALUES)
    elif action == "remove":
        parent.pop(key)
    elif action == "rename" and isinstance(parent, dict):
        parent[data.draw(st.text(max_size=6)) + "_"] = parent.pop(key)
    elif isinstance(parent[key], (list, dict)):
        parent[key] = type(parent[key])()


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), count=st.integers(1, 4), as_json=st.booleans())
def test_random_damage_exits_0_or_2_with_one_line(state, tmp_path, capsys, data, count, as_json):
    damaged = copy.deepcopy(state)
    for _ in range(count):
        _mutate(damaged, data)
    code, out, err = _run(damaged, tmp_path, capsys, *(["--json"] if as_json else []))
    if code == 0:
        assert err == "" and out
    else:
        line = _one_line_error(code, err)
        assert "state" in line
