"""The loader's typed doors (issue 37): ``build_dataloader`` takes every ``LoaderConfig`` option
as an explicit typed keyword (a misspelt one is a type error for mypy and a ``TypeError`` for
Python), or a ``LoaderConfig``, or both; ``loader.metrics()`` is described by
``loader.report.MetricsReport``, whose keys are checked here against what the loader returns."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing

import numpy as np
import pytest

from support import mypy_snippet, write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import ConfigError
from tokenload.loader import LoaderConfig, build_dataloader
from tokenload.loader.report import MetricsReport


class Items:
    """A map-style dataset: 48 samples of 4 tokens, sample i all i."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> dict:
        return {"tokens": np.full(4, i, dtype=np.int64)}


def test_every_loader_option_is_a_keyword_of_build_dataloader_with_its_type():
    """No ``**kwargs``: each field of LoaderConfig is a keyword-only parameter whose type is the
    field's (plus the "not given" marker), so a type checker sees each one."""
    parameters = inspect.signature(build_dataloader).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    options = {name: p for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY}
    fields = {f.name: f for f in dataclasses.fields(LoaderConfig)}
    assert set(options) == set(fields) | {"consumed_samples"}
    hints = typing.get_type_hints(build_dataloader)
    config_hints = typing.get_type_hints(LoaderConfig)
    for name in fields:
        given = set(typing.get_args(hints[name]) or (hints[name],))
        declared = set(typing.get_args(config_hints[name]) or (config_hints[name],))
        assert declared < given and len(given - declared) == 1, name  # the field's type + marker


def test_a_misspelt_option_is_a_type_error():
    with pytest.raises(TypeError, match="num_worker"):
        build_dataloader(Items(), micro_batch_size=4, num_worker=0)  # type: ignore[call-arg]


_SNIPPET = """
from tokenload.loader import LoaderConfig, build_dataloader


class Items:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        return {}


build_dataloader(Items(), micro_batch_size=4, num_workers=0, worker_timeout=None)
build_dataloader(Items(), LoaderConfig(micro_batch_size=4), num_workers=0)
build_dataloader(Items(), micro_batch_size=4, num_worker=0)
build_dataloader(Items(), micro_batch_size="4")
"""


def test_mypy_finds_a_misspelt_option_and_a_wrong_type(tmp_path):
    out, status = mypy_snippet(tmp_path, _SNIPPET)
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1, out
    lines = sorted(int(line.split(":")[1]) for line in errors)
    assert lines == [15, 16], out  # the two last calls, not the first two
    assert 'Unexpected keyword argument "num_worker"' in out
    assert '"micro_batch_size"' in out and '"str"' in out


def test_keywords_replace_the_configs_fields_and_defaults_fill_the_rest():
    config = LoaderConfig(micro_batch_size=4, num_workers=0, dp_rank=0, dp_size=1, drop_last=False)
    loader = build_dataloader(Items(), config, micro_batch_size=8, kind="cyclic")
    assert loader.config == dataclasses.replace(config, micro_batch_size=8, kind="cyclic")
    assert build_dataloader(Items(), config).config == config
    loader = build_dataloader(Items(), micro_batch_size=4, dp_rank=0, dp_size=1)
    assert loader.config == LoaderConfig(micro_batch_size=4, dp_rank=0, dp_size=1)
    # a keyword given as its default value still replaces the config's value
    assert build_dataloader(Items(), config, num_workers=2).config.num_workers == 2
    assert build_dataloader(Items(), config, dp_rank=None).config.dp_rank is None


def test_batches_are_the_same_through_either_door():
    config = LoaderConfig(micro_batch_size=4, num_workers=0, dp_rank=0, dp_size=1)
    by_config = [b["tokens"][:, 0].tolist() for b in build_dataloader(Items(), config)]
    by_keywords = [
        b["tokens"][:, 0].tolist()
        for b in build_dataloader(Items(), micro_batch_size=4, num_workers=0, dp_rank=0, dp_size=1)
    ]
    assert by_config == by_keywords == [list(range(k, k + 4)) for k in range(0, 48, 4)]


@pytest.mark.parametrize(
    ("args", "keywords", "match"),
    [
        ((), {}, "no micro_batch_size"),
        ((16,), {}, "config is a int, expected a LoaderConfig"),
        ((), {"micro_batch_size": 4, "kind": "random"}, "kind is 'random'"),
        ((LoaderConfig(micro_batch_size=4),), {"num_workers": -1}, "num_workers is -1"),
    ],
)
def test_bad_options_are_config_errors(args, keywords, match):
    with pytest.raises(ConfigError, match=match):
        build_dataloader(Items(), *args, **keywords)


def _conforms(value, hint, where: str) -> list[str]:
    """Where ``value`` differs from the type ``hint`` (a TypedDict: exactly its keys, each value
    of its type; lists, dicts, unions and plain types followed down)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if typing.is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, expected a dict"]
        hints = typing.get_type_hints(hint)
        if set(value) != set(hints):
            return [f"{where}: keys {sorted(value)}, expected {sorted(hints)}"]
        return [e for k, h in hints.items() for e in _conforms(value[k], h, f"{where}.{k}")]
    if origin in (typing.Union, types.UnionType):
        found = [_conforms(value, a, where) for a in args]
        return [] if any(not f for f in found) else found[0]
    if hint is typing.Any:
        return []
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, expected a list"]
        return [e for i, v in enumerate(value) for e in _conforms(v, args[0], f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, expected a dict"]
        return [e for k, v in value.items() for e in _conforms(v, args[1], f"{where}.{k}")]
    if hint is type(None):
        return [] if value is None else [f"{where}: {value!r}, expected None"]
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    return [] if ok else [f"{where}: {value!r}, expected {hint}"]


def test_the_metrics_report_has_exactly_the_typed_keys_before_and_after_batches(tmp_path):
    """Every room of ``metrics()``, the packed rows', the job's and the workers' (with a fault)
    included, has the keys and value types ``loader.report.MetricsReport`` declares."""
    rng = np.random.default_rng(3)
    prefixes = [
        write_documents(
            tmp_path / f"src{s}", [rng.integers(1, 1000, n) for n in rng.integers(1, 90, 300)]
        )
        for s in range(2)
    ]
    config = MegatronDataConfig(
        sequence_length=32,
        order="computed",
        packing="best-fit",
        split="1,0,0",
        random_seed=7,
        eod_id=None,
        blend=["0.5", prefixes[0], "0.5", prefixes[1]],
    )
    train, _, _ = build_datasets(config, [128, 0, 0])
    loader = build_dataloader(train, micro_batch_size=8, dp_rank=0, dp_size=1, num_workers=1)
    try:
        before = loader.metrics()
        assert _conforms(before, MetricsReport, "metrics()") == []
        batches = iter(loader)
        next(batches)
        loader.worker_processes[0].kill()  # a fault, so that workers.faults holds one
        for _ in range(7):  # past what it made ahead (prefetch 4): the replacement's batches
            next(batches)
        loader.skip(8)  # a skip, so that job.skips holds one
        assert list(batches)
        after = loader.metrics()
    finally:
        loader.close()
    assert _conforms(after, MetricsReport, "metrics()") == []
    assert after["packing"] is not None and after["job"] is not None and after["job"]["skips"]
    assert after["workers"]["faults"] and after["startup"]["first_batch_s"] is not None
