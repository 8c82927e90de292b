"""tokenload's Megatron order against megatron-core 0.19.2's ``inter_document_masking`` items
(``tests/fixtures/megatron/make_boundaries.py`` wrote them), field by field; shared by the quick
tier (the committed fixtures) and the integration tier (a fresh run of megatron-core).

tokenload builds its own datasets from the same token files and configuration
(``build_datasets``, order ``megatron``, caches in a temporary folder) and reads every sample in
one batch and one by one; ``compare`` raises on the first difference and returns what the data
covered (so a test can prove the edge cases were there)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tokenload.datasets import MegatronDataConfig, build_datasets

FIELDS = ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen")
SPLITS = ("train", "valid", "test")


def tokenload_splits(folder: Path, case: dict, tokenizer: dict, cache: Path) -> tuple:
    prefixes, weights = case["config"]["blend"]
    paths = [str(folder / p) for p in prefixes]
    blend = paths if weights is None else [x for w, p in zip(weights, paths) for x in (str(w), p)]
    cfg = case["config"]
    config = MegatronDataConfig(
        sequence_length=cfg["sequence_length"],
        random_seed=1234,
        blend=blend,
        split="80,15,5",
        tokenizer=tokenizer["unique_identifiers"],
        eod_id=tokenizer["eod"],
        pad_id=tokenizer["pad"],
        add_extra_token=cfg["extra"],
        drop_last_partial_validation_sequence=False,
        eod_mask_loss=cfg["eod_mask_loss"],
        reset_position_ids=cfg["reset_position_ids"],
        inter_document_masking=True,
        path_to_cache=str(cache),
    )
    return build_datasets(config, cfg.get("sizes", [None, None, None]))


def compare(folder: Path, cache: Path) -> dict:
    """Every case and split of ``folder`` (``cases.json``/``cases.npz``): tokenload's items equal
    megatron-core's. Returns counts of what the samples held."""
    meta = json.loads((folder / "cases.json").read_text())
    arrays = np.load(folder / "cases.npz")
    seen = {
        "samples": 0,
        "repeated_boundaries": 0,
        "padded": 0,
        "eod_rule_differs": 0,
        "first_document_of_one_token": 0,
    }
    for cid, case in meta["cases"].items():
        ours = tokenload_splits(folder, case, meta["tokenizer"], cache / cid)
        seq = case["config"]["sequence_length"]
        for split, ds in zip(SPLITS, ours):
            rec = case["splits"][split]
            where = f"{cid}/{split}"
            assert (ds is None) == (rec is None), where
            if rec is None:
                continue
            assert not rec["failed"], f"{where}: megatron-core failed on items {rec['failed']}"
            assert len(ds) == rec["len"], where
            got = ds.__getitems__(np.arange(len(ds)))
            fields = FIELDS + (("dataset_id",) if rec["class"] == "BlendedDataset" else ())
            for field in fields:
                theirs = arrays[f"{where}/item_{field}"]
                mine = got[field]
                assert mine.shape == theirs.shape, (where, field, mine.shape, theirs.shape)
                if field != "dataset_id":
                    assert mine.dtype == theirs.dtype, (where, field, mine.dtype, theirs.dtype)
                bad = np.flatnonzero((mine != theirs).reshape(len(ds), -1).any(axis=1))
                assert not bad.size, (
                    f"{where} {field} differs at samples {bad[:5].tolist()}:\n"
                    f"tokenload {mine[bad[0]].tolist()}\nmegatron  {theirs[bad[0]].tolist()}"
                )
            for k in (0, len(ds) - 1):  # one at a time gives the same as the batch
                one = ds[k]
                for field in FIELDS:
                    np.testing.assert_array_equal(one[field], got[field][k], err_msg=where)
            cu = got["cu_seqlens"]
            inner = np.diff(cu, axis=1)
            seen["samples"] += len(ds)
            seen["repeated_boundaries"] += int(((inner == 0) & (cu[:, 1:] < seq)).any(axis=1).sum())
            if hasattr(ds, "windows"):  # a GPT dataset: its raw windows, padded with -1
                seen["padded"] += int((ds.windows(np.arange(len(ds))) == -1).any(axis=1).sum())
            seen["first_document_of_one_token"] += int((cu[:, 1] == 1).sum())
            tokens = got["tokens"]
            eod = tokens == meta["tokenizer"]["eod"]
            eod_cu = [[0, *(np.flatnonzero(row[:-1]) + 1).tolist(), seq] for row in eod]
            seen["eod_rule_differs"] += sum(
                eod_cu[r] != sorted(set(cu[r].tolist())) for r in range(len(ds))
            )
    return seen
