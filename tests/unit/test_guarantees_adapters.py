"""The three adapters' guarantees (issue 38, points 8-10; planted bugs: tests/PLANTED.md).

* Megatron-LM (docs/MIGRATING.md, "Metrics") and Lightning (docs/LIGHTNING.md) scalars: each
  name carries its own figure of ``loader.metrics()``; ``tokenload/worker-restarts`` counts the
  workers replaced, not the stalls. Model: a metrics dict whose every figure is a distinct
  number, and a real loader with one worker killed (1 restart, 0 stalls).
* Lightning: ``fit(ckpt_path=...)`` from a checkpoint without loader state continues the order
  at ``consumed_samples`` (the fit's starting offset) + ``global_step`` x global batch: the
  samples of an uninterrupted run, none repeated. Model: sample k's first token is k.
* torchtitan (docs/MIGRATING.md): every ``--dataloader.*`` setting parsed by torchtitan's config
  system reaches the dataset and the loader: the batches equal those of a dataset built with
  that setting through ``MegatronDataConfig``, and differ from the default's.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import tyro
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.config.manager import custom_registry

from integrations.lightning_app import RangeDataset, Recorder, trainer
from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.integrations.lightning import TokenloadDataModule
from tokenload.integrations.megatron import MegatronLoader, metric_scalars
from tokenload.integrations.scalars import loader_scalars
from tokenload.integrations.torchtitan import TokenloadTitanDataLoader
from tokenload.loader import build_dataloader

# -- point 8: each scalar carries its own metric ---------------------------------------------------


def _distinct_metrics() -> dict:
    """``loader.metrics()``'s shape, every figure a distinct number."""
    return {
        "samples": 3,
        "tokens": 5,
        "active_s": 7.0,
        "bytes_read": 11,
        "consumed_samples": 13,
        "epoch": 17,
        "repeating": ["x", "y"],
        "data_wait": {"share": 0.19, "mean_s": 0.023, "p99_s": 0.029, "max_s": 0.031},
        "sources": [
            {"name": "x", "dataset_id": 0, "samples": 37, "tokens": 41, "epoch": 43},
            {"name": "y", "dataset_id": 1, "samples": 47, "tokens": 53, "epoch": 59},
        ],
        "workers": {"restarts": 61, "stalls": 67, "time_lost_s": 71.0},
    }


def test_megatron_scalars_each_carry_their_own_metric():
    m = _distinct_metrics()
    want = {  # docs/MIGRATING.md "Metrics", under tokenload/
        "consumed-samples": 13,
        "epoch": 17,
        "samples": 3,
        "tokens": 5,
        "bytes-read": 11,
        "samples-per-s": 3 / 7,
        "tokens-per-s": 5 / 7,
        "data-wait-share": 0.19,
        "data-wait-mean-ms": 23.0,
        "data-wait-p99-ms": 29.0,
        "data-wait-max-ms": 31.0,
        "repeating-sources": 2,
        "worker-restarts": 61,
        "source/x/samples": 37,
        "source/x/tokens": 41,
        "source/x/epoch": 43,
        "source/y/samples": 47,
        "source/y/tokens": 53,
        "source/y/epoch": 59,
    }
    got = metric_scalars(m)
    assert set(got) == {f"tokenload/{k}" for k in want}
    for name, value in want.items():
        assert got[f"tokenload/{name}"] == pytest.approx(value), name


def test_lightning_scalars_each_carry_their_own_metric():
    got = loader_scalars(_distinct_metrics())
    want = {  # docs/LIGHTNING.md "Metrics in the training logger"
        "data_wait_share": 0.19,
        "data_wait_mean_s": 0.023,
        "data_wait_p99_s": 0.029,
        "samples_per_s": 3 / 7,
        "tokens_per_s": 5 / 7,
        "consumed_samples": 13,
        "epoch": 17,
        "tokens/x": 41,
        "tokens/y": 53,
        "worker_restarts": 61,
        "worker_stalls": 67,
    }
    assert set(got) == {f"tokenload/{k}" for k in want}
    for name, value in want.items():
        assert got[f"tokenload/{name}"] == pytest.approx(value), name


