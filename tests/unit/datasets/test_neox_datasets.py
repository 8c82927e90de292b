"""order='neox' datasets against the items GPT-NeoX's own GPT2Dataset/BlendableDataset served.

The fixture files (tests/fixtures/neox/, written by GPT-NeoX's code) record, per case, NeoX's
``text`` of chosen items, including indices past a dataset's length (NeoX's IndexError
fallback) and blend draws past a member's length. The token files are rewritten here from the
recorded lengths and token formula, and ``build_neox_datasets`` must serve the same tokens and
labels, through the dataset API and through the loader.
"""

from __future__ import annotations

import itertools
import json
import pickle
import shutil

import numpy as np
import pytest

from support import FIXTURES, write_documents
from tokenload.datasets import MegatronDataConfig
from tokenload.datasets.neox.neox_dataset import NeoXGPTDataset, build_neox_datasets
from tokenload.errors import ConfigError
from tokenload.loader import build_dataloader

NEOX = FIXTURES / "neox"
SPLITS = ("train", "valid", "test")
DATA = json.loads((NEOX / "cases.json").read_text())
ARRAYS = np.load(NEOX / "cases.npz")
CASES = {c["id"]: c for c in DATA["cases"] if c["outcome"] == "ok"}


def tokens_of(seq: int, length: int) -> np.ndarray:
    return (seq * 131 + np.arange(length) * 7) % 50000


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The fixture's five token files, one sequence per document."""
    root = tmp_path_factory.mktemp("neox-files")
    for name, rec in DATA["data_files"].items():
        lengths = rec["sequence_lengths"]
        write_documents(root / name, [tokens_of(i, n) for i, n in enumerate(lengths)])
    return root


def build(case: dict, folder, **overrides):
    """The case's datasets through build_neox_datasets, as NeoX's arguments map onto it."""
    common = dict(sequence_length=case["seq_length"], random_seed=case["seed"], **overrides)
    extra = {"num_epochs": case["num_epochs"]}
    if case["kind"] == "split":
        prefix = str(folder / case["data_path"])
        cfg = MegatronDataConfig(blend=[prefix], split=case["split"], **common)
    else:
        per_split = [
            [x for p, w in zip(*case[s]) for x in (str(w), str(folder / p))] for s in SPLITS
        ]
        cfg = MegatronDataConfig(blend_per_split=per_split, **common)
        extra.update(weight_by_num_documents=case["weight_by_num_documents"],
                     weighted_sampler_alpha=case["weighted_sampler_alpha"])
    return build_neox_datasets(cfg, case["num_samples"], **extra)


def check_items(items: dict, key: str) -> None:
    text = ARRAYS[f"{key}/item_text"]
    np.testing.assert_array_equal(items["tokens"], text[:, :-1], err_msg=key)
    np.testing.assert_array_equal(items["labels"], text[:, 1:], err_msg=key)
    assert (items["loss_mask"] == 1.0).all()
    assert (items["position_ids"] == np.arange(text.shape[1] - 1)).all()


@pytest.mark.parametrize("cid", sorted(CASES))
def test_items_equal_neox_items(cid, folder):
    case = CASES[cid]
    datasets = build(case, folder)
    for name, ds in zip(SPLITS, datasets):
        rec = case["splits"][name]
        if rec is None:
            assert ds is None, name
            continue
        assert len(ds) == rec["len"]
        key = f"{cid}/{name}"
        if rec["item_index"]:
            check_items(ds.__getitems__(rec["item_index"]), key)
        if case["kind"] == "weighted":
            assert [len(m) for m in ds.datasets] == rec["member_lens"]
            assert ds.dataset_index.dtype == np.uint8
            for j, (member, mrec) in enumerate(zip(ds.datasets, rec["members"])):
                if mrec["item_index"]:  # past-the-end indices straight on a member
                    got = member.__getitems__(mrec["item_index"])
                    check_items(got, f"{key}/d{j}")


