"""TokenloadDataModule with a real Lightning Trainer in this process (CPU, one device): resume from
a checkpoint continues with exactly the batches (and epochs) of an uninterrupted run, in the middle
of an epoch and at its end; validation repeats the same samples; wrong setups fail clearly."""

from __future__ import annotations

import functools
import logging
import multiprocessing
import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch

from tokenload.errors import ConfigError, StateError
from tokenload.integrations.lightning import TokenloadDataModule

from .lightning_app import RangeDataset, Recorder, trainer

STEPS = 12


def _fit(dm_factory, ckpt_dir=None, ckpt_path=None, **trainer_options):
    """Train up to STEPS steps (optionally from ``ckpt_path``), saving a checkpoint after every
    step into ``ckpt_dir``; returns the recorded batches and the checkpoints by step."""
    model = Recorder()
    if ckpt_dir is not None:
        every_step = pl.callbacks.ModelCheckpoint(
            dirpath=ckpt_dir, every_n_train_steps=1, save_top_k=-1
        )
        trainer_options.update(enable_checkpointing=True, callbacks=[every_step])
    trainer(max_steps=STEPS, **trainer_options).fit(model, dm_factory(), ckpt_path=ckpt_path)
    ckpts = (
        {} if ckpt_dir is None else {int(p.stem.split("step=")[1]): p for p in ckpt_dir.iterdir()}
    )
    return model.train_seen, ckpts


def _fit_with_checkpoints(tmp_path, dm_factory, **trainer_options):
    return _fit(dm_factory, tmp_path / "ckpt", **trainer_options)


def _resume(dm_factory, ckpt_path, **trainer_options):
    return _fit(dm_factory, ckpt_path=ckpt_path, **trainer_options)[0]


@pytest.mark.parametrize("kind, n", [("single", 64), ("cyclic", 20)])
def test_resume_continues_exactly(tmp_path, kind, n):
    make = functools.partial(
        TokenloadDataModule, train=RangeDataset(n), micro_batch_size=4, kind=kind, num_workers=0
    )
    full, ckpts = _fit_with_checkpoints(tmp_path, make)
    ids = [row for *_, batch in full for row in batch]
    if kind == "single":  # the dataset's own order, cut into micro-batches
        assert ids == list(range(STEPS * 4))
    else:  # a random permutation per epoch of 20 samples (5 steps)
        assert sorted(ids[:20]) == list(range(20)) and ids[:20] != list(range(20))
        assert [epoch for epoch, *_ in full] == [0] * 5 + [1] * 5 + [2] * 2
    # mid-epoch, at the end of the first cyclic epoch, and inside the second one
    for step in (3, 5, 6):
        state = torch.load(ckpts[step], weights_only=False)["TokenloadDataModule"]
        assert state["consumed_samples"] == step * 4
        assert state["fingerprint"] == make().train_dataloader().loader.fingerprint
        assert _resume(make, ckpts[step]) == full[step:], f"resumed from step {step}"
    # a resumed run's own checkpoints resume exactly too (preempted jobs resume many times)
    again, again_ckpts = _fit(make, tmp_path / "again", ckpt_path=ckpts[3])
    assert again == full[3:]
    assert _resume(make, again_ckpts[7]) == full[7:]


def test_resume_with_workers_and_accumulation(tmp_path):
    make = functools.partial(
        TokenloadDataModule,
        train=RangeDataset(64),
        micro_batch_size=2,
        global_batch_size=4,
        num_workers=2,
        multiprocessing_context="fork",
    )
    full, ckpts = _fit_with_checkpoints(tmp_path, make, accumulate_grad_batches=2)
    assert not multiprocessing.active_children()  # Lightning's teardown stopped the workers
    assert [row for *_, batch in full for row in batch] == list(
        range(STEPS * 4)
    )  # 2 micro-batches a step
    assert torch.load(ckpts[3], weights_only=False)["TokenloadDataModule"]["consumed_samples"] == 12
    assert _resume(make, ckpts[3], accumulate_grad_batches=2) == full[6:]


def test_checkpoint_for_other_data_is_refused(tmp_path):
    make = functools.partial(
        TokenloadDataModule, train=RangeDataset(64), micro_batch_size=4, num_workers=0
    )
    _, ckpts = _fit_with_checkpoints(tmp_path, make)
    other = functools.partial(
        TokenloadDataModule, train=RangeDataset(40, tag="other"), micro_batch_size=4, num_workers=0
    )
    with pytest.raises(StateError, match="fingerprint"):
        _resume(other, ckpts[3])