class _Writer:
    """Megatron's TensorBoard writer as the adapter uses it."""

    def __init__(self) -> None:
        self.scalars: dict[str, float] = {}

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars[tag] = value


@pytest.fixture
def token_dataset(tmp_path):
    rng = np.random.default_rng(4)
    docs = [[*rng.integers(0, 900, rng.integers(3, 50)), 999] for _ in range(200)]
    prefix = write_documents(tmp_path / "corpus", docs)
    cfg = MegatronDataConfig(sequence_length=16, blend=[prefix], split="100,0,0", cache="off")
    return build_datasets(cfg, [None, 0, 0])[0]


def test_megatron_restarts_scalar_counts_a_killed_worker(token_dataset):
    loader = build_dataloader(
        token_dataset,
        micro_batch_size=2,
        dp_rank=0,
        dp_size=1,
        num_workers=2,
        multiprocessing_context="fork",
    )
    writer = _Writer()
    train = MegatronLoader(loader, writers=lambda: (writer, None), global_batch_size=2)
    try:
        next(train), next(train)
        os.kill(loader.worker_processes[1].pid, signal.SIGKILL)
        for _ in range(8):
            next(train)
        health = loader.metrics()["workers"]
        assert (health["restarts"], health["stalls"]) == (1, 0)  # the model: one worker killed
        assert writer.scalars["tokenload/worker-restarts"] == 1.0
        lightning = loader_scalars(loader.metrics())
        assert (lightning["tokenload/worker_restarts"], lightning["tokenload/worker_stalls"]) == (
            1.0,
            0.0,
        )
    finally:
        loader.close()


# -- point 9: Lightning resume from a checkpoint without loader state ------------------------------
STEPS = 8


def _fit(make, ckpt_dir=None, ckpt_path=None, accumulate=1):
    """The first token of every training row (its sample), and the checkpoints by step."""
    options: dict = {"max_steps": STEPS, "accumulate_grad_batches": accumulate}
    if ckpt_dir is not None:
        every = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=1, save_top_k=-1)
        options.update(enable_checkpointing=True, callbacks=[every])
    model = Recorder()
    trainer(**options).fit(model, make(), ckpt_path=ckpt_path)
    ckpts = (
        {} if ckpt_dir is None else {int(p.stem.split("step=")[1]): p for p in ckpt_dir.iterdir()}
    )
    return [sample for *_, ids in model.train_seen for sample in ids], ckpts


@pytest.mark.parametrize("accumulate", [1, 2])
def test_lightning_resume_without_loader_state_keeps_the_fit_s_offset(tmp_path, caplog, accumulate):
    offset, mbs, at = 12, 2, 3
    make = functools.partial(
        TokenloadDataModule,
        train=RangeDataset(200),
        micro_batch_size=mbs,
        consumed_samples=offset,
        num_workers=0,
    )
    full, ckpts = _fit(make, tmp_path / "ckpt", accumulate=accumulate)
    gbs = mbs * accumulate
    assert full == list(range(offset, offset + STEPS * gbs))  # the model: the order from offset
    checkpoint = torch.load(ckpts[at], weights_only=False)
    del checkpoint["TokenloadDataModule"]
    del checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    torch.save(checkpoint, tmp_path / "bare.ckpt")
    with caplog.at_level(logging.WARNING, logger="tokenload.integrations.lightning"):
        resumed, _ = _fit(make, ckpt_path=tmp_path / "bare.ckpt", accumulate=accumulate)
    assert resumed == full[at * gbs :]  # no sample repeated, none skipped
    assert f"consumed_samples={offset + at * gbs}" in caplog.text


# -- point 10: torchtitan's settings reach the dataset ---------------------------------------------
SEQ = 16
EOD = 999


@pytest.fixture(scope="module")
def titan_prefix(tmp_path_factory):
    rng = np.random.default_rng(7)
    docs = [[*rng.integers(0, 900, rng.integers(3, 50)), EOD] for _ in range(300)]
    return write_documents(tmp_path_factory.mktemp("titan") / "corpus", docs)