def loader_items(ds, workers: int, micro: int = 4) -> dict[str, np.ndarray]:
    loader = build_dataloader(
        ds, micro_batch_size=micro, dp_rank=0, dp_size=1, num_workers=workers,
        drop_last=False, persistent_workers=False,
    )
    batches = list(itertools.islice(loader, -(-len(ds) // micro)))
    return {k: np.concatenate([b[k].numpy() for b in batches]) for k in ("tokens", "labels")}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("cid", ["n001", "n016"], ids=["split-multi-epoch", "three-prefix-blend"])
def test_loader_serves_neox_order(cid, workers, folder):
    """Loader item k is NeoX's item k: every recorded index below the length, in order."""
    case = CASES[cid]
    train = build(case, folder)[0]
    rec = case["splits"]["train"]
    got = loader_items(train, workers)
    assert got["tokens"].shape[0] == len(train) == rec["len"]
    served = [i for i in rec["item_index"] if i < len(train)]
    text = ARRAYS[f"{cid}/train/item_text"][[rec["item_index"].index(i) for i in served]]
    np.testing.assert_array_equal(got["tokens"][served], text[:, :-1])
    np.testing.assert_array_equal(got["labels"][served], text[:, 1:])
    direct = train.__getitems__(np.arange(len(train)))
    np.testing.assert_array_equal(got["tokens"], direct["tokens"])


def test_index_past_the_length_takes_neoxs_fallback(folder):
    case = CASES["n000"]
    train = build(case, folder)[0]
    assert isinstance(train, NeoXGPTDataset) and train.num_built == len(train) + 1
    n = len(train)
    wrapped = train.__getitems__([n + 1, 2 * n + 3])["tokens"]
    np.testing.assert_array_equal(wrapped, train.__getitems__([1, 3])["tokens"])
    with pytest.raises(IndexError, match=">= 0"):
        train.__getitems__([-1])


def test_eod_mask_loss_follows_neox(folder):
    """NeoX's loss mask is zero where the input token is EOD; pick a token that occurs."""
    case = CASES["n000"]
    train = build(case, folder)[0]
    eod = int(train.__getitems__([0])["tokens"][0, 3])
    masked = build(case, folder, eod_id=eod, eod_mask_loss=True)[0].__getitems__(np.arange(8))
    assert ((masked["loss_mask"] == 0.0) == (masked["tokens"] == eod)).all()
    assert (masked["loss_mask"] == 0.0).any()


def test_fingerprint_follows_content_not_place(folder, tmp_path):
    case = CASES["n014"]
    first = build(case, folder)
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    again = build(case, moved)
    assert [d.fingerprint for d in first] == [d.fingerprint for d in again]
    other = dict(case, seed=case["seed"] + 1)
    assert build(other, folder)[0].fingerprint != first[0].fingerprint
    (moved / "a.bin").unlink()
    (moved / "a.idx").unlink()
    write_documents(moved / "a", [tokens_of(i, 20) for i in range(60)])
    assert build(case, moved)[0].fingerprint != first[0].fingerprint


def test_datasets_pickle_and_serve_the_same_items(folder):
    train = build(CASES["n015"], folder)[0]
    copy = pickle.loads(pickle.dumps(train))
    idx = np.arange(0, len(train), 7)
    np.testing.assert_array_equal(
        copy.__getitems__(idx)["tokens"], train.__getitems__(idx)["tokens"]
    )
    np.testing.assert_array_equal(copy.__getitems__(idx)["dataset_id"], train.dataset_index[idx])


def test_epoch_mode_is_one_epoch_per_split_by_default(folder):
    case = CASES["n009"]  # recorded with NeoX's train_epochs mode: epochs (1, 1, 1)
    cfg = MegatronDataConfig(
        sequence_length=case["seq_length"], random_seed=case["seed"],
        blend=[str(folder / case["data_path"])], split=case["split"],
    )
    train, valid, test = build_neox_datasets(cfg, [None, None, None])
    assert [len(d) for d in (train, valid, test)] == [case["splits"][s]["len"] for s in SPLITS]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(blend=["a", "b"], split="98,2,0"), "splits one data path"),
        (dict(blend=["a"], split="98,2,0", add_extra_token=False), "add_extra_token"),
        (dict(blend=["a"], split="98,2,0", mid_level_dataset_surplus=0.01), "surplus"),
        (dict(vocab_size=100, eod_id=0), "no mock data"),
        (dict(blend_per_split=[["a"], None]), "expected 3"),
    ],
)
def test_what_neox_cannot_express_is_a_config_error(kwargs, match, folder):
    if "blend" in kwargs:
        kwargs["blend"] = [str(folder / p) for p in kwargs["blend"]]
    if "blend_per_split" in kwargs:
        kwargs["blend_per_split"] = [
            None if b is None else [str(folder / p) for p in b] for b in kwargs["blend_per_split"]
        ]
    cfg = MegatronDataConfig(sequence_length=8, **kwargs)
    with pytest.raises(ConfigError, match=match):
        build_neox_datasets(cfg, [10, 2, 2])


@pytest.mark.parametrize("blended", [False, True])
def test_negative_labels_have_no_loss_as_neoxs_label_mask(tmp_path, blended):
    """GPT-NeoX's _get_batch multiplies the loss mask by (text >= 0)[:, 1:]: a signed token file
    may hold ids such as -100 (a masking preprocessor's), whose labels then carry no loss; the
    labels keep their values, as there. A one-prefix split and a per-split blend alike."""
    from support import write_documents
    from tokenload.datasets import build_datasets
    from tokenload.datasets.neox import neox_config_from_yaml

    docs = [np.array([-100, -100, 5, 6, 7, 8, 9, 0] * 3) for _ in range(20)]
    prefix = write_documents(tmp_path / "neg", docs, dtype=np.int32)
    data = ({"train_data_paths": [prefix], "valid_data_paths": [prefix],
             "test_data_paths": [prefix]} if blended else {"data_path": prefix, "split": "1,0,0"})  # fmt: skip
    imported = neox_config_from_yaml({**data, "seq_length": 8, "train_iters": 2,
                                      "train_batch_size": 2}, data_parallel_size=1)  # fmt: skip
    train = build_datasets(imported.config(), imported.sizes)[0]
    items = train.__getitems__(np.arange(len(train)))
    assert (items["labels"] < 0).any() and (items["labels"] >= 0).any()
    np.testing.assert_array_equal(items["loss_mask"], (items["labels"] >= 0).astype(np.float32))
