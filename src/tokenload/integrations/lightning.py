"""A LightningDataModule serving tokenload's global order, resumed through Lightning's checkpoint.

Each process builds its own ``TokenloadDataLoader`` with data-parallel rank ``trainer.global_rank``
and size ``trainer.world_size``: tokenload shards, so Lightning must not (``Trainer(
use_distributed_sampler=False)``). The resume state is the loader's (consumed samples plus a
fingerprint of data and config) and travels in the checkpoint under this DataModule's key.

Where this sits in Lightning's loop (read from lightning 2.6's ``Trainer._run`` and ``FitLoop``):

* ``fit(ckpt_path=...)`` calls ``setup(stage)``, then ``load_state_dict`` of this DataModule, then
  restores the loop counters (``global_step``, batches run in the epoch), and only then asks for
  ``train_dataloader()``. So ``load_state_dict`` keeps the state and ``train_dataloader()`` applies
  it to the loader it builds, checking the fingerprint there (strategies that restore after
  their own setup, ``restore_checkpoint_after_setup``, still restore before ``train_dataloader()``).
  The training loader also has ``state_dict``/``load_state_dict``, so Lightning stores a second,
  identical copy with the fit loop and loads it into the same loader before iterating: loading
  twice is harmless, and it keeps Lightning from warning that a mid-epoch resume is unreliable.
  Lightning loads that copy only after it has measured ``len(loader)``, so when the checkpoint
  lacks the DataModule's entry (say the class was renamed) ``train_dataloader()`` takes the copy.
* The training loader has a length, so Lightning's fetcher reads no batch ahead: the consumed
  count at a checkpoint is exactly the batches handed to ``training_step``, which is
  ``global_step * global_batch_size`` at every optimizer step when a run starts at sample 0. The
  count is what is saved; ``global_step * global_batch_size`` is only the fallback for a
  checkpoint that holds no tokenload state (with a warning; no fingerprint can be checked then).
* On a mid-epoch resume Lightning restores how many batches of the epoch already ran and expects
  ``len(loader)`` to still be the whole epoch's. The training loader therefore reports the
  batches handed out in the current pass plus those left, and saves the first number with the
  state (0 once a pass is finished, when Lightning begins a new epoch). This bookkeeping only
  keeps Lightning's epoch numbering equal to an uninterrupted run's; the samples never depend on it.

While training, the loader's metrics go to the trainer's loggers (CSV, TensorBoard, W&B, ...)
every ``Trainer(log_every_n_steps=...)`` optimizer steps, at ``trainer.global_step``, as the scalars
of ``integrations.scalars.loader_scalars`` (``tokenload/data_wait_share``,
``tokenload/samples_per_s``, ``tokenload/tokens/{source}``, ``tokenload/worker_restarts``, ...):
this rank's loader, written by global rank 0 as Lightning's loggers are. ``log_metrics=False``
turns it off.

A pass of the training loader runs from where the order stands to the end of the dataset
("single": the dataset's length already holds its epochs) or of the current random epoch
("cyclic"); each new Lightning epoch continues the order, never restarts it. When the single
order is used up the fit stops with a warning (with ``max_steps`` set and ``max_epochs`` not,
Lightning would otherwise loop over empty epochs for ever). Validation and test loaders restart at
sample 0 on every pass, so every evaluation sees the same samples.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, StateError, require
from ..loader import LoaderConfig, TokenloadDataLoader, build_dataloader
from .scalars import loader_scalars

if TYPE_CHECKING:
    import lightning.pytorch as _pl
else:
    _pl = require("lightning.pytorch", "lightning", "TokenloadDataModule")

__all__ = ["DatasetSource", "TokenloadDataModule"]

logger = logging.getLogger(__name__)

DatasetSource = Any
"""A dataset (``__getitems__``, ``__len__``, optional ``fingerprint``) or a zero-argument callable
returning one; callables run in ``setup()``, in each training process."""

_STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ()}
_PASS_KEY = "batches_in_pass"


class TokenloadDataModule(_pl.LightningDataModule):
    """Train/val/test loaders over tokenload datasets, sharded by Lightning's ranks, resumable."""

    def __init__(
        self,
        *,
        train: DatasetSource | None = None,
        val: DatasetSource | None = None,
        test: DatasetSource | None = None,
        micro_batch_size: int,
        global_batch_size: int | None = None,
        consumed_samples: int = 0,
        log_metrics: bool = True,
        **loader_options: Any,
    ) -> None:
        """``train``/``val``/``test``: datasets or factories (e.g. the splits of one blend).
        ``global_batch_size``: samples per optimizer step over all ranks; it must equal
        ``micro_batch_size * world_size * accumulate_grad_batches`` (None derives it).
        ``consumed_samples``: where a fresh fit starts in the order (a checkpoint overrides it).
        ``log_metrics``: log the loader's metrics through the trainer's loggers while training.
        ``loader_options``: further ``LoaderConfig`` fields (num_workers, kind, worker_timeout,
        max_worker_restarts, ...)."""
        super().__init__()
        LoaderConfig(micro_batch_size=micro_batch_size, **loader_options)  # fail at construction
        if global_batch_size is not None and global_batch_size < 1:
            raise ConfigError(
                f"global_batch_size is {global_batch_size}", hint="use a positive size or None"
            )
        if consumed_samples < 0:
            raise ConfigError(f"consumed_samples is {consumed_samples}", hint="use 0 or more")
        self.micro_batch_size = micro_batch_size
        self.global_batch_size = global_batch_size
        self.consumed_samples = consumed_samples
        self.loader_options = dict(loader_options)
        self.log_metrics = log_metrics
        self._logged_step: int | None = None
        self._sources = {"train": train, "val": val, "test": test}
        self._datasets: dict[str, Any] = {}
        self._train: _TrainLoader | None = None
        self._restored: dict[str, Any] | None = None

    # -- Lightning hooks ---------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        """Build the datasets this stage needs and check the trainer's data-parallel settings."""
        if self.trainer is not None:
            self._check_trainer(stage)
        for split in _STAGE_SPLITS.get(stage, ()):
            self.dataset(split)

    def train_dataloader(self) -> _TrainLoader:
        dataset = self.dataset("train")
        if dataset is None:
            raise ConfigError(
                "train_dataloader() was called but no train dataset was given",
                hint="pass TokenloadDataModule(train=...)",
            )
        restored = self._restored if self._restored is not None else self._fit_loop_state()
        loader = _TrainLoader(
            self._build(dataset, self._start_samples(restored is not None)),
            self._exhausted,
            self._log_loader_metrics if self.log_metrics else None,
        )
        if restored is not None:
            loader.load_state_dict(restored)
            self._restored = None
        self._train = loader
        return loader

    def val_dataloader(self) -> _EvalLoader | list[Any]:
        return self._eval_loader("val")

    def test_dataloader(self) -> _EvalLoader | list[Any]:
        return self._eval_loader("test")

    def state_dict(self) -> dict[str, Any]:
        """The training loader's state (consumed samples, fingerprint, position in the epoch)."""
        if self._train is not None:
            return self._train.state_dict()
        return dict(self._restored) if self._restored is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the state for the next ``train_dataloader()``, which checks it against the data."""
        if not isinstance(state_dict, dict):
            raise StateError(
                f"DataModule state is a {type(state_dict).__name__}, expected a dict",
                hint="pass the dict saved by TokenloadDataModule.state_dict()",
            )
        self._restored = dict(state_dict) if state_dict else None
        self._train = None

    def teardown(self, stage: str) -> None:
        # Keep the final state (trainer.save_checkpoint after fit, or a further fit, needs it) and
        # drop the loader so its worker processes can exit once Lightning lets go of it too.
        if stage == "fit" and self._train is not None:
            self._restored, self._train = self._train.state_dict(), None

    # -- helpers -----------------------------------------------------------------------------

    def dataset(self, split: str) -> Any:
        """The dataset of ``split`` ("train", "val" or "test"), calling its factory once."""
        if split not in self._sources:
            raise ConfigError(f"split {split!r}", hint="use 'train', 'val' or 'test'")
        if split not in self._datasets:
            self._datasets[split] = _materialize(self._sources[split])
        return self._datasets[split]

    def _dp(self) -> dict[str, int]:
        """dp_rank/dp_size: loader options win, then the trainer, then tokenload's World."""
        out = {
            k: self.loader_options[k]
            for k in ("dp_rank", "dp_size")
            if self.loader_options.get(k) is not None
        }
        if self.trainer is not None:
            out.setdefault("dp_rank", self.trainer.global_rank)
            out.setdefault("dp_size", self.trainer.world_size)
        return out

    def _build(self, dataset: Any, consumed: int) -> TokenloadDataLoader:
        options = {**self.loader_options, **self._dp()}
        return build_dataloader(
            dataset, consumed_samples=consumed, micro_batch_size=self.micro_batch_size, **options
        )

    def _exhausted(self, consumed: int, total: int) -> None:
        # Lightning (max_steps set, max_epochs unset) would otherwise run empty epochs forever.
        logger.warning(
            "the training order is exhausted (consumed_samples=%d of %d); stopping the fit."
            " Build the dataset with max_steps x global_batch_size samples or use kind='cyclic'",
            consumed,
            total,
        )
        if self.trainer is not None:
            self.trainer.should_stop = True

    def _log_loader_metrics(self, loader: TokenloadDataLoader) -> None:
        """At a batch handed to training: the loader's scalars to every logger of the trainer,
        once per ``log_every_n_steps`` optimizer steps (Lightning's own logging cadence)."""
        trainer = self.trainer
        if trainer is None or not trainer.loggers:
            return
        step = trainer.global_step
        every = trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by its logger connector
        if step % max(1, every) or step == self._logged_step:
            return
        self._logged_step = step
        values = loader_scalars(loader.metrics())
        for logger_ in trainer.loggers:
            logger_.log_metrics(values, step=step)

    def _fit_loop_state(self) -> dict[str, Any] | None:
        """The fit loop's copy of the loader state when the checkpoint lacks this DataModule's entry
        (e.g. the DataModule class was renamed). Lightning loads that copy only after it has taken
        ``len(loader)``, too late for a mid-epoch resume, so it is taken here."""
        pending = getattr(
            getattr(self.trainer, "fit_loop", None), "_combined_loader_states_to_load", None
        )
        if (
            isinstance(pending, list)
            and len(pending) == 1
            and isinstance(pending[0], dict)
            and pending[0]
        ):
            return pending[0]
        return None

    def _start_samples(self, restoring: bool) -> int:
        """Where a new training loader starts when there is no saved state to load."""
        if self._train is not None:  # dataloaders reloaded during a fit continue the order
            return self._train.loader.consumed_samples
        trainer = self.trainer
        if not restoring and trainer is not None and trainer.ckpt_path and trainer.global_step > 0:
            gbs = (
                self.global_batch_size
                or self.micro_batch_size * trainer.world_size * trainer.accumulate_grad_batches
            )
            start = self.consumed_samples + trainer.global_step * gbs
            logger.warning(
                "checkpoint %s holds no tokenload loader state; continuing the order at"
                " consumed_samples=%d (global_step %d x global batch %d), no fingerprint check",
                trainer.ckpt_path,
                start,
                trainer.global_step,
                gbs,
            )
            return start
        return self.consumed_samples

    def _eval_loader(self, split: str) -> _EvalLoader | list[Any]:
        dataset = self.dataset(split)
        if dataset is None:
            return []  # Lightning runs no loop over an empty list of loaders
        return _EvalLoader(self._build(dataset, 0))

    def _check_trainer(self, stage: str) -> None:
        trainer = self.trainer
        connector = getattr(trainer, "_accelerator_connector", None)
        if (
            getattr(connector, "use_distributed_sampler", False)
            and trainer is not None
            and trainer.world_size > 1
        ):
            raise ConfigError(
                f"the Trainer runs {trainer.world_size} processes with use_distributed_sampler="
                "True, so it would shard data that tokenload already shards by rank",
                hint="create the Trainer with use_distributed_sampler=False",
            )
        if stage == "fit":
            self._check_batch_sizes(trainer)

    def _check_batch_sizes(self, trainer: Any) -> None:
        dp = self._dp().get("dp_size", trainer.world_size)
        group = self.micro_batch_size * dp
        gbs = self.global_batch_size
        if gbs is None:
            self.global_batch_size = group * trainer.accumulate_grad_batches
            return
        if gbs % group or gbs // group != trainer.accumulate_grad_batches:
            raise ConfigError(
                f"global_batch_size {gbs} is not micro_batch_size {self.micro_batch_size}"
                f" x data-parallel size {dp} x accumulate_grad_batches"
                f" {trainer.accumulate_grad_batches}",
                hint=f"use Trainer(accumulate_grad_batches={max(gbs // group, 1)}) with a global"
                f" batch divisible by {group}, or pass global_batch_size=None",
            )


