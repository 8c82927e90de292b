"""Loader state: what a checkpoint may load into. The cyclic sampler resumes only on the topology
it was saved on, a state is bound to its sampler kind, consumed_samples is checked when it is
loaded, and a flat file keeps its state when it moves."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.errors import StateError
from tokenload.format import write_flat
from tokenload.loader import build_dataloader

WINDOWS = (4_001 - 1) // 8  # 500 windows of 8 tokens


def _dataset(path) -> FlatTokenDataset:
    return FlatTokenDataset(path, FlatDatasetConfig(block_size=8, seed=9))


@pytest.fixture
def dataset(tmp_path):
    write_flat(tmp_path / "train.bin", np.random.default_rng(2).integers(0, 60_000, size=4_001))
    return _dataset(tmp_path / "train.bin")


def _loader(dataset, **config):
    return build_dataloader(dataset, num_workers=0, **{"micro_batch_size": 4, "dp_rank": 0, "dp_size": 1, **config})


def _rows(loader, steps: int) -> list[list[int]]:
    """The first token of every sample of the next ``steps`` micro-batches."""
    return [b["tokens"][:, 0].tolist() for b in itertools.islice(loader, steps)]


def _state(dataset, steps: int, **config) -> dict:
    loader = _loader(dataset, **config)
    _rows(loader, steps)
    return loader.state_dict()


def test_cyclic_state_refuses_another_dp_size(dataset):
    state = _state(dataset, 3, kind="cyclic", dp_rank=1, dp_size=4)
    assert state["dp_size"] == 4 and state["consumed_samples"] == 48
    loader = _loader(dataset, kind="cyclic", dp_rank=1, dp_size=2)
    with pytest.raises(StateError, match="dp_size=4") as info:
        loader.load_state_dict(state)
    assert "HINT: resume on 4 data-parallel ranks" in str(info.value) and "kind='single'" in str(info.value)
    with pytest.raises(StateError, match="micro_batch_size=4"):
        _loader(dataset, kind="cyclic", micro_batch_size=8, dp_rank=1, dp_size=4).load_state_dict(state)


def test_cyclic_state_resumes_on_its_own_topology(dataset):
    cfg = dict(kind="cyclic", dp_rank=1, dp_size=4)
    reference = _rows(_loader(dataset, **cfg), 8)
    loader = _loader(dataset, **cfg)
    loader.load_state_dict(_state(dataset, 3, **cfg))
    assert _rows(loader, 5) == reference[3:]


def test_single_state_resumes_on_another_dp_size(dataset):
    """Megatron's default sampler: global sample k does not depend on the topology."""
    state = _state(dataset, 3, dp_size=4, dp_rank=2)
    ranks = [_loader(dataset, dp_size=2, dp_rank=r) for r in range(2)]
    for loader in ranks:
        loader.load_state_dict(state)
    steps = list(zip(*(_rows(loader, 4) for loader in ranks)))
    resumed = [x for step in steps for batch in step for x in batch]
    whole = [x for batch in _rows(_loader(dataset, micro_batch_size=48 + 32), 1) for x in batch]
    assert resumed == whole[48:]


@pytest.mark.parametrize(
    "saved,loaded",
    [
        ({"kind": "cyclic"}, {"kind": "single"}),
        ({"kind": "single"}, {"kind": "cyclic"}),
        ({"kind": "cyclic", "data_sharding": True}, {"kind": "cyclic", "data_sharding": False}),
    ],
)
def test_state_is_bound_to_the_sampler_kind(dataset, saved, loaded):
    state = _state(dataset, 2, **saved)
    with pytest.raises(StateError, match="fingerprint"):
        _loader(dataset, **loaded).load_state_dict(state)


@pytest.mark.parametrize(
    "value,message",
    [
        ("640", r"consumed_samples is '640' \(str\), expected an int"),
        (640.0, r"consumed_samples is 640.0 \(float\), expected an int"),
        (True, r"consumed_samples is True \(bool\), expected an int"),
        (None, r"consumed_samples is None \(NoneType\), expected an int"),
        (-16, "consumed_samples is -16, expected 0 or more"),
        (WINDOWS + 4, f"consumed_samples {WINDOWS + 4} is past the end of this loader's order of {WINDOWS}"),
    ],
)
def test_consumed_samples_is_checked_at_load(dataset, value, message):
    loader = _loader(dataset)
    state = dict(loader.state_dict(), consumed_samples=value)
    with pytest.raises(StateError, match=message) as info:
        loader.load_state_dict(state)
    assert "HINT" in str(info.value)
    assert loader.consumed_samples == 0  # nothing half-loaded


