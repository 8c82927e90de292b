"""TokenloadDataModule logs the loader's metrics through the Trainer's own loggers: CSVLogger and
TensorBoardLogger, read back from the files they write (a real Trainer in this process, CPU)."""

from __future__ import annotations

import csv

from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tokenload.integrations.lightning import TokenloadDataModule

from .lightning_app import RangeDataset, Recorder, trainer

STEPS, EVERY, MBS, SEQ = 9, 2, 4, 4
SOURCE = "tokenload/tokens/RangeDataset"


def _fit(logger, **options):
    options.setdefault("num_workers", 0)
    dm = TokenloadDataModule(train=RangeDataset(64, SEQ), micro_batch_size=MBS, **options)
    trainer(max_steps=STEPS, logger=logger, log_every_n_steps=EVERY).fit(Recorder(), dm)
    return dm


def _check(by_step: dict[int, dict[str, float]]) -> None:
    """Logged every EVERY steps; at step s the loader had handed out s + 1 batches."""
    assert sorted(by_step) == list(range(0, STEPS, EVERY))
    for step, row in by_step.items():
        assert row["tokenload/consumed_samples"] == (step + 1) * MBS
        assert row[SOURCE] == (step + 1) * MBS * SEQ  # the tokens of every row handed out
        assert 0 <= row["tokenload/data_wait_share"] <= 1
        assert row["tokenload/samples_per_s"] > 0 and row["tokenload/tokens_per_s"] > 0
        assert row["tokenload/epoch"] == 0


def test_csv_logger_gets_the_loader_metrics(tmp_path):
    logger = CSVLogger(tmp_path, name="run")
    _fit(logger)
    with open(f"{logger.log_dir}/metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get(SOURCE)]
    by_step = {int(r["step"]): {k: float(v) for k, v in r.items() if v} for r in rows}
    _check(by_step)


def test_tensorboard_gets_the_loader_metrics(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="run")
    _fit(logger)
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    tags = events.Tags()["scalars"]
    assert SOURCE in tags and "tokenload/data_wait_share" in tags
    by_step: dict[int, dict[str, float]] = {}
    for tag in tags:
        if tag.startswith("tokenload/"):
            for event in events.Scalars(tag):
                by_step.setdefault(event.step, {})[tag] = event.value
    _check(by_step)


def test_worker_restarts_are_logged_with_workers_and_nothing_when_turned_off(tmp_path):
    logger = CSVLogger(tmp_path, name="workers")
    _fit(logger, num_workers=1, multiprocessing_context="fork")
    with open(f"{logger.log_dir}/metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get(SOURCE)]
    assert [float(r["tokenload/worker_restarts"]) for r in rows] == [0.0] * len(rows) != []
    assert [float(r["tokenload/worker_stalls"]) for r in rows] == [0.0] * len(rows)

    quiet = CSVLogger(tmp_path, name="off")
    _fit(quiet, log_metrics=False)
    written = tmp_path / "off" / "version_0" / "metrics.csv"
    assert not written.exists() or "tokenload/" not in written.read_text()


def test_a_worker_replaced_mid_fit_shows_in_the_logged_restarts(tmp_path):
    import os
    import signal

    import lightning.pytorch as pl

    class KillWorker(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 1:
                loader = trainer.datamodule._train.loader
                os.kill(loader.worker_processes[0].pid, signal.SIGKILL)

    logger = CSVLogger(tmp_path, name="restart")
    dm = TokenloadDataModule(train=RangeDataset(64, SEQ), micro_batch_size=MBS, num_workers=1,
                             multiprocessing_context="fork", prefetch_factor=1)
    trainer(max_steps=STEPS, logger=logger, log_every_n_steps=EVERY,
            callbacks=[KillWorker()]).fit(Recorder(), dm)
    with open(f"{logger.log_dir}/metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get(SOURCE)]
    restarts = [float(r["tokenload/worker_restarts"]) for r in rows]
    assert restarts[0] == 0 and restarts[-1] == 1, restarts
    assert restarts == sorted(restarts)