def _parsed(prefix: str, args: list[str]):
    """The dataloader config as torchtitan's command line parses it (its registry, tyro)."""
    default = TokenloadTitanDataLoader.Config(data_path=[prefix], num_workers=0)

    @dataclasses.dataclass(kw_only=True)
    class TrainerLike:  # how torchtitan's Trainer.Config declares it
        dataloader: BaseDataLoader.Config = dataclasses.field(default_factory=lambda: default)

    parsed = tyro.cli(
        TrainerLike, args=args, default=TrainerLike(dataloader=default), registry=custom_registry
    )
    return parsed.dataloader


class _Tokenizer:
    eos_id = EOD


def _titan_rows(config, steps: int = 4) -> tuple[list, object, int]:
    loader = config.build(
        dp_world_size=2, dp_rank=1, tokenizer=_Tokenizer(), seq_len=SEQ, local_batch_size=4
    )
    try:
        batches = len(loader)
        rows = [(x["input"].tolist(), y.tolist()) for _, (x, y) in zip(range(steps), loader)]
        return rows, loader, batches
    finally:
        loader.close()


def _expected_rows(prefix, steps: int = 4, *, loader=None, num_samples=None, **fields) -> list:
    """The same rank's batches from a dataset built with ``fields`` directly (the model)."""
    fields = {"split": "100,0,0", **fields}
    cfg = MegatronDataConfig(sequence_length=SEQ, blend=[prefix], eod_id=EOD, **fields)
    dataset = build_datasets(cfg, [num_samples, 0, 0])[0]
    assert dataset is not None
    plain = build_dataloader(
        dataset, micro_batch_size=4, dp_rank=1, dp_size=2, num_workers=0, **(loader or {})
    )
    rows = []
    for _, batch in zip(range(steps), plain):
        labels = batch["labels"].masked_fill(batch["loss_mask"] == 0, IGNORE_INDEX)
        rows.append((batch["tokens"].tolist(), labels.tolist()))
    return rows


SETTINGS = {
    "seed": (["--dataloader.seed", "5"], {"random_seed": 5}, {}),
    "split": (["--dataloader.split", "60,40,0"], {"split": "60,40,0"}, {}),
    "order": (["--dataloader.order", "computed"], {"order": "computed"}, {}),
    "eod_mask_loss": (["--dataloader.eod_mask_loss"], {"eod_mask_loss": True}, {}),
    "kind": (["--dataloader.kind", "cyclic"], {}, {"kind": "cyclic"}),
    "num_samples": (["--dataloader.num_samples", "1500"], {}, {}),  # about 3 epochs
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_torchtitan_settings_reach_the_dataset(titan_prefix, tmp_path, setting):
    args, fields, loader_options = SETTINGS[setting]
    megatron = fields.get("order", "megatron") == "megatron"  # a cache folder is that order's
    cache = ["--dataloader.data_cache_path", str(tmp_path)] if megatron else []
    config = _parsed(titan_prefix, [*args, *cache])
    default_rows, default_loader, _ = _titan_rows(_parsed(titan_prefix, []))
    rows, loader, batches = _titan_rows(config)
    if setting == "num_samples":  # the samples built (default: one epoch), and the batches
        cfg = MegatronDataConfig(sequence_length=SEQ, blend=[titan_prefix], split="100,0,0")
        built = build_datasets(cfg, [1500, 0, 0])[0]
        assert len(loader.dataset) == len(built) >= 1500 > len(default_loader.dataset)
        assert batches == len(build_dataloader(built, micro_batch_size=4, dp_rank=1, dp_size=2))
        assert rows == _expected_rows(titan_prefix, num_samples=1500)
        return
    assert rows == _expected_rows(titan_prefix, loader=loader_options, **fields)
    assert rows != default_rows  # the setting changes what the loader serves
    if megatron:  # Megatron's order caches its indices there
        assert any(name.endswith("shuffle_index.npy") for name in os.listdir(tmp_path))