def test_numpy_integers_and_the_very_end_load(dataset):
    loader = _loader(dataset)
    loader.load_state_dict(dict(loader.state_dict(), consumed_samples=np.int64(WINDOWS)))
    assert loader.consumed_samples == WINDOWS and type(loader.consumed_samples) is int
    assert list(loader) == []


def test_cyclic_counts_on_through_epochs(dataset):
    """Past one epoch is not past the end for the cyclic sampler: it starts the next epoch."""
    loader = _loader(dataset, kind="cyclic")
    loader.load_state_dict(dict(loader.state_dict(), consumed_samples=WINDOWS + 8))
    assert len(_rows(loader, 2)) == 2
    with pytest.raises(StateError, match="expected 0 or more"):
        loader.load_state_dict(dict(loader.state_dict(), consumed_samples=-8))


def test_other_fields_are_checked(dataset):
    loader = _loader(dataset)
    state = loader.state_dict()
    with pytest.raises(StateError, match="micro_batch_size is 0, expected 1 or more"):
        loader.load_state_dict(dict(state, micro_batch_size=0))
    with pytest.raises(StateError, match=r"dp_size is '2' \(str\)"):
        loader.load_state_dict(dict(state, dp_size="2"))
    with pytest.raises(StateError, match="fingerprint is 7, expected a string"):
        loader.load_state_dict(dict(state, fingerprint=7))


def test_a_moved_flat_file_resumes_and_a_same_size_one_does_not(dataset, tmp_path):
    reference = _rows(_loader(dataset), 6)
    state = _state(dataset, 2)
    mount = tmp_path / "new-mount"
    mount.mkdir()
    os.rename(dataset.path, mount / "renamed.bin")
    moved = _loader(_dataset(mount / "renamed.bin"))
    moved.load_state_dict(state)
    assert _rows(moved, 4) == reference[2:]

    other = tmp_path / "train.bin"  # the old name, other tokens, the same size
    write_flat(other, np.random.default_rng(3).integers(0, 60_000, size=4_001))
    with pytest.raises(StateError, match="fingerprint"):
        _loader(_dataset(other)).load_state_dict(state)


def test_the_state_keeps_the_topology_history_of_elastic_resumes(dataset):
    state = _state(dataset, 3, micro_batch_size=4, dp_size=2)  # 3 micro-batch steps of 8
    assert state["topologies"] == [[0, 4, 2]]
    same = _loader(dataset, micro_batch_size=4, dp_size=2)
    same.load_state_dict(state)
    _rows(same, 1)
    assert same.state_dict()["topologies"] == [[0, 4, 2]]  # the same topology: no entry
    other = _loader(dataset, micro_batch_size=1, dp_size=4)
    other.load_state_dict(same.state_dict())
    _rows(other, 2)
    again = other.state_dict()
    assert again["consumed_samples"] == 40 and again["topologies"] == [[0, 4, 2], [32, 1, 4]]
    # an older tokenload's state (no history): known from its save on, not guessed before it
    old = {k: v for k, v in state.items() if k != "topologies"}
    resumed = _loader(dataset, micro_batch_size=2, dp_size=2)
    resumed.load_state_dict(old)
    assert resumed.state_dict()["topologies"] == [[24, 2, 2]]
    # a loader started at consumed_samples without a state knows its own topology from there
    assert _loader(dataset, consumed_samples=16).state_dict()["topologies"] == [[16, 4, 1]]


def test_the_topology_history_is_bounded_and_checked(dataset):
    loader = _loader(dataset, micro_batch_size=1, dp_size=2)
    for n in range(70):  # 70 resumes, each on another topology: 2 x 1, then 1 x 2, ...
        state = loader.state_dict()
        loader = _loader(dataset, micro_batch_size=1 + (n + 1) % 2, dp_size=1 + n % 2)
        loader.load_state_dict(state)
        _rows(loader, 1)
    history = loader.state_dict()["topologies"]
    assert len(history) == 64  # TOPOLOGIES_KEPT: the oldest dropped, its start moves on
    assert history[0][0] > 0 and history[-1] == [loader.consumed_samples - 2, 1, 2]
    state = loader.state_dict()
    for bad, words in (
        ([[0, 1]], "expected \\[\\[first sample"),
        ("[[0, 4, 1]]", "expected \\[\\[first sample"),
        ([[0, 1.0, 2]], "expected \\[\\[first sample"),
        ([[8, 1, 1], [4, 1, 2]], "expected increasing"),
        ([[0, 1, 1]], "the last micro_batch_size=1, dp_size=2"),
        ([[0, 0, 2]], "expected sizes >= 1"),
    ):
        with pytest.raises(StateError, match=words) as info:
            _loader(dataset, micro_batch_size=1, dp_size=2).load_state_dict(
                {**state, "topologies": bad}
            )
        assert "unchanged" in info.value.hint


