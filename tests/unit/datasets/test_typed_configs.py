"""The typed configs (issue 37, point 1): ``MegatronDataConfig`` is a flat façade converted once
into a shared ``DataConfig`` and one record per order; an option given to an order that does not
read it is a ConfigError naming both; ``build_datasets`` dispatches on the record's type and
returns ``Splits`` of ``LoaderDataset | None`` (mypy's ``reveal_type`` says so, not ``Any``);
the manifest key and the prepare command read the typed records, and the key is the one earlier
versions wrote (a prepared folder still loads)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import textwrap

import numpy as np
import pytest

from support import mypy_snippet, write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.datasets.build import build_typed
from tokenload.datasets.computed import ComputedGPTDataset
from tokenload.datasets.config import (
    ComputedOptions,
    DataConfig,
    MegatronOptions,
    NeoxOptions,
    Splits,
    TypedConfig,
    fields_for_order,
)
from tokenload.datasets.megatron import GPTDataset
from tokenload.datasets.megatron.manifest import manifest_key, manifest_path
from tokenload.datasets.megatron.policy import prepare_command
from tokenload.datasets.neox import NeoXGPTDataset
from tokenload.errors import ConfigError
from tokenload.index import Blend
from tokenload.index.schedule import check_schedule

# Which orders take each order-only field, and a value that no other order takes: written here
# from the fields' documentation, independently of the library's own table.
READ_BY = {
    "path_to_cache": ({"megatron"}, "/cache"),
    "cache": ({"megatron"}, "strict"),
    "tokenizer": ({"megatron"}, {"class": "T"}),
    "build_policy": ({"megatron"}, "none"),
    "mixture_change": ({"megatron"}, "continue"),
    "block_size": ({"computed"}, 4),
    "weights_schedule": ({"megatron", "computed"}, [(0, [1.0, 1.0])]),
    "weight_by_num_documents": ({"neox"}, True),
    "weighted_sampler_alpha": ({"neox"}, 0.3),
    "num_epochs": ({"neox"}, 2),
    "packing": ({"megatron", "computed"}, "best-fit"),
}
ORDERS = ("megatron", "computed", "neox")
CASES = [(f, o) for f, (orders, _) in READ_BY.items() for o in ORDERS]


def _flat(**kw) -> MegatronDataConfig:
    return MegatronDataConfig(sequence_length=8, blend=["1", "a", "1", "b"], split="9,1,0", **kw)


@pytest.mark.parametrize(("field", "order"), CASES, ids=[f"{f}-{o}" for f, o in CASES])
def test_an_option_of_another_order_is_a_config_error_naming_both(field, order):
    orders, value = READ_BY[field]
    if order in orders:
        config = _flat(order=order, **{field: value})
        record = config.typed().order
        name = {"weights_schedule": "schedule"}.get(field, field)
        if hasattr(record, name):  # the record holds the value (schedules: checked)
            held = getattr(record, name)
            assert held == (check_schedule(value) if field == "weights_schedule" else value)
        return
    with pytest.raises(ConfigError) as info:
        _flat(order=order, **{field: value})
    text = str(info.value)
    assert field in text and f"not {order!r}" in text
    assert all(repr(o) in text for o in orders)


@pytest.mark.parametrize("order", ORDERS)
def test_defaults_of_every_order_only_field_pass_with_every_order(order):
    config = _flat(order=order)
    record = config.typed().order
    expected = {"megatron": MegatronOptions, "computed": ComputedOptions, "neox": NeoxOptions}
    assert type(record) is expected[order]
    # what every order does anyway: no index cache read or written, each rank in memory
    assert _flat(order=order, cache="off").order == order
    assert _flat(order=order, build_policy="every-rank").order == order
    with pytest.raises(ConfigError, match="build_policy is 'often'"):
        _flat(order=order, build_policy="often")
    with pytest.raises(ConfigError, match="mixture_change is 'yes'"):
        _flat(order=order, mixture_change="yes")


def test_the_records_hold_checked_values_and_refuse_unchecked_ones():
    config = _flat(weights_schedule=[(0, [1, 3]), (10, [2, 2])], mixture_change="continue")
    data, options = config.typed()
    assert isinstance(options, MegatronOptions)
    assert options.schedule == ((0, (1.0, 3.0)), (10, (2.0, 2.0)))
    assert all(isinstance(s, int) and isinstance(w, tuple) for s, w in options.schedule)
    assert data.blend == Blend(prefixes=("a", "b"), weights=(1.0, 1.0))
    assert data.item == config.item_config() and data.source == config.source_options()
    with pytest.raises(ConfigError, match="not a checked schedule"):
        MegatronOptions(schedule=[(0, [1.0])])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not a checked schedule"):
        ComputedOptions(schedule=((0, (1.0,)),))
    with pytest.raises(ConfigError, match="block_size"):
        ComputedOptions(block_size=0)
    for field in dataclasses.fields(MegatronOptions):  # frozen: no field is set after the check
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(options, field.name, None)
    assert "_checked_schedule" not in vars(config)  # no hidden state on the façade


def test_importers_and_adapters_keep_only_what_the_order_takes():
    fields = {
        "order": "neox",
        "sequence_length": 8,
        "blend": ["p"],
        "split": "969, 30, 1",
        "build_policy": "local-rank0",
        "path_to_cache": "/c",
        "num_epochs": 1,
    }
    kept = fields_for_order(fields)
    assert kept == {k: v for k, v in fields.items() if k not in ("build_policy", "path_to_cache")}
    assert MegatronDataConfig(**kept).order == "neox"
    megatron = {k: v for k, v in fields.items() if k != "num_epochs"} | {"order": "megatron"}
    assert fields_for_order(megatron) == megatron
    assert fields_for_order(dict(megatron, num_epochs=1)) == megatron


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("typed")
    rng = np.random.default_rng(3)
    return [
        write_documents(
            folder / n, [rng.integers(1, 500, int(rng.integers(2, 30))) for _ in range(60)]
        )
        for n in ("a", "b")
    ]


@pytest.mark.parametrize(
    ("order", "kind"),
    [("megatron", GPTDataset), ("computed", ComputedGPTDataset), ("neox", NeoXGPTDataset)],
)
def test_build_datasets_dispatches_on_the_records_type_and_returns_splits(prefixes, order, kind):
    config = MegatronDataConfig(
        sequence_length=8, blend=[prefixes[0]], split="80,20,0", order=order, cache="off"
    )
    splits = build_datasets(config, [50, 5, 0])
    assert isinstance(splits, Splits) and splits._fields == ("train", "valid", "test")
    train, valid, test = splits
    assert type(train) is kind and splits.train is train and splits.valid is valid
    assert test is None
    again = build_typed(*config.typed(), [50, 5, 0])
    a, b = train.__getitems__(list(range(10))), again.train.__getitems__(list(range(10)))
    np.testing.assert_array_equal(a["tokens"], b["tokens"])


def test_manifest_key_is_the_key_earlier_versions_wrote_and_the_same_from_either_form():
    flat = MegatronDataConfig(
        sequence_length=8,
        blend="2 /d/a 3 /d/b",
        split="90,10,0",
        tokenizer={"class": "T"},
        path_to_cache="/c",
        random_seed=5,
    )
    sizes = [200, 20, 0]
    expected = {  # the key's documented fields, in their JSON form (manifest.py)
        "blend": {"prefixes": ["/d/a", "/d/b"], "weights": [2.0, 3.0]},
        "blend_per_split": None,
        "split": "90,10,0",
        "sizes": [200, 20, 0],
        "sequence_length": 8,
        "random_seed": 5,
        "tokenizer": {"class": "T"},
        "add_extra_token": True,
        "drop_last_partial_validation_sequence": True,
        "mid_level_dataset_surplus": 0.005,
        "mock": None,
    }
    assert manifest_key(flat, sizes) == expected
    assert manifest_key(flat.typed(), sizes) == expected
    digest = hashlib.md5(json.dumps(expected, separators=(",", ":")).encode()).hexdigest()
    assert manifest_path("/c", manifest_key(flat, sizes)) == f"/c/{digest}-tokenload-build.json"


def test_prepare_command_reads_the_typed_records_and_writes_weights_as_given():
    flat = MegatronDataConfig(
        sequence_length=8,
        blend=["2", "/d/a", "0.5", "/d/b"],
        split="90,10,0",
        path_to_cache="s3://b/c",
        weights_schedule=[(0, [1, 1]), (100, [3, 1])],
    )
    line = prepare_command(flat, [200, 20, 0])
    assert line == prepare_command(TypedConfig(*flat.typed()), [200, 20, 0])
    assert "--data-path 2 /d/a 0.5 /d/b --split 90,10,0" in line
    assert "--data-cache-path s3://b/c" in line
    assert "--weights-schedule '[[0,[1.0,1.0]],[100,[3.0,1.0]]]'" in line


def test_the_data_config_is_typed_for_every_field():
    hints = {f.name: f.type for f in dataclasses.fields(DataConfig)}
    assert "Any" not in " ".join(str(h) for h in hints.values())


SNIPPET = textwrap.dedent(
    """
    from tokenload.datasets import MegatronDataConfig, build_datasets

    config = MegatronDataConfig(sequence_length=8, vocab_size=10, eod_id=0)
    train, valid, test = build_datasets(config, [10, None, None])
    reveal_type(train)
    reveal_type(build_datasets(config, [10, None, None]).test)
    """
)


def test_reveal_type_of_a_split_is_a_tokenload_type_not_any(tmp_path):
    out, _ = mypy_snippet(tmp_path, SNIPPET)
    revealed = [
        line.split("Revealed type is ", 1)[1]
        for line in out.splitlines()
        if "Revealed type is" in line
    ]
    assert revealed == ['"tokenload.contract.LoaderDataset | None"'] * 2, out
