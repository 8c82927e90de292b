"""The build manifest's key holds every flag Megatron's hash forgets: a folder prepared with one
value and loaded with the other (``build_policy="none"``: a load from the manifest, no cache
check) is refused or serves the items of the other value, never the first value's samples.
And ``auto``'s one writer is global rank 0, not each node's local rank 0."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.datasets.megatron.manifest import manifest_key, manifest_path
from tokenload.datasets.megatron.policy import Role, resolve
from tokenload.distributed import World
from tokenload.errors import CacheError

SIZES = [120, 7, 0]

# (field, value built with, value loaded with): each pair both ways
CASES = [
    ("add_extra_token", True, False), ("add_extra_token", False, True),
    ("drop_last_partial_validation_sequence", True, False),
    ("drop_last_partial_validation_sequence", False, True),
    ("mid_level_dataset_surplus", 0.005, 0.5), ("mid_level_dataset_surplus", 0.5, 0.005),
]


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(8)
    docs = [[rng.integers(0, 999, 3 + (i * 5) % 17) for i in range(80)] for _ in range(2)]
    prefixes = [write_documents(folder / name, d) for name, d in zip(("a", "b"), docs)]
    return ["40", prefixes[0], "60", prefixes[1]]


def _config(blend, **kw) -> MegatronDataConfig:
    return MegatronDataConfig(sequence_length=8, blend=blend, split="80,20,0", **kw)


def _items(datasets) -> list[np.ndarray]:
    """Every item of train and valid: all fields (``add_extra_token`` moves only the labels)."""
    out = []
    for d in datasets[:2]:
        items = d.__getitems__(list(range(len(d))))
        out += [np.asarray(items[k]) for k in sorted(items)]
    return out


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.shape == y.shape and bool(np.array_equal(x, y)) for x, y in zip(a, b))


@pytest.mark.parametrize(("field", "built", "loaded"), CASES,
                         ids=[f"{f}={b}->{v}" for f, b, v in CASES])
def test_a_folder_prepared_with_another_value_is_never_served_as_this_one(
    tmp_path, blend, field, built, loaded
):
    cache = str(tmp_path / "cache")
    build_datasets(_config(blend, path_to_cache=cache, **{field: built}), SIZES)
    wanted = _items(build_datasets(_config(blend, cache="off", **{field: loaded}), SIZES))
    other = _items(build_datasets(_config(blend, cache="off", **{field: built}), SIZES))
    assert not _same(wanted, other)  # the field changes the samples: the case can catch a mix-up

    loading = _config(blend, path_to_cache=cache, build_policy="none", **{field: loaded})
    key = manifest_key(loading, SIZES)
    built_key = manifest_key(_config(blend, **{field: built}), SIZES)
    assert manifest_path(cache, key) != manifest_path(cache, built_key)
    try:
        served = _items(build_datasets(loading, SIZES))
    except CacheError as exc:
        assert field in str(exc) or "stale" in str(exc) or "missing" in str(exc), exc
    else:
        assert _same(served, wanted)


@pytest.mark.parametrize("field", sorted({c[0] for c in CASES}))
def test_manifest_key_differs_by_each_forgotten_field(blend, field):
    a = next(c for c in CASES if c[0] == field)
    base = _config(blend)
    keys = [manifest_key(dataclasses.replace(base, **{field: v}), SIZES) for v in a[1:]]
    assert keys[0] != keys[1] and keys[0][field] != keys[1][field]


@pytest.mark.parametrize(("rank", "local_rank", "role"), [
    (0, 0, Role.WRITE), (1, 1, Role.CHECK), (2, 0, Role.CHECK), (3, 1, Role.CHECK),
    (4, 0, Role.CHECK),
])
def test_auto_has_one_writer_in_the_job_not_one_per_node(rank, local_rank, role):
    """Ranks 2 and 4 are local rank 0 of nodes 1 and 2: a writer per node would make several
    processes write one shared cache; ``auto`` writes from global rank 0 only."""
    world = World(rank=rank, world_size=6, local_rank=local_rank, local_world_size=2)
    assert resolve("auto", world, "auto") == (role, False)
    worlds = [World(rank=r, world_size=6, local_rank=r % 2, local_world_size=2) for r in range(6)]
    writers = [resolve("auto", w, "auto")[0] for w in worlds]
    assert writers.count(Role.WRITE) == 1


def test_a_packed_plan_made_by_other_rules_is_never_loaded_from_its_manifest(
    tmp_path, blend, monkeypatch
):
    # a folder prepared by a tokenload whose packed plan had another layout: under "none" its
    # manifest is not found (the plan's rules are in its key) and its caches, named by those
    # rules too, are reported missing with the command that prepares them; never a KeyError or
    # another plan's rows
    from tokenload.datasets.megatron import manifest as manifest_module
    from tokenload.datasets.megatron import packed as packed_module

    cache = str(tmp_path / "cache")
    made = build_datasets(_config(blend, packing="best-fit", path_to_cache=cache), SIZES)
    want = _items(made)
    other = ("an earlier layout", *packed_module.PLAN_IDENTITY[1:])
    with monkeypatch.context() as m:
        m.setattr(packed_module, "PLAN_LAYOUT", other[0])
        m.setattr(manifest_module, "PLAN_IDENTITY", other)
        with pytest.raises(CacheError, match="missing") as info:
            build_datasets(
                _config(blend, packing="best-fit", path_to_cache=cache, build_policy="none"), SIZES
            )
        assert "tokenload prepare-cache" in str(info.value) and "--packing best-fit" in str(
            info.value
        )
    loaded = build_datasets(
        _config(blend, packing="best-fit", path_to_cache=cache, build_policy="none"), SIZES
    )
    assert _same(_items(loaded), want)


def test_a_manifest_entry_with_other_arrays_than_its_kind_is_not_used(tmp_path, blend, caplog):
    # a manifest naming arrays this code does not read for the entry's kind (a hand-edited one,
    # or one an older layout wrote under the same key) is ignored: the caches are checked one
    # by one and serve the same items
    import json
    import logging

    cache = tmp_path / "cache"
    config = _config(blend, packing="best-fit", path_to_cache=str(cache))
    want = _items(build_datasets(config, SIZES))
    (path,) = cache.glob("*-tokenload-build.json")
    data = json.loads(path.read_text())
    for entry in data["splits"]:
        for member in [entry, *(entry or {}).get("members", [])]:
            if member and member.get("kind") == "packed":
                arrays = member["arrays"]
                arrays["window_index"] = arrays.pop("piece_part")  # an older layout's names
                member["digests"]["window_index"] = member["digests"].pop("piece_part")
    path.write_text(json.dumps(data))
    none = dataclasses.replace(config, build_policy="none")
    with caplog.at_level(logging.WARNING):
        got = _items(build_datasets(none, SIZES))
    assert _same(got, want)
    assert "other arrays than its kind's" in caplog.text