def test_a_run_started_between_groups_resumes_on_its_own_topology(dataset):
    """A loader started at any consumed_samples (as Megatron's sampler starts: 18 with
    micro-batches of 4) saves a state its own topology loads, continuing the stream exactly; a
    topology whose group does not divide it is still refused."""
    first = _loader(dataset, consumed_samples=18)
    head = _rows(first, 3)
    state = first.state_dict()
    assert state["consumed_samples"] == 30 and state["topologies"] == [[18, 4, 1]]
    whole = _rows(_loader(dataset, consumed_samples=18), 6)
    resumed = _loader(dataset)
    resumed.load_state_dict(state)
    assert head + _rows(resumed, 3) == whole
    halves = _loader(dataset, micro_batch_size=2)  # a group of 2 divides 30: another topology
    halves.load_state_dict(state)
    assert list(itertools.chain(*_rows(halves, 6))) == list(itertools.chain(*whole[3:]))
    with pytest.raises(StateError, match="not a multiple of micro_batch_size"):
        _loader(dataset, micro_batch_size=8).load_state_dict(state)


@pytest.mark.parametrize("order", ["megatron", "computed"])
def test_a_refused_state_names_what_the_saved_run_read_differently(tmp_path, order):
    """A state is refused by a dataset of other item options, packing or data (its fingerprint),
    and the refusal says which of order, packing, sequence length and item options the saved run
    had otherwise (a new user's finding: it named two fingerprints and this loader's options
    only); when those are the same, that the data (token files, seed, split, blend) differs."""
    from support import write_documents
    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.errors import ForeignStateError

    rng = np.random.default_rng(4)
    prefix = write_documents(tmp_path / "a", [rng.integers(1, 900, size=int(n)) for n in rng.integers(5, 60, size=300)])

    def train(**options):
        cfg = MegatronDataConfig(sequence_length=16, blend=[prefix], split="100,0,0", order=order, eod_id=0,
                                 **options)
        return build_datasets(cfg, [200, 0, 0])[0]

    state = _state(train(inter_document_masking=True, packing="best-fit"), 3)
    assert state["reads"]["inter_document_masking"] is True and state["reads"]["packing"] == "best-fit"
    _loader(train(inter_document_masking=True, packing="best-fit")).load_state_dict(state)  # the same
    saved = r"the saved run read inter_document_masking=True \(this loader: False\)"
    with pytest.raises(ForeignStateError, match=saved) as refused:
        _loader(train(packing="best-fit")).load_state_dict(state)
    assert "consumed_samples=state['consumed_samples']" in refused.value.hint
    # what the hint offers: the saved point, with the other item options, the same samples next
    resumed = _loader(train(inter_document_masking=True, packing="best-fit"))
    resumed.load_state_dict(state)
    went_on = _loader(train(packing="best-fit"), consumed_samples=state["consumed_samples"])
    np.testing.assert_array_equal(next(iter(went_on))["tokens"], next(iter(resumed))["tokens"])
    with pytest.raises(ForeignStateError, match=r"packing='best-fit' \(this loader: 'concat'\)"):
        _loader(train(inter_document_masking=True)).load_state_dict(state)
    with pytest.raises(ForeignStateError, match="same order, packing, sequence length and item options: something"):
        _loader(train(inter_document_masking=True, packing="best-fit", random_seed=7)).load_state_dict(state)
    del state["reads"]  # a state saved before it was kept: refused as before, without the words
    with pytest.raises(ForeignStateError) as info:
        _loader(train(packing="best-fit")).load_state_dict(state)
    assert "the saved run read" not in info.value.message