def _materialize(source: DatasetSource | None) -> Any:
    """A factory (a class, or a callable without a length) is called; a dataset is kept."""
    if isinstance(source, type) or (callable(source) and not hasattr(source, "__len__")):
        return source()
    return source


class _LoaderView:
    """What Lightning sees of a ``TokenloadDataLoader``. ``_iterator`` mirrors torch's
    ``DataLoader._iterator`` so that Lightning's teardown (at the end of fit and on an exception)
    stops the worker processes itself, as it does for a torch DataLoader. Otherwise they would
    stop only when the cycle collector frees the Trainer, and torch then waits seconds per worker
    (measured: 10-20 s for two workers in this package's tests)."""

    def __init__(self, loader: TokenloadDataLoader) -> None:
        self.loader = loader
        self.dataset = loader.dataset

    @property
    def _iterator(self) -> Any:
        return self.loader._iterator

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        self.loader._iterator = value


class _TrainLoader(_LoaderView):
    """The training loader as Lightning sees it: its length is that of the current pass, counted
    from the pass's start; its state records how far into the pass it is (see the module doc)."""

    def __init__(
        self,
        loader: TokenloadDataLoader,
        on_exhausted: Callable[[int, int], None] | None = None,
        on_batch: Callable[[TokenloadDataLoader], None] | None = None,
    ) -> None:
        super().__init__(loader)
        self._on_exhausted = on_exhausted
        self._on_batch = on_batch
        self._in_pass = 0  # batches handed out in the current pass
        self._pass_len: int | None = None  # batches of the current pass, fixed when it starts
        self._resumed = False

    @property
    def _finished(self) -> bool:
        return self._pass_len is not None and self._in_pass >= self._pass_len

    def __len__(self) -> int:
        left = len(self.loader)
        return left if self._finished else self._in_pass + left

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # Lightning also calls iter() once just to check the loader is iterable, so a restored
        # pass is only taken up when the first batch is drawn.
        if not self._resumed:  # a new pass, from where the order stands
            self._in_pass, self._pass_len = 0, len(self.loader)
            if self._pass_len == 0 and self._on_exhausted is not None:
                self._on_exhausted(self.loader.consumed_samples, len(self.dataset))
        return self._batches()

    def _batches(self) -> Iterator[dict[str, Any]]:
        if self._resumed:
            self._resumed = False
            self._pass_len = self._in_pass + len(self.loader)
        for batch in self.loader:
            self._in_pass += 1
            if self._on_batch is not None:
                self._on_batch(self.loader)
            yield batch

    def state_dict(self) -> dict[str, Any]:
        # A finished pass saves 0: Lightning starts a new epoch on resume, and so does the loader.
        return {**self.loader.state_dict(), _PASS_KEY: 0 if self._finished else self._in_pass}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        in_pass = state.get(_PASS_KEY, 0) if isinstance(state, dict) else 0
        if not isinstance(in_pass, int) or in_pass < 0:
            raise StateError(
                f"{_PASS_KEY} is {in_pass!r}, expected an integer >= 0",
                hint="pass the dict saved by TokenloadDataModule.state_dict()",
            )
        self.loader.load_state_dict(state)
        self._in_pass, self._pass_len, self._resumed = in_pass, None, True


class _EvalLoader(_LoaderView):
    """A validation/test loader: every pass starts again at sample 0 of its dataset."""

    def __init__(self, loader: TokenloadDataLoader) -> None:
        super().__init__(loader)
        self._len = len(loader)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.loader.restart(0)
        return iter(self.loader)