@pytest.mark.parametrize("keep", ["datamodule", "fit_loop"])
def test_either_copy_of_the_state_resumes_exactly(tmp_path, keep):
    """The DataModule's entry and the fit loop's copy of the loader state each suffice alone."""
    make = functools.partial(
        TokenloadDataModule,
        train=RangeDataset(20),
        micro_batch_size=4,
        kind="cyclic",
        num_workers=0,
    )
    full, ckpts = _fit_with_checkpoints(tmp_path, make)
    checkpoint = torch.load(ckpts[3], weights_only=False)
    if keep == "datamodule":
        del checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    else:
        del checkpoint["TokenloadDataModule"]
    torch.save(checkpoint, tmp_path / "one.ckpt")
    assert _resume(make, tmp_path / "one.ckpt") == full[3:]


def test_checkpoint_without_loader_state_falls_back_to_global_step(tmp_path, caplog):
    make = functools.partial(
        TokenloadDataModule, train=RangeDataset(64), micro_batch_size=4, num_workers=0
    )
    full, ckpts = _fit_with_checkpoints(tmp_path, make)
    checkpoint = torch.load(ckpts[3], weights_only=False)
    del checkpoint["TokenloadDataModule"]
    del checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    torch.save(checkpoint, tmp_path / "bare.ckpt")
    with caplog.at_level(logging.WARNING, logger="tokenload.integrations.lightning"):
        resumed = _resume(make, tmp_path / "bare.ckpt")
    assert "consumed_samples=12" in caplog.text
    # Same samples; Lightning's epoch count may differ, since the position in the epoch was lost.
    assert [batch for *_, batch in resumed] == [batch for *_, batch in full[3:]]


def test_validation_sees_the_same_samples_every_time():
    dm = TokenloadDataModule(
        train=RangeDataset(40), val=RangeDataset(12, tag="val"), micro_batch_size=4, num_workers=0
    )
    model = Recorder()
    trainer(max_steps=6, val_check_interval=2, limit_val_batches=None).fit(model, dm)
    assert model.val_seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]] * 3
    assert [row for *_, batch in model.train_seen for row in batch] == list(
        range(24)
    )  # validation left it alone


def test_factories_run_once_in_setup():
    calls = []

    def make_val():
        calls.append("val")
        return RangeDataset(8, tag="val")

    dm = TokenloadDataModule(
        train=functools.partial(RangeDataset, 16), val=make_val, micro_batch_size=4
    )
    dm.setup("fit")
    dm.setup("fit")
    assert calls == ["val"] and len(dm.dataset("train")) == 16 and dm.dataset("test") is None
    assert dm.test_dataloader() == []  # Lightning runs nothing over an empty list


def test_refuses_lightning_sharding_and_a_wrong_global_batch():
    dm = TokenloadDataModule(train=RangeDataset(16), micro_batch_size=2, global_batch_size=4)
    dm.trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    with pytest.raises(ConfigError, match="use_distributed_sampler=False"):
        dm.setup("fit")
    dm.trainer = trainer(accumulate_grad_batches=3)
    with pytest.raises(ConfigError, match="accumulate_grad_batches=2"):
        dm.setup("fit")
    dm.trainer = trainer(accumulate_grad_batches=2)
    dm.setup("fit")
    derived = TokenloadDataModule(train=RangeDataset(16), micro_batch_size=2)
    derived.trainer = trainer(accumulate_grad_batches=3)
    derived.setup("fit")
    assert derived.global_batch_size == 6
    with pytest.raises(ConfigError):
        TokenloadDataModule(train=RangeDataset(16), micro_batch_size=2, kind="random")


def test_importing_integrations_is_light_and_names_the_extra():
    light = "import sys, tokenload.integrations; print('lightning' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", light], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )
    missing = (
        "import sys; sys.modules['lightning.pytorch'] = None\n"
        "try:\n    import tokenload.integrations.lightning\n"
        "except Exception as e:\n    print(type(e).__name__, str(e).splitlines()[-1])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", missing], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == ("MissingExtraError HINT: tokenload is not on a package index:"
                           " pip install '.[lightning]' in its clone")


@pytest.mark.timeout(60)
def test_an_exhausted_order_stops_the_fit(caplog):
    """The single order is one pass; past it Lightning would loop over empty epochs for ever."""
    model = Recorder()
    fit = trainer(max_steps=12)
    with caplog.at_level(logging.WARNING, logger="tokenload.integrations.lightning"):
        fit.fit(
            model, TokenloadDataModule(train=RangeDataset(20), micro_batch_size=4, num_workers=0)
        )
    assert fit.global_step == 5 and [row for *_, b in model.train_seen for row in b] == list(
        range(20)
    )
    assert "exhausted (consumed_samples=20 of 20)" in caplog.text