def test_a_state_of_numpy_item_values_is_plain_and_resumes_into_plain_ones(tmp_path):
    """``eod_id=np.int64(2)`` (a tokenizer's) and NumPy flags: the state stays JSON and
    ``torch.load(weights_only=True)`` material, and resumes into a loader given ``eod_id=2``, its
    fingerprint the same (``repr(np.int64(2))`` is not ``repr(2)``: such resumes were refused);
    an id that is no integer is a ConfigError (it matched no token, silently). Red-team findings."""
    import io
    import json

    import torch

    from support import write_documents
    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.errors import ConfigError

    rng = np.random.default_rng(6)
    prefix = write_documents(tmp_path / "a", [rng.integers(1, 900, size=int(n)) for n in rng.integers(5, 60, size=200)])

    def train(eod_id, flag):
        cfg = MegatronDataConfig(sequence_length=16, blend=[prefix], split="100,0,0", eod_id=eod_id,
                                 eod_mask_loss=flag)
        return build_datasets(cfg, [100, 0, 0])[0]

    state = _state(train(np.int64(2), np.bool_(True)), 2)
    assert type(state["reads"]["eod_id"]) is int and type(state["reads"]["eod_mask_loss"]) is bool
    json.dumps(state)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    plain = _loader(train(2, True))
    plain.load_state_dict(loaded)
    assert plain.consumed_samples == state["consumed_samples"]
    for bad in (2.5, "2", True):
        with pytest.raises(ConfigError, match=f"eod_id is {bad!r}"):
            train(bad, False)


def test_a_users_own_dataset_in_a_module_named_like_tokenloads_saves_its_state():
    """A user's dataset whose module is named like one of tokenload's order packages
    (``mylab.datasets.megatron_style``) is not taken for one: its state saves (it raised an
    AttributeError on every checkpoint). A red-team finding."""

    class Windows:
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return {"tokens": np.full(4, i, dtype=np.int64)}

    Windows.__module__ = "mylab.datasets.megatron_style"
    loader = _loader(Windows())
    _rows(loader, 2)
    state = loader.state_dict()
    assert "reads" not in state and state["consumed_samples"] == 8


@pytest.mark.parametrize("value", [None, "2", 2.0, True, -1])
def test_a_micro_batch_size_that_is_no_count_is_a_config_error(dataset, value):
    """``build_dataloader(micro_batch_size=extras["micro_batch_size"])`` with an import that could
    not derive it (None), or a value read as text: a ConfigError naming the field (a TypeError
    from deep in the sampler before, and 2.0 was taken silently: a new user's finding); NumPy's
    ints are taken as ints."""
    from tokenload.errors import ConfigError

    with pytest.raises(ConfigError, match=f"micro_batch_size is {value!r}"):
        _loader(dataset, micro_batch_size=value)
    assert _loader(dataset, micro_batch_size=np.int64(4)).config.micro_batch_size == 4


@pytest.mark.parametrize(("field", "value"), [("consumed_samples", None), ("consumed_samples", "2"),
                                              ("consumed_samples", 2.0), ("consumed_samples", True),
                                              ("prefetch_factor", "2"), ("prefetch_factor", 2.0),
                                              ("prefetch_factor", True), ("dp_size", 0)])
def test_counts_that_are_no_counts_are_config_errors(dataset, field, value):
    """consumed_samples, prefetch_factor and dp_size: a ConfigError naming the field (TypeErrors,
    a ZeroDivisionError, or taken: red-team findings); NumPy ints become ints, so that a state
    stays JSON."""
    import json

    from tokenload.errors import ConfigError

    with pytest.raises(ConfigError, match=field):
        _loader(dataset, **{field: value})
    loader = _loader(dataset, consumed_samples=np.int64(8), prefetch_factor=np.int64(2))
    assert type(loader.consumed_samples) is int and loader.config.prefetch_factor == 2
    json.dumps(loader.state_dict())


@pytest.mark.parametrize("flag", ["eod_mask_loss", "add_extra_token", "reset_position_ids"])
def test_an_item_flag_given_as_text_is_refused(tmp_path, flag):
    """``eod_mask_loss="false"`` became True (a red-team finding): flags are True or False."""
    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.errors import ConfigError

    with pytest.raises(ConfigError, match=f"{flag} is 'false'"):
        build_datasets(MegatronDataConfig(sequence_length=8, blend=["p"], split="100,0,0", eod_id=0,
                                          **{flag: "false"}), [10, 0, 0])
